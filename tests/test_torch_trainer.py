"""transformers' ``Trainer`` over a ``PackedDataset`` with ``collate_hf``: the padding-free path end to end.

The Trainer builds its own DataLoader (so the batch comes through ``__getitems__``), moves the batch
with accelerate and calls ``model(**batch)``. Checked: training runs; the model receives the
padding-free keys; the Trainer's loss normaliser (``num_items_in_batch``, summed over gradient
accumulation) equals the batches' own ``num_label_tokens``; the first step's loss is the exact
per-document loss; and the Trainer's default ``remove_unused_columns=True`` fails with an error
that says what to do.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_torch_dataset import make_store

from packfmt.packindex import build_pack_index
from packfmt.torch import IGNORE_INDEX, PackedDataset, collate_hf

pytest.importorskip("accelerate")
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments  # noqa: E402

VOCAB, CAPACITY = 300, 96


@pytest.fixture()
def packed(tmp_path):
    rng = np.random.default_rng(5)
    docs = [rng.integers(1, VOCAB, n).tolist() for n in rng.integers(4, 70, 20)]
    docs.append(rng.integers(1, VOCAB, 150).tolist())  # longer than a pack: split, with a cut label
    store = make_store(tmp_path, docs, [None] * len(docs), VOCAB)
    build_pack_index(store, capacity=CAPACITY, algorithm="ffd", name="p")
    return store


def _model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    return LlamaForCausalLM(cfg).float()


def _args(tmp_path, **kw) -> TrainingArguments:
    return TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, max_steps=2,
                             gradient_accumulation_steps=2, learning_rate=1e-3, report_to=[], use_cpu=True,
                             save_strategy="no", logging_steps=1, disable_tqdm=True, seed=0, **kw)


def _per_document_loss(model, batch) -> tuple[float, int]:
    """Summed next-token loss of every segment of a collated batch run alone, and its target count."""
    total, count = 0.0, 0
    cu = batch["cu_seq_lens_q"].tolist()
    with torch.no_grad():
        for b, e in zip(cu[:-1], cu[1:]):
            logits = model(input_ids=batch["input_ids"][:, b:e], use_cache=False).logits[0]
            labels = batch["shift_labels"][0, b:e]
            keep = labels != IGNORE_INDEX
            total += F.cross_entropy(logits[keep], labels[keep], reduction="sum").item()
            count += int(keep.sum())
    return total, count


def test_trainer_trains_on_packed_batches_with_exact_normaliser(packed, tmp_path):
    ds = PackedDataset(packed, "p")
    model = _model()
    reference = _model()
    calls = []
    forward = model.forward

    def spy(**kwargs):
        calls.append({k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()})
        return forward(**kwargs)

    model.forward = spy
    trainer = Trainer(model=model, args=_args(tmp_path, remove_unused_columns=False), train_dataset=ds,
                      data_collator=collate_hf)
    out = trainer.train()
    assert out.global_step == 2 and np.isfinite(out.training_loss)
    assert sum(c["input_ids"].shape[1] for c in calls) == int(ds.pack_num_tokens().sum())  # the epoch, once
    # One epoch is 3 micro-batches of 4 packs: step 1 accumulates two, step 2 the last one.
    assert -(-len(ds) // 4) == 3 and len(calls) == 3
    for c in calls:
        assert {"cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "shift_labels", "position_ids"} <= set(c)
        assert isinstance(c["max_length_q"], int) and c["cu_seq_lens_q"].dtype == torch.int32
    # The Trainer normalises each step by the labels of all its micro-batches: exactly our count.
    for step in (calls[:2], calls[2:]):  # (accumulation steps of 2)
        want = sum(int(c["num_label_tokens"]) for c in step)
        assert all(int(c["num_items_in_batch"]) == want for c in step)
    # First step: the summed loss of its two micro-batches / that count = the per-document loss.
    first = calls[:2]
    parts = [_per_document_loss(reference, c) for c in first]
    total, count = sum(t for t, _ in parts), sum(n for _, n in parts)
    assert count == int(first[0]["num_items_in_batch"])
    with torch.no_grad():
        got = sum(reference(**c).loss.item() for c in first)
    assert got == pytest.approx(total / count, abs=1e-5)
    # The epoch covers every pack, so one ends inside the long document and keeps its cut label
    # (the true next token), which the Trainer's count includes.
    assert _has_cut(ds)
    assert any((c["shift_labels"][0, c["cu_seq_lens_q"][1:].long() - 1] != IGNORE_INDEX).any() for c in calls)


def _has_cut(ds) -> bool:
    segs = np.asarray(ds.index.segments)
    lens = np.diff(np.asarray(ds.store.doc_offsets))
    return bool((segs[:, 2] < lens[segs[:, 0]]).any())


def test_trainer_default_column_removal_fails_with_the_fix_named(packed, tmp_path):
    ds = PackedDataset(packed, "p")
    trainer = Trainer(model=_model(), args=_args(tmp_path), train_dataset=ds, data_collator=collate_hf)
    with pytest.raises(ValueError, match="remove_unused_columns=False"):
        trainer.train()
