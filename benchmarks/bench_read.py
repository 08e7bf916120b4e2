"""Random-access document reads: ``Store.document(i)`` vs plain ``np.memmap`` slicing.

A training reader fetches documents in random order and copies each into a contiguous buffer.
This compares doing that through packfmt's ``Store.document(i)`` (bounds check + zero-copy view)
with the floor: a bare ``np.memmap`` of ``tokens.bin`` sliced by offsets held in a numpy array.
Both read the same documents in the same order from a warm page cache.

    python benchmarks/bench_read.py            # 10^6 documents, lognormal lengths (~250 tokens mean)
    python benchmarks/bench_read.py --quick    # 10^5 documents
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS_DIR, machine_info, print_table, write_json  # noqa: E402

import packfmt  # noqa: E402
from packfmt import format as F  # noqa: E402


def make_dataset(root: Path, n_docs: int, vocab: int, seed: int = 0) -> None:
    """Lognormal document lengths (mu=5, sigma=1, clipped to [1, 32768]); random token ids."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(5.0, 1.0, n_docs).astype(np.int64), 1, 32768)
    pool = rng.integers(0, vocab, (1 << 22) + int(lengths.max()), dtype=np.int64)
    starts = rng.integers(0, pool.size - int(lengths.max()), n_docs)
    with packfmt.DatasetWriter(root, vocab_size=vocab, tokenizer={"name": "bench", "hash": None}) as w:
        for s, n in zip(starts.tolist(), lengths.tolist()):
            w.add_document(pool[s:s + n])


def bench_store(store: packfmt.Store, order: np.ndarray) -> tuple[float, int]:
    """Seconds and tokens for reading ``order`` through ``Store.document`` + a contiguous copy."""
    store.document(0)  # map the files outside the timed region
    t0 = time.perf_counter()
    tokens = 0
    for i in order.tolist():
        doc = np.array(store.document(i))  # the copy a training reader makes
        tokens += doc.shape[0]
    return time.perf_counter() - t0, tokens


def bench_memmap(path: Path, dtype: np.dtype, offsets: np.ndarray, order: np.ndarray) -> tuple[float, int]:
    """Same reads from a bare memmap with offsets in a numpy array (the floor)."""
    tokens_mm = np.memmap(path / F.TOKENS, dtype=dtype, mode="r")
    t0 = time.perf_counter()
    tokens = 0
    for i in order.tolist():
        doc = np.array(tokens_mm[offsets[i]:offsets[i + 1]])
        tokens += doc.shape[0]
    return time.perf_counter() - t0, tokens


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="10^5 documents instead of 10^6")
    ap.add_argument("--reads", type=int, default=None, help="random reads per case (default 200k, quick 50k)")
    ap.add_argument("--repeats", type=int, default=5, help="best of N timings per case")
    args = ap.parse_args(argv)
    n_docs = 100_000 if args.quick else 1_000_000
    n_reads = args.reads or (50_000 if args.quick else 200_000)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_read_") as tmp:
        for vocab in (32_000, 128_000):
            root = Path(tmp) / f"ds-{vocab}"
            t0 = time.perf_counter()
            make_dataset(root, n_docs, vocab)
            write_s = time.perf_counter() - t0
            store = packfmt.open(root)
            offsets = np.array(store.doc_offsets)
            order = np.random.default_rng(1).integers(0, n_docs, n_reads)
            np.array(store.tokens).sum()  # warm the page cache for both cases
            results = {}
            for name, fn in (("Store.document", lambda: bench_store(store, order)),
                             ("np.memmap slice", lambda: bench_memmap(root, store.tokens.dtype, offsets, order))):
                best, toks = min(fn() for _ in range(args.repeats))
                results[name] = best
                rows.append({"case": name, "dtype": store.manifest.token_dtype, "documents": n_docs,
                             "reads": n_reads, "seconds": best, "docs_per_s": n_reads / best,
                             "tokens_per_s": toks / best, "write_s": write_s, "tokens": store.num_tokens})
            rows[-2]["ratio_vs_memmap"] = results["np.memmap slice"] / results["Store.document"]
            rows[-1]["ratio_vs_memmap"] = 1.0
    print_table(rows, ["case", "dtype", "documents", "tokens", "reads", "docs_per_s", "tokens_per_s", "ratio_vs_memmap"],
                title="random-access document reads (warm page cache; ratio = memmap time / case time, 1.0 = as fast)")
    out = write_json(RESULTS_DIR / "bench_read.json", {"benchmark": "bench_read", "quick": args.quick, "rows": rows,
                                                        "machine": machine_info()})
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
