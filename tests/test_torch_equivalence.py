"""Packed training equals training on every document alone (spec/READER.md §7).

A tiny random LlamaForCausalLM (float32, CPU) sees one packed batch through each CPU attention
path; its per-token logits and its loss must match running every segment alone within 1e-5.
A negative control (no position reset, no document mask) shows the comparison can fail.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import packfmt
from packfmt.torch import (
    IGNORE_INDEX,
    PackedDataset,
    collate_hf,
    collate_padded,
    collate_varlen,
    document_causal_mask,
    sdpa_document_attention,
)
from packfmt.torch.testing import next_fit_segments, write_pack_index

transformers = pytest.importorskip("transformers")

VOCAB = 97
CAPACITY = 48
TOL = 1e-5


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """A chat-like dataset (loss mask) with documents that get split across packs."""
    root = tmp_path_factory.mktemp("eq")
    rng = np.random.default_rng(1234)
    lengths = [5, 17, 3, 30, 9, 60, 2, 11, 25, 7]  # 60 > CAPACITY: split; next-fit also splits at pack ends
    with packfmt.DatasetWriter(root / "ds", vocab_size=VOCAB, loss_mask=True) as w:
        for n in lengths:
            mask = (rng.random(n) < 0.7).astype(np.uint8)
            w.add_document(rng.integers(0, VOCAB, n), mask)
    store = packfmt.open(root / "ds")
    order = rng.permutation(len(lengths))
    segs, po = next_fit_segments(store.doc_lengths, CAPACITY, order=order)
    write_pack_index(store, segs, po, capacity=CAPACITY, name="nf")
    ds = PackedDataset(store, "nf")
    assert np.any(segs[:, 1] > 0), "fixture must contain a continuation segment"
    return store, ds


@pytest.fixture(scope="module")
def model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    m = LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa", dtype=torch.float32)
    return m.eval()


def reference(store, model, segments):
    """Per-segment logits and labels, each segment run alone; labels from the raw documents."""
    logits, labels = [], []
    for d, b, e in segments.tolist():
        doc = np.asarray(store.document(d), dtype=np.int64)
        mask = np.asarray(store.document_loss_mask(d))
        with torch.no_grad():
            out = model(input_ids=torch.from_numpy(doc[b:e]).unsqueeze(0), use_cache=False)
        logits.append(out.logits[0])
        lab = [doc[t + 1] if t + 1 < len(doc) and mask[t + 1] else IGNORE_INDEX for t in range(b, e)]
        labels.append(torch.tensor(lab, dtype=torch.int64))
    return torch.cat(logits), torch.cat(labels)


def pooled_loss(logits, labels):
    return F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, reduction="sum") / (labels != IGNORE_INDEX).sum()


def batch_segments(ds, items):
    return np.concatenate([np.asarray(ds.index.pack_segments(int(it["pack_id"]))) for it in items])


def test_hf_position_ids_path_matches_documents_alone(packed, model):
    store, ds = packed
    items = [ds[i] for i in range(len(ds))]
    ref_logits, ref_labels = reference(store, model, batch_segments(ds, items))
    batch = collate_hf(items)
    assert "attention_mask" not in batch and batch["use_cache"] is False
    with torch.no_grad():
        out = model(**batch)
    diff = (out.logits[0] - ref_logits).abs().max().item()
    print(f"hf position_ids path: max |logit diff| = {diff:.3e}")
    assert diff <= TOL
    assert torch.equal(batch["shift_labels"][0], ref_labels)
    ref_loss = pooled_loss(ref_logits, ref_labels)
    assert abs(out.loss.item() - ref_loss.item()) <= TOL
    # sum of per-token losses / num_label_tokens == pooled per-document loss
    ours = F.cross_entropy(out.logits[0], batch["shift_labels"][0], ignore_index=IGNORE_INDEX, reduction="sum")
    assert int(batch["num_label_tokens"]) == int((ref_labels != IGNORE_INDEX).sum())
    assert abs((ours / batch["num_label_tokens"]).item() - ref_loss.item()) <= TOL

    # Negative control: the same row with positions 0..T-1 and a plain causal mask leaks across documents.
    with torch.no_grad():
        leak = model(input_ids=batch["input_ids"], position_ids=torch.arange(batch["input_ids"].shape[1]).unsqueeze(0),
                     use_cache=False)
    leak_diff = (leak.logits[0] - ref_logits).abs().max().item()
    print(f"negative control (no reset, no mask): max |logit diff| = {leak_diff:.3e}")
    assert leak_diff > 1e-2


def test_sdpa_4d_block_mask_path_matches_documents_alone(packed, model):
    store, ds = packed
    items = [ds[i] for i in range(len(ds))]
    ref_logits, ref_labels = reference(store, model, batch_segments(ds, items))
    batch = collate_padded(items, length=CAPACITY)
    mask = document_causal_mask(batch["doc_ids"])  # (B, 1, L, L) bool, True = attend
    with torch.no_grad():
        out = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], attention_mask=mask, use_cache=False)
    real = batch["doc_ids"] >= 0
    got = out.logits[real]
    diff = (got - ref_logits).abs().max().item()
    print(f"sdpa 4-D block mask path: max |logit diff| = {diff:.3e}")
    assert diff <= TOL
    assert torch.equal(batch["labels"][real], ref_labels)
    loss = F.cross_entropy(out.logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=IGNORE_INDEX,
                           reduction="sum") / batch["num_label_tokens"]
    assert abs(loss.item() - pooled_loss(ref_logits, ref_labels).item()) <= TOL

    # Negative control: same padded rows, positions 0..L-1 and a plain causal mask.
    with torch.no_grad():
        leak = model(input_ids=batch["input_ids"], use_cache=False)
    assert (leak.logits[real] - ref_logits).abs().max().item() > 1e-2


def test_custom_attention_function_with_doc_ids(packed, model):
    """A transformers attention function that builds the SDPA document mask from ``doc_ids``."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import repeat_kv

    def packfmt_sdpa(module, query, key, value, attention_mask, doc_ids=None, scaling=None, dropout=0.0, **kwargs):
        groups = query.shape[1] // key.shape[1]
        out = sdpa_document_attention(query, repeat_kv(key, groups), repeat_kv(value, groups), doc_ids, scale=scaling)
        return out.transpose(1, 2).contiguous(), None

    AttentionInterface.register("packfmt_sdpa", packfmt_sdpa)
    store, ds = packed
    items = [ds[i] for i in range(len(ds))]
    ref_logits, _ = reference(store, model, batch_segments(ds, items))
    batch = collate_varlen(items)
    model.set_attn_implementation("packfmt_sdpa")
    try:
        with torch.no_grad():
            out = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], doc_ids=batch["doc_ids"],
                        use_cache=False)
    finally:
        model.set_attn_implementation("sdpa")
    diff = (out.logits[0] - ref_logits).abs().max().item()
    print(f"custom attention function (doc_ids -> SDPA mask): max |logit diff| = {diff:.3e}")
    assert diff <= TOL


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_block_mask_forward_matches_per_document_sdpa():
    """FlexAttention document mask (CPU forward only) equals per-document causal SDPA."""
    from packfmt.torch.attention import flex_document_attention

    torch.manual_seed(0)
    lens = [5, 40, 1, 30, 52]  # 128 tokens = one flex block
    doc_ids = torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens)).unsqueeze(0)
    q, k, v = (torch.randn(1, 2, 128, 16) for _ in range(3))
    got = flex_document_attention(q, k, v, doc_ids)
    ref = torch.cat([F.scaled_dot_product_attention(q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], is_causal=True)
                     for s, e in zip(np.cumsum([0] + lens[:-1]), np.cumsum(lens))], dim=2)
    assert (got - ref).abs().max().item() <= TOL
    sdpa = sdpa_document_attention(q, k, v, doc_ids)
    assert (sdpa - ref).abs().max().item() <= TOL
    plain = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert (plain - ref).abs().max().item() > 1e-2


