"""Benchmark of the packing engine: every algorithm x three length distributions x n.

    python benchmarks/bench_pack.py [--quick] [--out benchmarks/results/bench_pack.json]
                                    [--real-lengths DATASET_DIR|FILE.npy] [--no-trl]

For each (distribution, n, algorithm) it records wall seconds of ``pack_items`` (the numba
compile is done beforehand, on a small input), packs, fill efficiency, packs / lower bound and
the peak bytes per item allocated during the call (``tracemalloc``; every large array in
packfmt.packing is a numpy allocation, which tracemalloc sees). It also records the padding
baselines users know (pad to the longest in random batches of 8, pad to the longest after
sorting by length, pad to the capacity) and, if ``trl`` is importable, the time of
``trl.data_utils.pack_dataset(..., strategy="bfd")`` on the same lengths.

Distributions:
  web   lognormal (sigma 1, mean ~800 tokens after clipping to [1, 4096]), capacity 4096.
  chat  heavy-tailed, many short: 120 * (1 + Pareto(1.2)) clipped to [1, 8192], capacity 8192.
  real  the token lengths of a real dataset: by default the Python stdlib .py files built with
        ``packfmt build text`` and the shipped BPE tokenizer (or --real-lengths: a packfmt
        dataset directory or a .npy of lengths), resampled with replacement to n documents;
        documents longer than the capacity (4096) are split with segment_documents first.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import sysconfig
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from packfmt.packing import ALGORITHMS, pack_items, pack_stats, segment_documents  # noqa: E402

SIZES = (10_000, 100_000, 1_000_000, 10_000_000)
QUICK_SIZES = (10_000, 100_000)
TRL_MAX_N = 1_000_000  # trl's packer is a Python loop over items and needs the tokens in memory
TRL_MAX_N_QUICK = 10_000
TRL_MAX_TOKENS = 1_000_000_000  # 1 byte per token, twice (the dataset and trl's packed copy)
MM_MAX_IMAGES = 8  # image budget per pack of the multimodal case
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "bench_pack.json"


# --------------------------------------------------------------------------- distributions


def web_lengths(n: int, rng: np.random.Generator) -> np.ndarray:
    """Lognormal, sigma 1, mean ~800 after clipping to [1, 4096]."""
    return np.clip(np.round(rng.lognormal(np.log(800) - 0.45, 1.0, n)), 1, 4096).astype(np.int64)


def chat_lengths(n: int, rng: np.random.Generator) -> np.ndarray:
    """Heavy-tailed, many short: 120 * (1 + Pareto(1.2)), clipped to [1, 8192]."""
    return np.clip(np.round(120 * (1 + rng.pareto(1.2, n))), 1, 8192).astype(np.int64)


def real_dataset_lengths(limit: int | None = None) -> tuple[np.ndarray, str]:
    """Token lengths of a real dataset: the Python stdlib ``.py`` files built with ``packfmt build``.

    Uses the tokenizer shipped in ``packfmt/sample_data/tokenizer`` (byte-level BPE, 8k), BOS/EOS
    added; files that are not valid UTF-8 are skipped and counted by the build report.
    """
    import tempfile

    from packfmt.build import build_text
    from packfmt.opening import open_dataset

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    tok = Path(__file__).resolve().parents[1] / "packfmt" / "sample_data" / "tokenizer"
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"  # the stdlib's own files only (not site-packages), as a flat folder of links
        src.mkdir()
        for f in sorted(stdlib.rglob("*.py")):
            rel = f.relative_to(stdlib)
            if rel.parts[0] != "site-packages" and f.is_file():
                (src / "__".join(rel.parts)).symlink_to(f)
        build_text([src], Path(tmp) / "stdlib", tok, glob="*.py", on_error="skip", workers=1 if limit else 2, limit=limit,
                   progress=False)
        store = open_dataset(Path(tmp) / "stdlib")
        lengths = np.array(store.doc_lengths, dtype=np.int64)
    label = f"real: {lengths.size} stdlib .py files tokenized by packfmt build (BPE 8k), resampled"
    return lengths, label


def distributions(real_path: str | None, quick: bool = False) -> list[dict]:
    """The three distributions: name, capacity, a sampler ``f(n, rng) -> doc lengths`` and a label."""
    if real_path:
        path = Path(real_path)
        if path.is_dir():  # a packfmt dataset
            from packfmt.opening import open_dataset

            base, label = np.array(open_dataset(path).doc_lengths), f"real lengths of the dataset {real_path}"
        else:
            base, label = np.load(real_path).astype(np.int64), f"real lengths from {real_path}"
    else:
        base, label = real_dataset_lengths(limit=100 if quick else None)
    base = base[base > 0]
    return [
        {"name": "web", "capacity": 4096, "sample": web_lengths,
         "label": "lognormal sigma=1, mean~800, clip [1,4096]"},
        {"name": "chat", "capacity": 8192, "sample": chat_lengths,
         "label": "120*(1+Pareto(1.2)), clip [1,8192]"},
        {"name": "real", "capacity": 4096, "sample": lambda n, rng: rng.choice(base, n), "label": label},
    ]


# --------------------------------------------------------------------------- measurements


def measure(fn):
    """Run ``fn()`` once; return (result, seconds, peak bytes allocated during the call)."""
    tracemalloc.start()
    tracemalloc.reset_peak()
    before, _ = tracemalloc.get_traced_memory()
    t0 = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return result, seconds, peak - before


def padding_baselines(lengths: np.ndarray, capacity: int, rng: np.random.Generator) -> dict:
    """Efficiency (real tokens / padded tokens) of the padding schemes, batches of 8."""
    tokens = int(lengths.sum())

    def pad_to_longest(order: np.ndarray) -> float:
        x = lengths[order]
        pad = (-x.size) % 8
        rows = np.concatenate([x, np.zeros(pad, np.int64)]).reshape(-1, 8)
        counts = np.full(rows.shape[0], 8)
        counts[-1] -= pad
        return tokens / int((rows.max(axis=1) * counts).sum())

    return {
        "pad_longest_random_b8": pad_to_longest(rng.permutation(lengths.size)),
        "pad_longest_sorted_b8": pad_to_longest(np.argsort(lengths, kind="stable")),
        "pad_to_capacity": tokens / (lengths.size * capacity),
    }


def trl_bfd(lengths: np.ndarray, capacity: int, batch_size: int | None) -> dict | None:
    """Time ``trl.data_utils.pack_dataset(strategy="bfd")`` on a dataset with these lengths.

    ``batch_size=None`` packs the whole dataset as one batch (the same problem as ours);
    trl's default (1000) packs each batch of 1000 examples separately.
    """
    try:
        import datasets
        import pyarrow as pa
        from trl.data_utils import pack_dataset
    except Exception:  # noqa: BLE001 - trl is optional
        return None
    offsets = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    values = pa.array(np.zeros(int(offsets[-1]), dtype=np.uint8))
    column = pa.LargeListArray.from_arrays(pa.array(offsets), values)
    ds = datasets.Dataset(pa.table({"input_ids": column}))
    kwargs = {"batch_size": batch_size} if batch_size is not None else {"batch_size": None}
    datasets.disable_progress_bars()
    t0 = time.perf_counter()
    packed = pack_dataset(ds, capacity, strategy="bfd", map_kwargs=kwargs)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "packs": packed.num_rows}


# --------------------------------------------------------------------------- driver


def warm_up() -> None:
    """Compile (or load from the numba cache) every kernel on a small input."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 64, 500)
    images = rng.integers(0, 3, 500)
    for algorithm in ALGORITHMS:
        pack_items(lengths, 64, algorithm)
        pack_items(lengths, 64, algorithm, max_items_per_pack=4, image_counts=images, max_images_per_pack=4)
    segment_documents(lengths, 16, "split")


