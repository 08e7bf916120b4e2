#!/usr/bin/env python
"""GPU training throughput: naive padding vs packed batches on the same data (issue 4).

Builds a synthetic web-like dataset (lognormal lengths, mean ~800 tokens, capacity 4096), a
``pad`` index (one document per row: the naive baseline) and an ``ffd`` index, then trains the
same small Llama (bf16) with ``tools/train_example.py`` in each configuration and reports useful
(non-padding) tokens per second and the speedup over pad-to-max-length.

    python benchmarks/bench_gpu_train.py [--steps 30] [--out benchmarks/results/bench_gpu_train.json]

Needs a CUDA GPU; exits 0 with a message otherwise. ``--cpu-smoke`` runs the same loop on the
CPU with whatever sizes are given (tests/test_bench_gpu_train.py uses it with a tiny model, so the
script is known to run end to end before a GPU session spends device time on it); its numbers
mean nothing and it refuses to write to the default results file.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tools"), str(ROOT / "benchmarks")]

from common import add_gpu_args, gpu_device, machine_info, print_table, write_json  # noqa: E402


def build_data(path: Path, n_docs: int, capacity: int, vocab: int) -> None:
    import packfmt
    from packfmt.packindex import build_pack_index

    rng = np.random.default_rng(0)
    sigma = 1.0
    mu = np.log(800) - sigma**2 / 2
    lengths = np.clip(rng.lognormal(mu, sigma, n_docs).astype(np.int64), 16, capacity)
    with packfmt.DatasetWriter(path, vocab_size=vocab) as w:
        w.add_documents(rng.integers(0, vocab, int(lengths.sum())), lengths)
    store = packfmt.open(path)
    build_pack_index(store, capacity=capacity, algorithm="pad", name="pad")
    build_pack_index(store, capacity=capacity, algorithm="ffd", name="ffd")


CONFIGS = [
    # name, index, layout, pad_to, attention
    ("pad-to-max (naive)", "pad", "padded", "capacity", "sdpa"),
    ("pad-to-longest", "pad", "padded", "longest", "sdpa"),
    ("packed ffd, B x cap + doc mask (sdpa)", "ffd", "padded", "capacity", "sdpa"),
    ("packed ffd, varlen (flex_attention)", "ffd", "varlen", None, "flex_attention"),
    ("packed ffd, varlen (torch varlen_attn)", "ffd", "varlen", None, "packfmt_varlen"),
    ("packed ffd, varlen (flash_attention_2)", "ffd", "varlen", None, "flash_attention_2"),
]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--docs", type=int, default=20000)
    p.add_argument("--capacity", type=int, default=4096)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--num-workers", type=int, default=2, help="DataLoader workers (pin_memory on a GPU)")
    p.add_argument("--only", default=None, help="comma separated substrings: run only the configs whose name has one")
    add_gpu_args(p, "bench_gpu_train.json")
    args = p.parse_args(argv)
    import torch

    if gpu_device(p, args, "bench_gpu_train") is None:
        return 0
    import train_example

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu (smoke run, not a measurement)"
    tmp = Path(tempfile.mkdtemp())
    t0 = time.perf_counter()
    build_data(tmp / "ds", args.docs, args.capacity, 32000)
    print(f"built {args.docs} documents + indexes in {time.perf_counter() - t0:.1f} s")
    rows = []
    configs = [c for c in CONFIGS if args.only is None or any(w in c[0] for w in args.only.split(","))]
    for name, index, layout, pad_to, attn in configs:
        argv_cfg = ["--data", str(tmp / "ds"), "--index", index, "--layout", layout, "--steps", str(args.steps),
                    "--batch-size", str(args.batch_size), "--grad-accum", "1", "--hidden", str(args.hidden),
                    "--layers", str(args.layers), "--heads", str(args.heads), "--attn", attn,
                    "--num-workers", str(args.num_workers)]
        if pad_to:
            argv_cfg += ["--pad-to", pad_to]
        try:
            logs = train_example.train(train_example.parse_args(argv_cfg))
        except Exception as exc:  # e.g. flash-attn not installed
            rows.append({"config": name, "status": f"skipped: {type(exc).__name__}: {str(exc)[:120]}"})
            print(f"{name}: skipped ({type(exc).__name__}: {str(exc)[:200]})")
            continue
        finally:
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        steady = logs[args.warmup:] or logs
        rows.append({
            "config": name, "status": "ok",
            "useful_tokens_per_s": statistics.median(r["tokens_per_s"] for r in steady),
            "padding_fraction": statistics.mean(r["padding_fraction"] for r in steady),
            "step_s": statistics.median(r["step_s"] for r in steady),
            # the GPU waits for data only while the loader is slower than a step: the time in next(loader)
            "data_wait_s": statistics.median(r["data_wait_s"] for r in steady),
            "data_wait_max_s": max(r["data_wait_s"] for r in steady),
            "peak_mem_gib": logs[-1]["peak_mem_gib"],
            "parameters": logs[-1]["parameters"],
            "final_loss": logs[-1]["loss"],
        })
    base = next((r["useful_tokens_per_s"] for r in rows if r["status"] == "ok" and r["config"].startswith("pad-to-max")), None)
    for r in rows:
        if r["status"] == "ok" and base:
            r["speedup_vs_pad_to_max"] = r["useful_tokens_per_s"] / base
    print_table(rows, ["config", "useful_tokens_per_s", "padding_fraction", "speedup_vs_pad_to_max", "step_s",
                       "data_wait_s", "data_wait_max_s", "peak_mem_gib", "final_loss", "status"],
                title=f"training throughput on {gpu} (Llama hidden {args.hidden}, {args.layers} layers, bf16, "
                      f"batch {args.batch_size} x {args.capacity})")
    write_json(args.out, {"gpu": gpu, "torch": torch.__version__, "machine": machine_info(), "args": vars(args) | {"out": str(args.out)},
                          "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
