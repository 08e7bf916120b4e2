#!/usr/bin/env python
"""Throughput of the torch reader: ds[i] + collate vs a plain np.memmap copy of the same tokens.

    python benchmarks/bench_loader.py [--docs 40000] [--capacity 4096] [--out benchmarks/results/bench_loader.json]

Rows: the baseline copies each pack's tokens out of a memmap (``np.memmap`` slice -> int64
tensor, batched with ``torch.cat``), i.e. the least a loader must do; the reader rows build
input_ids, labels, position_ids, doc_ids (+ cu_seqlens etc. in collate). The figure of merit is
the ratio to the baseline (aim >= 0.5 single-process). Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

from packfmt.torch import PackedDataset, collate_hf, collate_padded, collate_varlen
from packfmt.torch.testing import next_fit_segments, write_flat_dataset, write_pack_index

BATCH = 8


def build(root: Path, docs: int, capacity: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(6.0, 1.0, docs).astype(np.int64), 1, 4 * capacity)
    offsets = np.zeros(docs + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    store = write_flat_dataset(root / "ds", rng.integers(0, 32000, int(offsets[-1]), dtype=np.uint16), offsets, vocab_size=32000)
    try:
        from packfmt.packindex import build_pack_index

        build_pack_index(store, capacity=capacity, algorithm="ffd", name="ffd", materialize=False)
        build_pack_index(store, capacity=capacity, algorithm="ffd", name="ffd-mat", materialize=True)
    except Exception:  # packing engine unavailable: next-fit by hand
        segs, po = next_fit_segments(lengths, capacity, order=rng.permutation(docs))
        write_pack_index(store, segs, po, capacity=capacity, name="ffd")
        write_pack_index(store, segs, po, capacity=capacity, name="ffd-mat", materialize=True)
    return store


def timed(fn, min_seconds: float = 2.0) -> float:
    """Tokens per second of ``fn() -> tokens``, repeated for at least ``min_seconds``."""
    fn()  # warm the page cache and lazy opening
    t0, tokens = time.perf_counter(), 0
    while time.perf_counter() - t0 < min_seconds:
        tokens += fn()
    return tokens / (time.perf_counter() - t0)


def memmap_baseline(store, name: str):
    idx = store.pack_index(name)
    toks = np.memmap(idx.path / "tokens.bin", dtype=store.manifest.np_token_dtype, mode="r")
    o = np.asarray(idx.pack_token_offsets)
    n = len(o) - 1

    def run():
        total = 0
        for s in range(0, n - BATCH + 1, BATCH):
            batch = torch.cat([torch.from_numpy(toks[o[i]:o[i + 1]].astype(np.int64)) for i in range(s, s + BATCH)])
            total += batch.numel()
        return total
    return run


def reader(ds, collate):
    n = len(ds)

    def run():
        total = 0
        for s in range(0, n - BATCH + 1, BATCH):
            b = collate([ds[i] for i in range(s, s + BATCH)])
            total += int(b["input_ids"].numel())
        return total
    return run


def loader(ds, collate, workers: int):
    dl = DataLoader(ds, batch_size=BATCH, collate_fn=collate, num_workers=workers, persistent_workers=workers > 0,
                    drop_last=True)

    def run():
        return sum(int((b["doc_ids"] >= 0).sum()) for b in dl)
    return run


def hf_baseline(store, name: str):
    """HF datasets + DataCollatorWithFlattening over the same packs' segments, or None."""
    try:
        import datasets
        from transformers import DataCollatorWithFlattening
    except ImportError:
        return None
    idx = store.pack_index(name)
    po, segs = np.asarray(idx.pack_offsets), np.asarray(idx.segments)
    starts = store.doc_offsets[segs[:, 0]] + segs[:, 1]
    seqs = [np.asarray(store.tokens[s:s + (e - b)]).tolist() for s, (_, b, e) in zip(starts, segs)]
    hf = datasets.Dataset.from_dict({"input_ids": seqs}).with_format(None)
    coll = DataCollatorWithFlattening(return_tensors="pt")
    n = len(po) - 1

    def run():
        total = 0
        for s in range(0, n - BATCH + 1, BATCH):
            rows = hf[int(po[s]):int(po[s + BATCH])]["input_ids"]
            b = coll([{"input_ids": r} for r in rows])
            total += int(b["input_ids"].numel())
        return total
    return run


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--docs", type=int, default=40000)
    p.add_argument("--capacity", type=int, default=4096)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "bench_loader.json")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        store = build(Path(tmp), args.docs, args.capacity)
        rows = {"np.memmap copy (baseline)": memmap_baseline(store, "ffd-mat")}
        for name in ("ffd-mat", "ffd"):
            ds = PackedDataset(store, name)
            tag = "materialized" if name == "ffd-mat" else "gathered"
            rows[f"ds[i]+collate_varlen {tag}, workers=0"] = reader(ds, collate_varlen)
            rows[f"ds[i]+collate_hf {tag}, workers=0"] = reader(ds, collate_hf)
            rows[f"ds[i]+collate_padded {tag}, workers=0"] = reader(ds, lambda b: collate_padded(b, length=args.capacity))
            rows[f"DataLoader collate_varlen {tag}, workers=2"] = loader(ds, collate_varlen, 2)
        hf = hf_baseline(store, "ffd")
        if hf is not None:
            rows["HF datasets + DataCollatorWithFlattening"] = hf
        results = {k: timed(fn, args.seconds) for k, fn in rows.items()}
        n_packs, n_tokens = len(PackedDataset(store, "ffd")), store.num_tokens
    base = results["np.memmap copy (baseline)"]
    print(f"\n{args.docs} documents, {n_tokens} tokens, {n_packs} packs of capacity {args.capacity}, batch {BATCH}\n")
    print(f"| {'reader':<48} | {'Mtokens/s':>10} | {'ratio to memmap':>15} |")
    print(f"|{'-' * 50}|{'-' * 12}|{'-' * 17}|")
    for k, v in results.items():
        print(f"| {k:<48} | {v / 1e6:>10.2f} | {v / base:>15.2f} |")
    record = {"documents": args.docs, "tokens": n_tokens, "packs": n_packs, "capacity": args.capacity, "batch": BATCH,
              "torch_threads": 1, "machine": platform.platform(), "processor": platform.processor(),
              "cpus": __import__("os").cpu_count(),
              "tokens_per_s": results, "ratio_to_memmap": {k: v / base for k, v in results.items()}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
