#!/usr/bin/env python
"""Packed equals unpacked on the GPU: logits and loss of packed batches through each GPU attention path against
every document run alone, in fp32 and bf16, with a negative control (spec/READER.md §7; the CPU proof is
tests/test_torch_equivalence.py).

A random Llama (``--hidden``, ``--layers``; grouped-query heads) reads packs of a chat-like data set (a loss
mask; documents split across packs, so continuation segments occur) through:

* ``sdpa, position_ids``: ``collate_hf`` (one row; transformers finds the documents from ``position_ids``);
* ``sdpa, 4-D document mask``: ``collate_padded`` + ``document_causal_mask``;
* ``flex_attention``: ``collate_hf`` with transformers' FlexAttention;
* ``packfmt_varlen``: ``collate_hf`` with ``packfmt.torch.hf_attention`` (torch's ``varlen_attn`` for bf16 on
  CUDA; its SDPA form otherwise, which the row says);
* ``flash_attention_2`` when flash-attn is installed.

Each is compared with every segment run alone (SDPA, plain causal) in the same dtype: the largest absolute
logit difference over every real token, and the pooled loss. Tolerances: fp32, ``--fp32-tol`` (TF32 off; what is
left is the order of float32 sums). bf16: twice the "bf16 noise", the largest difference between the documents
alone in bf16 and alone in fp32, because two bf16 computations of the same values each lie within bf16's own error
of the exact result, so they differ by at most twice it; packing passes when it adds no error beyond what bf16
itself makes. The negative control (the same row with positions 0..T-1 and a plain causal mask: documents see each
other) must miss by far more than the tolerance, so the comparison is known to be able to fail.

    python benchmarks/bench_gpu_equivalence.py [--out benchmarks/results/bench_gpu_equivalence.json]
    python benchmarks/bench_gpu_equivalence.py --cpu-smoke --out /tmp/x.json   # fp32 on the CPU, tiny (a test)

Exit status 1 when a path that ran is outside its tolerance or the negative control is not.
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from common import add_gpu_args, gpu_device, machine_info, print_table, write_json  # noqa: E402


def build(root: Path, n_docs: int, capacity: int, vocab: int):
    import packfmt
    from packfmt.torch import PackedDataset
    from packfmt.torch.testing import next_fit_segments, write_pack_index

    rng = np.random.default_rng(7)
    lengths = rng.integers(8, capacity + capacity // 2, n_docs)  # some longer than a pack: split
    with packfmt.DatasetWriter(root / "ds", vocab_size=vocab, loss_mask=True) as w:
        for n in lengths.tolist():
            w.add_document(rng.integers(0, vocab, n), (rng.random(n) < 0.7).astype(np.uint8))
    store = packfmt.open(root / "ds")
    segs, po = next_fit_segments(store.doc_lengths, capacity, order=rng.permutation(n_docs))
    write_pack_index(store, segs, po, capacity=capacity, name="nf")
    return store, PackedDataset(store, "nf")


def alone(store, model, segments, device):
    """Per-token logits (float32) of every segment run alone, in order, and its labels."""
    import torch

    from packfmt.torch import IGNORE_INDEX

    logits, labels = [], []
    for d, b, e in segments.tolist():
        doc = np.asarray(store.document(d), dtype=np.int64)
        mask = np.asarray(store.document_loss_mask(d))
        with torch.no_grad():
            out = model(input_ids=torch.from_numpy(doc[b:e]).unsqueeze(0).to(device), use_cache=False)
        logits.append(out.logits[0].float())
        # the label of token t is the document's next token where the mask trains it (spec/READER.md §2)
        labels.append(torch.tensor([int(doc[t + 1]) if t + 1 < len(doc) and mask[t + 1] else IGNORE_INDEX
                                    for t in range(b, e)], dtype=torch.int64))
    return torch.cat(logits), torch.cat(labels).to(device)


def pooled(logits, labels) -> float:
    import torch.nn.functional as F

    from packfmt.torch import IGNORE_INDEX

    return (F.cross_entropy(logits.float(), labels, ignore_index=IGNORE_INDEX, reduction="sum")
            / (labels != IGNORE_INDEX).sum()).item()


def run_path(name: str, model, items, device):
    """Logits (float32) of the real tokens of ``items`` through path ``name``, in segment order."""
    import torch

    from packfmt.torch import collate_hf, collate_padded, document_causal_mask
    from packfmt.torch.hf_attention import register_hf_varlen

    def to(batch):
        return {k: (v.to(device) if torch.is_tensor(v) else v) for k, v in batch.items()}

    if name == "sdpa, 4-D document mask":
        batch = to(collate_padded(items))
        model.set_attn_implementation("sdpa")
        out = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                    attention_mask=document_causal_mask(batch["doc_ids"]), use_cache=False)
        return out.logits[batch["doc_ids"] >= 0].float()
    impl = {"sdpa, position_ids": "sdpa", "flex_attention": "flex_attention", "flash_attention_2": "flash_attention_2",
            "packfmt_varlen": None, "negative control": "sdpa"}[name]
    model.set_attn_implementation(register_hf_varlen() if impl is None else impl)
    batch = to(collate_hf(items))
    batch.pop("labels", None)
    batch.pop("shift_labels", None)
    batch.pop("num_label_tokens", None)
    if name == "negative control":  # one causal row: positions 0..T-1, no bounds (documents see each other)
        total = batch["input_ids"].shape[1]
        out = model(input_ids=batch["input_ids"], position_ids=torch.arange(total, device=device).unsqueeze(0),
                    use_cache=False)
    else:
        out = model(**batch)
    return out.logits[0].float()


PATHS = ["sdpa, position_ids", "sdpa, 4-D document mask", "flex_attention", "packfmt_varlen", "flash_attention_2"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--docs", type=int, default=48)
    p.add_argument("--capacity", type=int, default=1024)
    p.add_argument("--packs", type=int, default=8, help="packs in the batch compared")
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--fp32-tol", type=float, default=1e-3, help="largest |logit difference| allowed in fp32")
    add_gpu_args(p, "bench_gpu_equivalence.json", "fp32 on the CPU, whatever the sizes (a test)")
    args = p.parse_args(argv)
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    device = gpu_device(p, args, "bench_gpu_equivalence")
    if device is None:
        return 0
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32
    torch.backends.cudnn.allow_tf32 = False
    store, ds = build(Path(tempfile.mkdtemp()), args.docs, args.capacity, args.vocab)
    items = [ds[i] for i in range(min(args.packs, len(ds)))]
    segments = np.concatenate([np.asarray(ds.index.pack_segments(int(it["pack_id"]))) for it in items])
    assert np.any(segments[:, 1] > 0), "the batch should hold a continuation segment"
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
                      num_hidden_layers=args.layers, num_attention_heads=args.heads,
                      num_key_value_heads=max(1, args.heads // 2), max_position_embeddings=4 * args.capacity)
    base = LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa", dtype=torch.float32).eval()
    dtypes = ["float32"] if device.type == "cpu" else ["float32", "bfloat16"]
    models = {dt: copy.deepcopy(base).to(device=device, dtype=getattr(torch, dt)) for dt in dtypes}  # same weights
    ref = {}
    rows = []
    for dt in dtypes:
        ref[dt] = alone(store, models[dt], segments, device)
    labels = ref["float32"][1]
    noise = None
    if "bfloat16" in ref:
        noise = (ref["bfloat16"][0] - ref["float32"][0]).abs().max().item()
    for dt in dtypes:
        model = models[dt]
        want, _ = ref[dt]
        tol = args.fp32_tol if dt == "float32" else 2 * noise
        for name in PATHS + ["negative control"]:
            row = {"dtype": dt, "path": name, "tolerance": tol}
            if name == "packfmt_varlen":
                row["kernel"] = "torch varlen_attn" if device.type == "cuda" and dt != "float32" else "sdpa form"
            try:
                with torch.no_grad():
                    got = run_path(name, model, items, device)
            except Exception as exc:  # flash-attn absent, a kernel without this dtype
                row["status"] = f"skipped: {type(exc).__name__}: {str(exc)[:160]}"
                rows.append(row)
                print(row, flush=True)
                continue
            diff = (got - want).abs().max().item()
            row.update(max_abs_logit_diff=diff, loss=pooled(got, labels), loss_alone=pooled(want, labels),
                       loss_abs_diff=abs(pooled(got, labels) - pooled(want, labels)), diff_over_tolerance=diff / tol)
            if noise is not None:
                row["bf16_noise"] = noise
            ok = diff > tol if name == "negative control" else diff <= tol
            row["status"] = "pass" if ok else "FAIL"
            rows.append(row)
            print(row, flush=True)
    gpu = torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu (smoke run, not a measurement)"
    print_table(rows, ["dtype", "path", "max_abs_logit_diff", "tolerance", "diff_over_tolerance", "loss_abs_diff",
                       "status"], title=f"packed vs each document alone on {gpu} ({int(segments.shape[0])} segments, "
                                        f"{sum(len(it['input_ids']) for it in items)} tokens)")
    write_json(args.out, {"gpu": gpu, "torch": torch.__version__, "machine": machine_info(),
                          "args": vars(args) | {"out": str(args.out)}, "segments": int(segments.shape[0]),
                          "rows": rows})
    return 1 if any(r["status"] == "FAIL" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
