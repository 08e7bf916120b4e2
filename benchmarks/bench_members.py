"""Per-member cost of a collection: open / pack / validate (structural) of one store against the same
documents split into 10^3 and 10^4 tiny members (10^5 with ``--full``), side by side in one run.

Each case runs in this process (warm page cache, imports and numba compiled before any timing):
``packfmt.open`` + ``doc_lengths`` (what every command needs of a dataset), ``build_pack_index``
(ffd, capacity 256) and ``packfmt.validate`` (structural). Best of ``--repeat``; ratios are to the
one store. Members are written by ``packfmt.torch.testing.write_split_stores`` (2 documents each).

    python benchmarks/bench_members.py [--docs-per-member 2] [--repeat 2] [--full]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS_DIR, best_of, machine_info, print_table, write_json  # noqa: E402

import packfmt  # noqa: E402
from packfmt.collection import write_collection  # noqa: E402
from packfmt.packindex import build_pack_index  # noqa: E402
from packfmt.torch.testing import write_flat_dataset, write_split_stores  # noqa: E402
from packfmt.validate import validate  # noqa: E402

CAPACITY = 256


def make(root: Path, members: int, per_member: int) -> tuple[Path, Path]:
    """One store and a collection of ``members`` members holding the same documents."""
    rng = np.random.default_rng(0)
    n_docs = members * per_member
    lengths = rng.integers(1, 50, n_docs).astype(np.int64)
    offsets = np.zeros(n_docs + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tokens = rng.integers(0, 50_000, int(offsets[-1]), dtype=np.uint16)
    write_flat_dataset(root / "single", tokens, offsets, vocab_size=50_000)
    paths = write_split_stores(root / "stores", tokens, offsets, np.arange(0, n_docs + 1, per_member), vocab_size=50_000)
    write_collection(root / "coll", [(None, p) for p in paths])
    return root / "single", root / "coll"


def measure(path: Path, repeat: int) -> dict:
    def open_():
        packfmt.open(path).doc_lengths

    def pack():
        build_pack_index(path, capacity=CAPACITY, algorithm="ffd", name="b", overwrite=True)

    def check():
        report = validate(path)
        assert report.ok, report.problems[:3]

    return {"open_s": best_of(open_, repeat), "pack_s": best_of(pack, repeat), "validate_s": best_of(check, repeat)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs-per-member", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--full", action="store_true", help="also 10^5 members")
    args = ap.parse_args()
    sizes = [1_000, 10_000] + ([100_000] if args.full else [])
    rows = []
    for members in sizes:
        root = Path(tempfile.mkdtemp(prefix="bench_members_"))
        try:
            t0 = time.perf_counter()
            single, coll = make(root, members, args.docs_per_member)
            built = time.perf_counter() - t0
            if not rows:
                measure(single, 1)  # imports, numba compilation
            one, many = measure(single, args.repeat), measure(coll, args.repeat)
            row = {"members": members, "documents": members * args.docs_per_member, "build_s": round(built, 2)}
            for key in ("open_s", "pack_s", "validate_s"):
                row[f"store_{key}"] = round(one[key], 3)
                row[f"coll_{key}"] = round(many[key], 3)
                row[f"{key[:-2]}_ratio"] = round(many[key] / one[key], 2)
            rows.append(row)
            print(row, flush=True)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    print_table(rows, ["members", "documents", "store_open_s", "coll_open_s", "open_ratio", "store_pack_s",
                       "coll_pack_s", "pack_ratio", "store_validate_s", "coll_validate_s", "validate_ratio"])
    write_json(RESULTS_DIR / "bench_members.json", {"machine": machine_info(), "args": vars(args), "rows": rows})


if __name__ == "__main__":
    main()
