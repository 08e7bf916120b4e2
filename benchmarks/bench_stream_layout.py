"""Time to first batch of a pack-ordered layout (``write_shards``) read streamed, this checkout beside a baseline.

A collection of ``--docs`` short documents (1-8 tokens; ``bench_stream_open.make``: ``--members`` members by
``write_split_stores``, ffd pack index ``p`` of capacity ``--capacity``) is written once per ``--docs`` value and
rewritten as a pack-ordered layout (``write_shards(coll, "p", layout, shard_bytes=--shard-bytes)``, spec/COLLECTION.md
§9); the source is then deleted and only the LAYOUT goes onto fsspec's ``memory://`` (``memory://bench/data/coll``,
``bench_stream_open.load_memory``), read from the URL with ``stream=True``. Stages, each from a cold cache directory
every repeat (best of ``--repeat`` after one untimed run):

- ``ready``: ``PackedDataset(URL, "p", stream=True, cache_limit=L, cache_dir=...)`` constructed (L: 10% of the
  shards' bytes, at least two shards; a shard's bytes are its files and its rows of the index, which the limit
  counts with it);
- ``sampler``: ``ready`` + ``DistributedPackSampler(ds, num_replicas=1, rank=0, window=4, balance=B)`` +
  ``epoch_indices()`` (this rank's order) for each B of ``--balance``;
- ``first batch``: ``sampler`` + ``ds.__getitems__`` of the first ``--batch`` packs of that order.

Columns as ``bench_stream_open``'s (its ``run_stage``, ``Counter``, spawned children): ``fetched_mb`` (bytes written
into the cache, ``downloads.log``), ``read_mb`` / ``requests`` (``cat_file`` on the memory file system),
``peak_rss_mb`` / ``added_rss_mb`` (the child's VmHWM, and above its RSS once set up), ``index_fetched_mb`` (what
of ``fetched_mb`` came from ``OUT/packs/``) and ``of_index`` (that over the layout index's bytes, ``OUT/packs/p``). ``--baseline DIR``: every stage child runs twice, once with this
checkout's ``packfmt`` (``PYTHONPATH`` = this tree) and once with ``PYTHONPATH=DIR``, alternated (ABBA by stage);
rows are labelled ``code=this`` / ``code=<basename of DIR>``; ``vs_this`` = seconds over this checkout's. The data
is written by THIS checkout only. ``--in-process``: no children, no baseline, no RSS (the smoke test's mode).

    python benchmarks/bench_stream_layout.py [--docs 1000000,10000000] [--repeat 3] [--baseline DIR]
        [--shard-bytes 64MiB] [--balance none,tokens] [--batch 1] [--members 100] [--capacity 4096]
        [--in-process] [--out benchmarks/results/bench_stream_layout.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_stream_open as bso  # noqa: E402
from common import RESULTS_DIR, machine_info, print_table, write_json  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
URL, INDEX, COMMITS = bso.URL, bso.INDEX, bso.COMMITS
STAGES = ("ready", "sampler", "first batch")
WINDOW = 4


def _data_bytes(folder: Path) -> int:
    """Bytes of the data files directly in ``folder`` (manifests aside: what ``downloads.log`` counts)."""
    return sum(f.stat().st_size for f in folder.iterdir() if f.is_file() and f.name not in COMMITS)


def build(root: Path, n_docs: int, members: int, capacity: int, shard_bytes: int) -> dict:
    """The source under ``root/src`` (deleted once rewritten), its layout at ``root/layout/coll``; a summary."""
    import packfmt
    from packfmt.collection.shards import SHARDS_DIR, write_shards

    src = bso.make(root / "src", n_docs, members, capacity)
    t0 = time.perf_counter()
    out = root / "layout" / "coll"
    write_shards(root / "src" / "coll", INDEX, out, shard_bytes=shard_bytes)
    shards_s = time.perf_counter() - t0
    shutil.rmtree(root / "src")
    coll = packfmt.open(str(out))
    idx = coll.pack_index(INDEX)
    # each shard's files and its rows of the index (8 B a pack + 8, 24 B a document): what cache_limit counts of it
    shards = [_data_bytes(out / m.path) + 8 * (p + 1) + 24 * int(m.documents)
              for m, p in zip(coll.members, coll.manifest.raw["layout"]["member_packs"])]
    sizes = {"shards": sum(shards), "largest_shard": max(shards), "collection_own": _data_bytes(out),
             "pack_index": _data_bytes(Path(idx.path)),
             "pack_index_files": {f.name: f.stat().st_size for f in sorted(Path(idx.path).iterdir()) if f.is_file()}}
    summary = {"documents": n_docs, "source_members": members, "source_build_s": src["build_s"],
               "write_shards_s": shards_s, "shard_bytes": shard_bytes, "shards": len(shards),
               "packs": int(idx.num_packs), "segments": int(np.asarray(idx.segments).shape[0]), "bytes": sizes}
    del idx
    print(f"{n_docs:,} documents: layout of {len(shards):,} shards, {summary['packs']:,} packs written in "
          f"{shards_s:.1f} s (source {src['build_s']:.1f} s); bytes {sizes}", flush=True)
    return summary


def stage_fn(stage: str, balance: str | None, cache: Path, limit: int, batch: int):
    """The callable timed for ``stage`` (a fresh cache directory ``cache``)."""
    from packfmt.torch import DistributedPackSampler, PackedDataset

    node = bso.node_limit(URL, INDEX, limit, cache)  # (untimed: what holds the same shards in this packfmt)

    def ready():
        return PackedDataset(URL, INDEX, stream=True, cache_limit=node, cache_dir=str(cache))
    if stage == "ready":
        return ready

    def sampler():
        ds = ready()
        s = DistributedPackSampler(ds, num_replicas=1, rank=0, window=WINDOW, balance=balance)
        order = s.epoch_indices() if hasattr(s, "epoch_indices") else np.fromiter(iter(s), dtype=np.int64)
        return ds, s, order
    if stage == "sampler":
        return sampler

    def first():
        ds, s, order = sampler()
        return ds, s, ds.__getitems__(np.asarray(order[:batch], dtype=np.int64))
    return first


def run_child(s: dict, rss: bool) -> dict:
    """One (stage, balance) with whatever ``packfmt`` this process imports; the row names where it came from."""
    import packfmt

    row = bso.run_stage("layout", s["stage"], Path(s["root"]), Path(s["work"]), s["limit"], s["batch"], s["repeat"],
                        rss, fn_for=lambda cache: stage_fn(s["stage"], s["balance"], cache, s["limit"], s["batch"]))
    row.update(code=s["code"], balance=s["balance"] or "-", packfmt=str(Path(packfmt.__file__).resolve().parent))
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", default=[1_000_000, 10_000_000], type=lambda t: [int(x) for x in t.split(",")])
    ap.add_argument("--members", type=int, default=100, help="members of the source collection")
    ap.add_argument("--capacity", type=int, default=4096)
    ap.add_argument("--shard-bytes", default="64MiB", help="write_shards' shard_bytes (256MiB, 1048576, ...)")
    ap.add_argument("--balance", default=["none", "tokens"], type=lambda t: t.split(","))
    ap.add_argument("--batch", type=int, default=1, help="packs of the first batch (the first of the sampler's order)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--baseline", metavar="DIR", help="a second code tree, run alternated with this one")
    ap.add_argument("--in-process", action="store_true", help="no child processes (no RSS columns, no baseline)")
    ap.add_argument("--out", default=str(RESULTS_DIR / "bench_stream_layout.json"))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(run_child(json.loads(args.child), True)))
        return 0
    if args.in_process and args.baseline:
        ap.error("--baseline needs child processes (each imports its own packfmt); leave out --in-process")
    if "packfmt" not in sys.modules:
        sys.path.insert(0, str(ROOT))  # the build uses this checkout's writer
    from packfmt.collection.shards import parse_size

    shard_bytes = parse_size(args.shard_bytes)
    codes = {"this": str(ROOT)}
    if args.baseline:
        base = Path(args.baseline).resolve()
        if not (base / "packfmt" / "__init__.py").is_file():
            ap.error(f"--baseline {args.baseline}: expected a code tree with packfmt/__init__.py, found none")
        codes[base.name if base.name != "this" else "baseline"] = str(base)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    plan = [("ready", None)] + [(st, b) for st in STAGES[1:] for b in args.balance]
    rows, built = [], []
    with tempfile.TemporaryDirectory(prefix="bench_stream_layout_", dir=os.environ.get("BENCH_TMP")) as tmp:
        for n_docs in args.docs:
            root = Path(tmp) / f"d{n_docs}"
            summary = build(root, n_docs, args.members, args.capacity, shard_bytes)
            built.append(summary)
            b = summary["bytes"]
            limit = max(b["shards"] // 10, 2 * b["largest_shard"])
            summary["cache_limit"] = limit
            for i, (stage, balance) in enumerate(plan):
                order = list(codes) if i % 2 == 0 else list(codes)[::-1]  # ABBA: neither checkout always first
                for code in order:
                    spec = {"code": code, "stage": stage, "balance": balance, "root": str(root / "layout"),
                            "work": str(Path(tmp) / "work"), "limit": limit, "batch": args.batch,
                            "repeat": args.repeat}
                    if args.in_process:
                        row = run_child(spec, False)
                    else:
                        row = bso.spawn_stage(spec, __file__, dict(env, PYTHONPATH=codes[code]))
                    index_mb = row["fetched_by_folder_mb"].get("packs", 0.0)
                    row.update(documents=n_docs, index_mb=b["pack_index"] / 2**20, index_fetched_mb=index_mb,
                               of_index=index_mb * 2**20 / b["pack_index"])
                    rows.append(row)
                    print(f"  {n_docs:,} docs, code={code:10s} {stage:11s} {row['balance']:6s} {row['seconds']:8.3f} s "
                          f"fetched {row['fetched_mb']:8.1f} MB" + (f"  peak {row['peak_rss_mb']:7.1f} MB "
                          f"(+{row['added_rss_mb']:.1f})" if "peak_rss_mb" in row else ""), flush=True)
            shutil.rmtree(root)
    if args.in_process:
        bso.Counter.uninstall()
    for row in rows:
        this = next(r for r in rows if r["code"] == "this" and r["documents"] == row["documents"]
                    and r["stage"] == row["stage"] and r["balance"] == row["balance"])
        row["vs_this"] = row["seconds"] / this["seconds"] if this["seconds"] else float("nan")
    codes_order = list(codes)
    shown = sorted(rows, key=lambda r: (r["documents"], STAGES.index(r["stage"]), r["balance"],
                                        codes_order.index(r["code"])))  # rows in run order (ABBA) in the JSON
    cols = ["documents", "code", "stage", "balance", "seconds", "vs_this", "fetched_mb", "index_fetched_mb", "of_index",
            "read_mb",
            "requests", "peak_rss_mb", "added_rss_mb"]
    print_table(shown, cols, title=f"pack-ordered layout (write_shards, shard_bytes {shard_bytes:,}), ffd capacity "
                f"{args.capacity}, streamed from memory:// (best of {args.repeat}, cold cache each); window={WINDOW}, "
                f"first batch = the sampler's first {args.batch} pack(s)")
    for row in shown:
        if row["stage"] == "first batch":
            by = ", ".join(f"{k} {v:.2f}" for k, v in row["fetched_by_folder_mb"].items())
            print(f"  {row['documents']:,} docs, code={row['code']}, balance={row['balance']}: before the first batch "
                  f"{row['index_fetched_mb']:.3f} MB of the index = {row['of_index']:.4f} of its {row['index_mb']:.2f} "
                  f"MB (all fetched: {row['fetched_mb']:.2f} MB: {by})")
    write_json(args.out, {"rows": rows, "collections": built, "url": URL, "codes": codes, "machine": machine_info(),
                          "args": {k: v for k, v in vars(args).items() if k != "child"}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