def run(sizes, real_path, use_trl: bool, trl_max_n: int, quick: bool = False) -> dict:
    warm_up()
    rows, baselines, trl_rows = [], [], []
    dists = distributions(real_path, quick)
    for dist in dists:
        capacity = dist["capacity"]
        for n in sizes:
            rng = np.random.default_rng(12345)
            docs = dist["sample"](n, rng)
            seg, seg_seconds, _ = measure(lambda: segment_documents(docs, capacity, "split"))
            lengths = seg.lengths
            del seg
            base = {"dist": dist["name"], "n_docs": int(n), "n_items": int(lengths.size), "capacity": capacity}
            baselines.append({**base, "segment_seconds": seg_seconds, **padding_baselines(lengths, capacity, rng)})
            for algorithm in ALGORITHMS:
                result, seconds, peak = measure(lambda: pack_items(lengths, capacity, algorithm, seed=0))
                stats = pack_stats(lengths, result, capacity)
                del result
                rows.append({**base, "algorithm": algorithm, "seconds": seconds, "packs": stats["packs"],
                             "lower_bound": stats["lower_bound"],
                             "packs_per_lower_bound": stats["packs"] / stats["lower_bound"],
                             "fill_efficiency": stats["fill_efficiency"],
                             "peak_bytes_per_item": peak / lengths.size})
                print_row(rows[-1])
            if use_trl and n <= trl_max_n and lengths.sum() <= TRL_MAX_TOKENS:
                for batch in (None, 1000):
                    out = trl_bfd(lengths, capacity, batch)
                    if out is None:
                        break
                    trl_rows.append({**base, "map_batch_size": batch or "whole dataset", **out,
                                     "fill_efficiency": float(lengths.sum()) / (out["packs"] * capacity)})
                    print(f"    trl bfd (batch {batch or 'all'}): {out['seconds']:.3f}s packs={out['packs']}")
    mm_rows = multimodal(sizes)
    return {"results": rows, "padding_baselines": baselines, "trl": trl_rows, "multimodal": mm_rows,
            "distributions": {d["name"]: d["label"] for d in dists}}


