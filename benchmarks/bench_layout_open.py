"""Opening a local pack-ordered layout (``write_shards``) of 10^2-10^4 shards, this checkout beside a baseline.

For each ``--shards`` count N a layout of about N shards is written once (by THIS checkout): a source store of
``N * --docs`` documents of 1-255 tokens (uint16 ids, one member written by ``write_split_stores``), an ffd pack
index ``p`` of capacity ``--capacity``, and ``write_shards(source, "p", OUT, shard_bytes=S)`` with S the packed token
bytes over N (spec/COLLECTION.md §9): shards of a few KiB. Only OUT is read. Each timed run is a fresh
spawned child (``python -P this --child``, ``PYTHONPATH`` = the code tree) that has imported ``packfmt.torch``
before the clock starts, then times three stages one after the other, as a training script meets them:

- ``construct``: ``PackedDataset(OUT, "p")``;
- ``sampler``: ``DistributedPackSampler(ds, num_replicas=1, rank=0, window=2)`` + ``epoch_indices()``;
- ``first batch``: ``ds.__getitems__`` of the first ``--batch`` packs of that order.

A stage pays whatever its process meets first (numba's first load of its compiled kernels: LLVM set up, the caches
read, ~0.25 s on this machine): ``total`` is the three together. Each column is the best of ``--repeat`` children
(taken column by column) after one untimed child per code tree (the page cache; numba's cache of an exported
tree). ``--baseline REF|DIR`` (default ``main``): a git commit exported with ``git archive`` or a code tree on disk
(``bench_startup.baseline_codes``), run alternated with this checkout (ABBA); ``vs_baseline``: a row's total over
the baseline's.
``--baseline none``: this checkout alone. ``--data DIR`` keeps the layouts there and reuses them on the next run
(10^4 shards take a minute or two to write); by default they go in a temporary directory. ``--in-process``: no
children, no baseline (the smoke test's mode; numba already loaded, so the stages show little).

    python benchmarks/bench_layout_open.py [--shards 100,1000,10000] [--docs 16] [--capacity 512] [--repeat 3]
        [--batch 8] [--baseline main|REF|DIR|none] [--data DIR] [--in-process]
        [--out benchmarks/results/bench_layout_open.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_startup import baseline_codes  # noqa: E402
from common import RESULTS_DIR, machine_info, print_table, write_json  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
INDEX = "p"
STAGES = ("construct", "sampler", "first batch")
WINDOW = 2
#: Document lengths: uniform in [1, MAX_LEN] (mean 128 tokens).
MAX_LEN = 255


def build(root: Path, shards: int, docs: int, capacity: int) -> dict:
    """The layout ``root/layout`` of about ``shards`` shards of about ``docs`` documents each (reused when there);
    a summary of it."""
    import shutil

    from packfmt.collection import Collection, write_collection
    from packfmt.collection.shards import write_shards
    from packfmt.packindex import build_pack_index
    from packfmt.torch.testing import write_split_stores

    out = root / "layout"
    t0 = time.perf_counter()
    reused = (out / "manifest.json").is_file()
    if not reused:
        n = shards * docs
        rng = np.random.default_rng(shards)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(rng.integers(1, MAX_LEN + 1, n), out=offsets[1:])
        tokens = rng.integers(0, 50_000, int(offsets[-1]), dtype=np.uint16)
        src = root / "src"
        shutil.rmtree(src, ignore_errors=True)
        paths = write_split_stores(src / "stores", tokens, offsets, np.array([0, n]), vocab_size=50_000)
        coll = write_collection(src / "coll", [(None, p) for p in paths])
        idx = build_pack_index(coll, capacity=capacity, algorithm="ffd", name=INDEX)
        shard_bytes = max(1, int(np.asarray(idx.pack_lengths).sum()) * tokens.itemsize // shards)
        del idx, tokens
        write_shards(coll, INDEX, out, shard_bytes=shard_bytes)
        shutil.rmtree(src)
    written_s = time.perf_counter() - t0
    coll = Collection(out)
    idx = coll.pack_index(INDEX)
    summary = {"shards_asked": shards, "shards": int(coll.num_members), "documents": int(coll.num_documents),
               "tokens": int(coll.num_tokens), "packs": int(idx.num_packs), "capacity": int(idx.capacity),
               "shard_bytes": int(coll.manifest.raw["layout"]["shard_bytes"]), "write_s": None if reused else written_s,
               "bytes": sum(f.stat().st_size for f in out.rglob("*") if f.is_file())}
    print(f"{summary['shards']:,} shards, {summary['documents']:,} documents, {summary['packs']:,} packs, "
          f"{summary['bytes'] / 2**20:.1f} MiB ({'reused' if reused else 'written'} in {written_s:.1f} s)",
          flush=True)
    return summary


def stages(path: str, batch: int) -> dict:
    """Seconds of each stage, one after the other, in this process."""
    from packfmt.torch import DistributedPackSampler, PackedDataset

    t0 = time.perf_counter()
    ds = PackedDataset(path, INDEX)
    t1 = time.perf_counter()
    order = DistributedPackSampler(ds, num_replicas=1, rank=0, window=WINDOW).epoch_indices()
    t2 = time.perf_counter()
    items = ds.__getitems__(np.asarray(order[:batch], dtype=np.int64))
    t3 = time.perf_counter()
    if len(items) != min(batch, len(order)):
        raise SystemExit(f"{path}: first batch of {len(items)} items, expected {min(batch, len(order))}")
    return {"construct": t1 - t0, "sampler": t2 - t1, "first batch": t3 - t2, "total": t3 - t0}


def child(spec: dict) -> dict:
    import packfmt
    import packfmt.torch  # noqa: F401  (imported before the clock starts, as a training script has it)

    row = stages(spec["path"], spec["batch"])
    row["packfmt"] = str(Path(packfmt.__file__).resolve().parent)
    return row


def spawn(spec: dict, code: Path) -> dict:
    """``child(spec)`` in a fresh process whose ``packfmt`` is ``code``'s."""
    env = {**os.environ, "PYTHONPATH": str(code)}
    done = subprocess.run([sys.executable, "-P", str(Path(__file__).resolve()), "--child", json.dumps(spec)],
                          env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"child ({code}, {spec['path']}): exit status {done.returncode}: {done.stderr[-3000:]}")
    row = json.loads(done.stdout.strip().splitlines()[-1])
    if Path(row["packfmt"]) != (code / "packfmt").resolve():
        raise SystemExit(f"child imported packfmt from {row['packfmt']}, expected {code / 'packfmt'}")
    return row


