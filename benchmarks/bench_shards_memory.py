"""Peak heap of ``write_shards`` (``packfmt pack --shards``) per segment of the source index.

``write_shards`` holds whole per-segment arrays (segments, starts, lengths, lookahead, bytes) while it
cuts and writes the shards. For each ``--segments`` count: a flat store of that many short documents
(1-7 tokens, uint16, no loss mask), one next-fit index of capacity 256 (documents cut at pack
boundaries: a few more segments than documents), then ``write_shards`` with tracemalloc on (numpy's
allocations are traced; memory-mapped files are not). Baseline, side by side: the index's own
``segments.bin`` as one int64 array in memory (24 B per segment), what any reader of the whole
index holds.

    python benchmarks/bench_shards_memory.py [--segments 1000000,3000000] [--shard-size 1MiB]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS_DIR, machine_info, print_table, write_json  # noqa: E402

import packfmt  # noqa: E402
from packfmt.collection.shards import parse_size, write_shards  # noqa: E402
from packfmt.torch.testing import next_fit_segments, write_flat_dataset, write_pack_index  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--segments", default="1000000,3000000",
                    type=lambda t: [int(float(x)) for x in t.split(",")], help="documents of each source (comma list)")
    ap.add_argument("--shard-size", default="1MiB")
    args = ap.parse_args()
    rows = []
    for n in args.segments:
        with tempfile.TemporaryDirectory(prefix="bench_shards_mem_") as tmp:
            tmp = Path(tmp)
            rng = np.random.default_rng(0)
            lengths = rng.integers(1, 8, n).astype(np.int64)
            offsets = np.concatenate([[0], np.cumsum(lengths)])
            store = write_flat_dataset(tmp / "src", rng.integers(0, 50_000, int(offsets[-1]), dtype=np.uint16),
                                       offsets, vocab_size=50_000)
            segs, po = next_fit_segments(lengths, 256)
            write_pack_index(store, segs, po, capacity=256, name="p")
            del segs, po, lengths, offsets, store
            src = packfmt.open(tmp / "src")
            segments = int(np.asarray(src.pack_index("p").segments).shape[0])
            tracemalloc.start()
            t0 = time.perf_counter()
            whole = np.array(src.pack_index("p").segments, dtype=np.int64)  # the baseline: the index in memory
            base_peak = tracemalloc.get_traced_memory()[1]
            del whole
            tracemalloc.stop()
            tracemalloc.start()
            t0 = time.perf_counter()
            out = write_shards(src, "p", tmp / "shards", shard_bytes=parse_size(args.shard_size))
            seconds = time.perf_counter() - t0
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            rows.append({"segments": segments, "case": "segments.bin in memory (baseline)", "peak_MB": base_peak / 1e6,
                         "bytes_per_segment": base_peak / segments, "vs_baseline": 1.0})
            rows.append({"segments": segments, "case": f"write_shards, {len(out.members)} shards",
                         "peak_MB": peak / 1e6, "bytes_per_segment": peak / segments,
                         "vs_baseline": peak / base_peak, "seconds": seconds})
    print_table(rows, ["segments", "case", "peak_MB", "bytes_per_segment", "vs_baseline", "seconds"],
                title=f"peak traced heap (tracemalloc), shard size {args.shard_size}")
    write_json(RESULTS_DIR / "bench_shards_memory.json", {"rows": rows, "machine": machine_info(), "args": vars(args)})


if __name__ == "__main__":
    main()
