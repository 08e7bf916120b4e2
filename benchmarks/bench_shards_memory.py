"""Peak heap of ``write_shards`` (``packfmt pack --shards``) per segment of the source index, before and after
it streamed the index.

Before: the writer held whole per-segment arrays (segments, starts, lengths, lookahead, bytes) while it cut
and wrote the shards; it is kept as the tests' oracle (``tests/shards_reference.py``) and run here as
"before". After: ``write_shards`` reads the index ``CHUNK_SEGMENTS`` rows at a time, so its peak should not
grow with the index. For each ``--segments`` count: a flat store of that many short documents (1-7 tokens,
uint16, no loss mask), one next-fit index of capacity 256 (documents cut at pack boundaries: a few more
segments than documents), then each writer with tracemalloc on (numpy's allocations are traced;
memory-mapped files are not), and their outputs compared file for file (``identical``: every file but the
index's ``stats.seconds``). Baseline: the index's own ``segments.bin`` as one int64 array in memory (24 B
per segment), what any reader of the whole index holds.

``--members M``: the source is a collection of M members and its index packs documents in a random
order, so every chunk reads many members (the collection keeps 64 open: each is opened once per chunk).

    python benchmarks/bench_shards_memory.py [--segments 1e6,1e7] [--shard-size 1MiB] [--members 1] [--no-before]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from common import RESULTS_DIR, machine_info, print_table, write_json  # noqa: E402
from shards_reference import reference_write_shards  # noqa: E402

import packfmt  # noqa: E402
from packfmt.collection import shards, write_collection  # noqa: E402
from packfmt.collection.shards import parse_size, write_shards  # noqa: E402
from packfmt.torch.testing import (  # noqa: E402
    next_fit_segments,
    write_flat_dataset,
    write_pack_index,
    write_split_stores,
)


def traced(fn):
    """``(result, peak traced bytes, seconds)`` of ``fn()``."""
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        result = fn()
        return result, tracemalloc.get_traced_memory()[1], time.perf_counter() - t0
    finally:
        tracemalloc.stop()


def same_files(got: Path, want: Path) -> bool:
    """Every file byte for byte, but ``stats.seconds`` of an index's ``index.json``."""
    files = sorted(p.relative_to(want) for p in want.rglob("*") if p.is_file())
    if sorted(p.relative_to(got) for p in got.rglob("*") if p.is_file()) != files:
        return False
    for name in files:
        a, b = (got / name).read_bytes(), (want / name).read_bytes()
        if name.name == "index.json":
            a, b = json.loads(a), json.loads(b)
            a["stats"].pop("seconds"), b["stats"].pop("seconds")
        if a != b:
            return False
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--segments", default="1000000,10000000",
                    type=lambda t: [int(float(x)) for x in t.split(",")], help="documents of each source (comma list)")
    ap.add_argument("--shard-size", default="1MiB")
    ap.add_argument("--members", type=int, default=1,
                    help="1: one store packed in order; M > 1: a collection of M members packed in a random order")
    ap.add_argument("--no-before", action="store_true", help="skip the pre-streaming writer")
    args = ap.parse_args()
    rows, side = [], []
    for n in args.segments:
        with tempfile.TemporaryDirectory(prefix="bench_shards_mem_") as tmp:
            tmp = Path(tmp)
            rng = np.random.default_rng(0)
            lengths = rng.integers(1, 8, n).astype(np.int64)
            offsets = np.concatenate([[0], np.cumsum(lengths)])
            tokens = rng.integers(0, 50_000, int(offsets[-1]), dtype=np.uint16)
            if args.members == 1:  # one store, packed in document order
                store = write_flat_dataset(tmp / "src", tokens, offsets, vocab_size=50_000)
                segs, po = next_fit_segments(lengths, 256)
            else:  # a collection of equal members, packed globally in a random order (every pack mixes members)
                cuts = np.linspace(0, n, args.members + 1).astype(np.int64)
                paths = write_split_stores(tmp / "stores", tokens, offsets, cuts, vocab_size=50_000)
                store = write_collection(tmp / "src", [(None, p) for p in paths])
                segs, po = next_fit_segments(lengths, 256, order=rng.permutation(n))
            write_pack_index(store, segs, po, capacity=256, name="p")
            del segs, po, lengths, offsets, store, tokens
            src = packfmt.open(tmp / "src")
            segments = int(np.asarray(src.pack_index("p").segments).shape[0])
            _, base_peak, _ = traced(lambda: np.array(src.pack_index("p").segments, dtype=np.int64))
            size = parse_size(args.shard_size)
            out, peak, seconds = traced(lambda: write_shards(src, "p", tmp / "after", shard_bytes=size))
            rows.append({"segments": segments, "case": "segments.bin in memory (baseline)", "peak_MB": base_peak / 1e6,
                         "bytes_per_segment": base_peak / segments, "vs_baseline": 1.0})
            pair = {"segments": segments, "shards": len(out.members), "after_B_per_segment": peak / segments,
                    "after_peak_MB": peak / 1e6, "after_seconds": seconds}
            if not args.no_before:
                _, old_peak, old_seconds = traced(
                    lambda: reference_write_shards(src, "p", tmp / "before", shard_bytes=size))
                rows.append({"segments": segments, "case": f"before: whole-index arrays, {len(out.members)} shards",
                             "peak_MB": old_peak / 1e6, "bytes_per_segment": old_peak / segments,
                             "vs_baseline": old_peak / base_peak, "seconds": old_seconds})
                pair.update(before_B_per_segment=old_peak / segments, before_peak_MB=old_peak / 1e6,
                            before_seconds=old_seconds, identical=same_files(tmp / "after", tmp / "before"))
            rows.append({"segments": segments, "case": f"after: streamed, {len(out.members)} shards",
                         "peak_MB": peak / 1e6, "bytes_per_segment": peak / segments,
                         "vs_baseline": peak / base_peak, "seconds": seconds})
            side.append(pair)
    print_table(rows, ["segments", "case", "peak_MB", "bytes_per_segment", "vs_baseline", "seconds"],
                title=f"peak traced heap (tracemalloc), shard size {args.shard_size}, {args.members} member(s)")
    print_table(side, ["segments", "before_B_per_segment", "after_B_per_segment", "before_peak_MB", "after_peak_MB",
                       "before_seconds", "after_seconds", "identical"],
                title=f"write_shards before / after streaming (CHUNK_SEGMENTS {shards.CHUNK_SEGMENTS}, "
                      f"CHUNK_TOKENS {shards.CHUNK_TOKENS})")
    name = "bench_shards_memory" + ("" if args.members == 1 else f"_members{args.members}")
    write_json(RESULTS_DIR / f"{name}.json", {"rows": rows, "side_by_side": side,
                                                         "machine": machine_info(), "args": vars(args)})


if __name__ == "__main__":
    main()