def measure(path: Path, codes: dict, repeat: int, batch: int, in_process: bool) -> list[dict]:
    spec = {"path": str(path), "batch": batch}
    labels = list(codes)
    runs: dict[str, list[dict]] = {label: [] for label in labels}
    if in_process:
        stages(str(path), batch)  # untimed
        runs["this"] = [stages(str(path), batch) for _ in range(repeat)]
    else:
        for label in labels:  # untimed: the page cache, numba's cache of an exported tree
            spawn(spec, codes[label])
        for k in range(repeat):
            for label in (labels if k % 2 == 0 else labels[::-1]):  # ABBA
                runs[label].append(spawn(spec, codes[label]))
    rows = []
    for label in labels:
        row = {"code": label, "runs": len(runs[label]), "times": runs[label]}
        for key in (*STAGES, "total"):
            row[key] = min(r[key] for r in runs[label])
        rows.append(row)
    if len(rows) > 1:
        for row in rows:
            row["vs_baseline"] = row["total"] / rows[-1]["total"]
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shards", default=[100, 1000, 10000], type=lambda t: [int(x) for x in t.split(",")])
    ap.add_argument("--docs", type=int, default=16, help="documents per shard, about (1-255 tokens each)")
    ap.add_argument("--capacity", type=int, default=512, help="the pack index's capacity (tokens)")
    ap.add_argument("--batch", type=int, default=8, help="packs of the first batch (the first of the sampler's order)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--baseline", default="main", help="a git commit (default main), a code tree DIR, or 'none'")
    ap.add_argument("--data", help="keep the layouts here and reuse them (default: a temporary directory)")
    ap.add_argument("--in-process", action="store_true", help="no child processes (no baseline)")
    ap.add_argument("--out", default=str(RESULTS_DIR / "bench_layout_open.json"))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    if args.in_process and args.baseline != "none":
        ap.error("--in-process runs this checkout alone: add --baseline none")
    if "packfmt" not in sys.modules:
        sys.path.insert(0, str(ROOT))  # the layouts are written by this checkout
    rows, built = [], []
    with tempfile.TemporaryDirectory(prefix="bench_layout_open_", dir=os.environ.get("BENCH_TMP")) as tmp:
        codes = {"this": ROOT, **baseline_codes(ap, args.baseline, Path(tmp) / "baseline")}
        data = Path(args.data) if args.data else Path(tmp) / "data"
        load_before = os.getloadavg()
        for shards in args.shards:
            root = data / f"s{shards}-d{args.docs}-c{args.capacity}"
            summary = build(root, shards, args.docs, args.capacity)
            built.append(summary)
            for row in measure(root / "layout", codes, args.repeat, args.batch, args.in_process):
                row.update(shards=summary["shards"], documents=summary["documents"], packs=summary["packs"])
                rows.append(row)
                print(f"  {row['shards']:>6,} shards  code={row['code']:14s} " + "  ".join(
                    f"{k} {row[k]:.3f} s" for k in (*STAGES, "total")), flush=True)
        load_after = os.getloadavg()
    print_table(rows, ["shards", "packs", "code", *STAGES, "total", "vs_baseline"],
                title=f"local pack-ordered layout opened from a fresh process with packfmt.torch imported (seconds, "
                      f"best of {args.repeat} children; window={WINDOW}, first batch = {args.batch} packs; load "
                      f"average {load_before[0]:.1f} -> {load_after[0]:.1f} on {os.cpu_count()} cores)")
    write_json(args.out, {"rows": rows, "layouts": built, "codes": {k: str(v) for k, v in codes.items()},
                          "load_average_before": load_before, "load_average_after": load_after,
                          "machine": machine_info(), "args": {k: v for k, v in vars(args).items() if k != "child"}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
