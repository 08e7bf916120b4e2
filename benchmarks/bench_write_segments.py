"""Writing ``segments.bin`` (24 bytes per segment, in pack order): O_DIRECT against the page cache.

``build_pack_index`` writes the rows of ``segments.bin`` in chunks from aligned buffers with
``O_DIRECT`` (``HashedFile(direct=True)``); ``write_segments(..., direct=False)`` writes the same
bytes through the page cache. Both are timed in one process on one packing, alternating run by
run (so both see the same load), each including its fsync: the file is on disk when it returns.

    python benchmarks/bench_write_segments.py                 # N = 10^7 and 10^8 documents
    python benchmarks/bench_write_segments.py --n 1e6 --repeats 2 --quick

The store is bench_pack_e2e's (N documents of 1..15 tokens, capacity 4096, ffd). Columns: best
and median seconds of ``--repeats`` runs, GB/s of the file at the best, and buffered over direct.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_pack_e2e import ALGORITHM, CAPACITY, make_store  # noqa: E402
from common import RESULTS_DIR, machine_info, print_table, write_json  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=float, action="append", help="documents (repeatable; default 1e7 and 1e8)")
    ap.add_argument("--repeats", type=int, default=4, help="runs of each way (default 4)")
    ap.add_argument("--data-dir", help="keep the generated stores here and reuse them (default: a temp dir)")
    ap.add_argument("--quick", action="store_true", help="do not write the JSON (smoke runs)")
    ap.add_argument("--out", default=str(RESULTS_DIR / "bench_write_segments.json"), help="JSON output path")
    args = ap.parse_args(argv)

    from packfmt._resident import narrow_lengths
    from packfmt.index_writer import write_segments
    from packfmt.opening import open_dataset
    from packfmt.packing import pack_items, segment_documents

    sizes = [int(x) for x in args.n] if args.n else [10**7, 10**8]
    tmp = tempfile.mkdtemp(prefix="bench_write_segments_")
    data_dir = Path(args.data_dir or tmp)
    rows = []
    try:
        for n in sizes:
            ds = data_dir / f"short-{n}"
            if not (ds / "manifest.json").exists():
                make_store(ds, n)
            store = open_dataset(ds)
            seg = segment_documents(narrow_lengths(store.doc_offsets), CAPACITY)
            result = pack_items(seg.lengths, CAPACITY, ALGORITHM, compact=True)
            target = Path(tmp) / "segments.bin"
            walls: dict[str, list[float]] = {"direct": [], "buffered": []}
            sums = {}
            for _ in range(args.repeats):
                for way in walls:
                    t0 = time.perf_counter()
                    entry, _ = write_segments(target, seg, result, direct=way == "direct")
                    walls[way].append(time.perf_counter() - t0)
                    sums[way] = entry
                    target.unlink()
            assert sums["direct"] == sums["buffered"], sums  # the same bytes either way
            for way, found in walls.items():
                rows.append({"n_docs": n, "write": way, "best_s": min(found), "median_s": statistics.median(found),
                             "GB_per_s": sums[way]["bytes"] / min(found) / 1e9,
                             "x_direct": min(found) / min(walls["direct"]), "all_s": sorted(found),
                             "bytes": sums[way]["bytes"], "load_average": os.getloadavg()[0]})
                print(f"  n={n:>11,d} {way:8s} best {min(found):6.2f} s  all {', '.join(f'{w:.2f}' for w in found)}",
                      flush=True)
    finally:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    print()
    print_table(rows, ["n_docs", "write", "best_s", "median_s", "GB_per_s", "x_direct", "load_average"],
                title="segments.bin: O_DIRECT from aligned buffers against the page cache (each with its fsync)")
    if not args.quick:
        write_json(args.out, {"rows": rows, "machine": machine_info(), "setup": {
            "capacity": CAPACITY, "algorithm": ALGORITHM, "doc_lengths": "uniform 1..15",
            "command": "python benchmarks/bench_write_segments.py"}})
        print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