@pytest.mark.parametrize("via", ["__getitems__", "items"])
def test_int32_index_dtype_through_transformers_matches_documents_alone(packed, model, via):
    """``index_dtype=torch.int32``: int32 input_ids/position_ids, int64 labels; same logits and loss."""
    store, ds64 = packed
    ds = PackedDataset(store, "nf", index_dtype=torch.int32)
    packs = list(range(len(ds)))
    items = ds.__getitems__(packs) if via == "__getitems__" else [ds[i] for i in packs]
    batch = collate_hf(items)
    assert batch["input_ids"].dtype == torch.int32 and batch["position_ids"].dtype == torch.int32
    assert batch["labels"].dtype == torch.int64 and batch["shift_labels"].dtype == torch.int64
    ref_logits, ref_labels = reference(store, model, batch_segments(ds, [ds[i] for i in packs]))
    with torch.no_grad():
        out = model(**batch)
        out64 = model(**collate_hf(ds64.__getitems__(packs)))
    diff = (out.logits[0] - ref_logits).abs().max().item()
    print(f"int32 hf path ({via}): max |logit diff| = {diff:.3e}")
    assert diff <= TOL
    assert torch.equal(out.logits, out64.logits)  # bit-identical to the int64 batch
    assert torch.equal(batch["shift_labels"][0], ref_labels)
    assert abs(out.loss.item() - pooled_loss(ref_logits, ref_labels).item()) <= TOL
    assert abs(out.loss.item() - out64.loss.item()) <= TOL


def test_packfmt_varlen_implementation_matches_documents_alone(packed, model):
    """``attn_implementation="packfmt_varlen"`` (``hf_attention``: torch's varlen_attn on CUDA, the same rule by
    SDPA elsewhere) over ``collate_hf`` batches: the bounds come from ``cu_seq_lens_q``, grouped-query heads are
    shared, and a call without bounds is refused rather than attending across documents."""
    from packfmt.torch.hf_attention import HF_VARLEN, register_hf_varlen

    assert register_hf_varlen() == HF_VARLEN == register_hf_varlen()  # idempotent
    store, ds = packed
    items = [ds[i] for i in range(len(ds))]
    ref_logits, ref_labels = reference(store, model, batch_segments(ds, items))
    batch = collate_hf(items)
    model.set_attn_implementation(HF_VARLEN)
    try:
        with torch.no_grad():
            out = model(**batch)
            # the negative control: the same row with bounds of one document (a causal mask over the whole row)
            whole = dict(batch, cu_seq_lens_q=batch["cu_seq_lens_q"][[0, -1]], cu_seq_lens_k=batch["cu_seq_lens_k"][[0, -1]])
            leak = model(**whole)
            with pytest.raises(ValueError, match="cu_seq_lens_q"):
                model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False)
    finally:
        model.set_attn_implementation("sdpa")
    diff = (out.logits[0] - ref_logits).abs().max().item()
    assert diff <= TOL
    assert abs(pooled_loss(out.logits[0], ref_labels).item() - pooled_loss(ref_logits, ref_labels).item()) <= TOL
    assert (leak.logits[0] - ref_logits).abs().max().item() > 1e-2