def multimodal_lengths(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Web lengths; 40% of the items carry 1-3 images of 256 tokens each (length >= their tokens)."""
    lengths = web_lengths(n, rng)
    images = np.where(rng.random(n) < 0.4, rng.integers(1, 4, n), 0).astype(np.int64)
    return np.minimum(np.maximum(lengths, 256 * images + 16), 4096), images


def multimodal(sizes) -> list[dict]:
    """Every algorithm with an image budget: packs and the spread of images per pack."""
    rows = []
    for n in sizes:
        lengths, images = multimodal_lengths(n, np.random.default_rng(54321))
        for algorithm in ALGORITHMS:
            result, seconds, peak = measure(lambda: pack_items(lengths, 4096, algorithm, image_counts=images,
                                                               max_images_per_pack=MM_MAX_IMAGES))
            stats = pack_stats(lengths, result, 4096, image_counts=images)
            ipp = stats["images_per_pack"]
            rows.append({"dist": "mm", "n_docs": int(n), "n_items": int(n), "capacity": 4096,
                         "max_images_per_pack": MM_MAX_IMAGES, "algorithm": algorithm, "seconds": seconds,
                         "packs": stats["packs"], "packs_per_lower_bound": stats["packs"] / stats["lower_bound"],
                         "fill_efficiency": stats["fill_efficiency"], "peak_bytes_per_item": peak / n,
                         "images_per_pack": ipp, "image_spread": ipp["max"] - ipp["min"]})
            print_row(rows[-1])
            print(f"      images per pack: min {ipp['min']} max {ipp['max']} std {ipp['std']:.3f}")
    return rows


def print_row(r: dict) -> None:
    print(f"{r['dist']:5s} n={r['n_docs']:>9,d} {r['algorithm']:18s} {r['seconds']:8.3f}s packs={r['packs']:>9,d} "
          f"eff={r['fill_efficiency']:.4f} packs/LB={r['packs_per_lower_bound']:.5f} "
          f"peak={r['peak_bytes_per_item']:.1f} B/item", flush=True)


def markdown_table(report: dict) -> str:
    """The results as a Markdown table (one row per distribution x n x algorithm)."""
    lines = ["| dist | n docs | items | algorithm | seconds | packs | fill eff. | packs / LB | peak B/item |",
             "|---|---:|---:|---|---:|---:|---:|---:|---:|"]
    for r in report["results"]:
        lines.append(f"| {r['dist']} | {r['n_docs']:,} | {r['n_items']:,} | {r['algorithm']} | {r['seconds']:.3f} | "
                     f"{r['packs']:,} | {r['fill_efficiency']:.4f} | {r['packs_per_lower_bound']:.5f} | "
                     f"{r['peak_bytes_per_item']:.1f} |")
    lines += ["", f"Multimodal (web lengths, 40% of items with 1-3 images x 256 tokens, capacity 4096, "
              f"max {MM_MAX_IMAGES} images per pack):", "",
              "| n | algorithm | seconds | packs | fill eff. | packs / LB | images/pack min | max | std "
              "| peak B/item |",
              "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in report.get("multimodal", []):
        i = r["images_per_pack"]
        lines.append(f"| {r['n_docs']:,} | {r['algorithm']} | {r['seconds']:.3f} | {r['packs']:,} | "
                     f"{r['fill_efficiency']:.4f} | {r['packs_per_lower_bound']:.5f} | {i['min']} | {i['max']} | "
                     f"{i['std']:.3f} | {r['peak_bytes_per_item']:.1f} |")
    lines += ["", "| dist | n docs | segment s | pad longest, random b8 | pad longest, sorted b8 | pad to capacity |",
              "|---|---:|---:|---:|---:|---:|"]
    for b in report["padding_baselines"]:
        lines.append(f"| {b['dist']} | {b['n_docs']:,} | {b['segment_seconds']:.3f} | "
                     f"{b['pad_longest_random_b8']:.4f} | "
                     f"{b['pad_longest_sorted_b8']:.4f} | {b['pad_to_capacity']:.4f} |")
    if report["trl"]:
        lines += ["", "| dist | n docs | trl pack_dataset bfd, map batch | seconds | packs | fill eff. |",
                  "|---|---:|---|---:|---:|---:|"]
        for t in report["trl"]:
            lines.append(f"| {t['dist']} | {t['n_docs']:,} | {t['map_batch_size']} | {t['seconds']:.3f} | "
                         f"{t['packs']:,} | {t['fill_efficiency']:.4f} |")
    return "\n".join(lines)


def environment() -> dict:
    import numba

    return {"python": platform.python_version(), "numpy": np.__version__, "numba": numba.__version__,
            "cpus": os.cpu_count(), "machine": platform.machine(), "platform": platform.platform()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="n up to 1e5 only (seconds, for tests)")
    ap.add_argument("--out", default=str(DEFAULT_OUT), help="JSON output path")
    ap.add_argument("--real-lengths", default=None,
                    help="a packfmt dataset directory or a .npy of document lengths (default: build the stdlib)")
    ap.add_argument("--no-trl", action="store_true", help="skip the trl comparison")
    args = ap.parse_args(argv)
    sizes = QUICK_SIZES if args.quick else SIZES
    t0 = time.perf_counter()
    report = run(sizes, args.real_lengths, not args.no_trl, TRL_MAX_N_QUICK if args.quick else TRL_MAX_N, args.quick)
    report["environment"] = environment()
    report["quick"] = args.quick
    report["total_seconds"] = time.perf_counter() - t0
    print()
    print(markdown_table(report))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
