"""Cost of the open-time structural checks (packfmt/checks.py) beside opening without them.

A store of N short documents (1-8 tokens) and a pack index of N segments (every document whole,
64 per pack) is written once; then, from a warm page cache, each row times in-process:

* ``Store`` open: manifest, sizes, memmaps, and V13 over ``doc_offsets`` (baseline: the same with
  the checks replaced by no-ops, i.e. what the reader did before it checked);
* ``PackIndex`` open: memmaps and V25 / V27 / V29 over ``pack_offsets`` and ``segments``;
* ``PackedDataset(...)`` construction, which opens both;
* ``packfmt validate`` (structural: the same checks) as a whole process, beside ``packfmt --version``.

Best of ``--repeat`` runs. ``python benchmarks/bench_open.py [--docs 10000000] [--repeat 3]``
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS_DIR, best_of, machine_info, print_table, write_json  # noqa: E402

from packfmt import checks  # noqa: E402
from packfmt.index import PackIndex
from packfmt.reader import Store  # noqa: E402
from packfmt.torch import PackedDataset  # noqa: E402
from packfmt.torch.testing import write_flat_dataset, write_pack_index  # noqa: E402

PER_PACK = 64


def make(root: Path, n_docs: int) -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 9, n_docs)
    offsets = np.zeros(n_docs + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    write_flat_dataset(root, rng.integers(0, 50_000, int(offsets[-1]), dtype=np.uint16), offsets, vocab_size=50_000)
    segments = np.stack([np.arange(n_docs), np.zeros(n_docs, dtype=np.int64), lengths], axis=1)
    pack_offsets = np.append(np.arange(0, n_docs, PER_PACK), n_docs)
    write_pack_index(root, segments, pack_offsets, capacity=PER_PACK * 8, name="p")


@contextmanager
def checks_disabled():
    saved = {name: getattr(checks, name) for name in ("offsets", "image_spans", "segments", "packs")}
    checks.offsets = checks.image_spans = lambda *a, **k: []
    checks.segments = lambda segs, off, po, **k: ([], np.zeros(po.shape[0] - 1, dtype=np.int64))
    checks.packs = lambda lengths, cap, total, **k: []
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(checks, name, fn)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=10_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_open_") as tmp:
        root = Path(tmp) / "ds"
        t0 = time.perf_counter()
        make(root, args.docs)
        print(f"wrote {args.docs:,} documents and segments in {time.perf_counter() - t0:.1f} s", flush=True)
        store = Store(root)
        cases = {
            "Store(path)": lambda: Store(root),
            "PackIndex(store, name)": lambda: PackIndex(store, "p"),
            "PackedDataset(path, name)": lambda: PackedDataset(root, "p"),
        }
        rows = []
        for case, fn in cases.items():
            checked = best_of(fn, args.repeat)
            with checks_disabled():
                unchecked = best_of(fn, args.repeat)
            rows.append({"case": case, "documents": args.docs, "segments": args.docs, "checked_s": checked,
                         "unchecked_s": unchecked, "checks_s": checked - unchecked,
                         "checks_ns_per_segment": (checked - unchecked) / args.docs * 1e9})
        # the structural validate (which runs the same checks) as a whole process, interpreter start included
        cli = [sys.executable, "-c", "import sys; from packfmt.cli import main; sys.exit(main(sys.argv[1:]))"]
        whole = best_of(lambda: subprocess.run([*cli, "validate", str(root)], check=True, capture_output=True), args.repeat)
        bare = best_of(lambda: subprocess.run([*cli, "--version"], check=True, capture_output=True), args.repeat)
        rows.append({"case": "packfmt validate (whole process)", "documents": args.docs, "segments": args.docs,
                     "checked_s": whole, "unchecked_s": bare, "checks_s": whole - bare,
                     "checks_ns_per_segment": (whole - bare) / args.docs * 1e9})
    cols = ["case", "documents", "checked_s", "unchecked_s", "checks_s", "checks_ns_per_segment"]
    print_table(rows, cols, title=f"Open-time checks, {args.docs:,} documents / segments (best of {args.repeat})")
    write_json(RESULTS_DIR / "bench_open.json", {"rows": rows, "machine": machine_info(), "args": vars(args)})


if __name__ == "__main__":
    main()
