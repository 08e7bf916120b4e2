"""``validate`` speed: structural time, deep time and throughput vs raw hashing of the same bytes.

The deep pass hashes every file (xxh3_64) and scans tokens, loss mask and pack segments; its
floor is the raw xxh3_64 speed over the same files (``packfmt._io.checksum_file``); sha256 is
shown for reference. All reads come from a warm page cache (the dataset was just written).

    python benchmarks/bench_validate.py           # ~1.5 GB dataset (uint32 tokens + loss mask + pack index)
    python benchmarks/bench_validate.py --quick   # ~100 MB
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS_DIR, best_of, machine_info, print_table, write_json  # noqa: E402

import packfmt  # noqa: E402
from packfmt._io import CHUNK_BYTES, checksum_file  # noqa: E402
from packfmt.packindex import build_pack_index  # noqa: E402
from packfmt.validate import validate  # noqa: E402


def make_dataset(root: Path, target_bytes: int, seed: int = 0) -> None:
    """uint32 tokens (vocab 100k) + loss mask, lognormal lengths, until ~target_bytes; one pack index."""
    rng = np.random.default_rng(seed)
    n_tokens = target_bytes // 5  # 4 bytes token + 1 byte mask
    pool = rng.integers(0, 100_000, (1 << 22) + 40_000, dtype=np.int64)
    mask_pool = rng.integers(0, 2, pool.size, dtype=np.uint8)
    written = 0
    with packfmt.DatasetWriter(root, vocab_size=100_000, loss_mask=True, tokenizer={"name": "bench", "hash": None}) as w:
        while written < n_tokens:
            lengths = np.clip(rng.lognormal(6.0, 1.0, 4096).astype(np.int64), 1, 32768)
            starts = rng.integers(0, pool.size - 32768, lengths.size)
            for s, n in zip(starts.tolist(), lengths.tolist()):
                w.add_document(pool[s:s + n], mask_pool[s:s + n])
            written += int(lengths.sum())
    build_pack_index(root, capacity=4096, algorithm="ffd", name="ffd-4096")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(CHUNK_BYTES)
        view = memoryview(buf)
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="~100 MB instead of ~1.5 GB")
    ap.add_argument("--repeats", type=int, default=3, help="best of N timings")
    args = ap.parse_args(argv)
    target = (100 << 20) if args.quick else (1536 << 20)
    with tempfile.TemporaryDirectory(prefix="bench_validate_") as tmp:
        root = Path(tmp) / "ds"
        t0 = time.perf_counter()
        make_dataset(root, target)
        write_s = time.perf_counter() - t0
        files = sorted(p for p in root.rglob("*.bin"))
        total = sum(p.stat().st_size for p in files)
        store = packfmt.open(root)
        report = validate(root, deep=True)  # also warms the page cache
        assert report.ok, report.format()
        cases = [
            ("validate (structural)", lambda: validate(root)),
            ("validate --deep", lambda: validate(root, deep=True)),
            ("raw xxh3_64 of all files", lambda: [checksum_file(p) for p in files]),
            ("raw sha256 of all files", lambda: [sha256_file(p) for p in files]),
        ]
        rows = []
        for name, fn in cases:
            seconds = best_of(fn, args.repeats if "sha256" not in name else 1)
            rows.append({"case": name, "seconds": seconds, "GB_per_s": total / seconds / 1e9})
        deep = rows[1]["seconds"]
        for row in rows:
            row["vs_deep"] = deep / row["seconds"]
    title = (f"validate on {total / 1e9:.2f} GB ({store.num_documents:,} documents, {store.num_tokens:,} uint32 tokens, "
             f"loss mask, 1 pack index); warm page cache; vs_deep = deep time / case time")
    print_table(rows, ["case", "seconds", "GB_per_s", "vs_deep"], title=title)
    out = write_json(RESULTS_DIR / "bench_validate.json", {
        "benchmark": "bench_validate", "quick": args.quick, "bytes": total, "documents": store.num_documents,
        "tokens": store.num_tokens, "write_seconds": write_s, "rows": rows, "machine": machine_info()})
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
