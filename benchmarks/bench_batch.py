"""The reader's batch against a bare segment copy of the same tokens, at capacities 1024, 4096 and 8192.

The batch: ``PackedDataset.__getitems__`` of ``--batch`` packs then ``collate_varlen`` (what a ``DataLoader``
with ``num_workers=0`` calls): input_ids, labels, position_ids and doc_ids of the packs laid end to end, and
cu_seqlens (spec/READER.md). Two floors copy only the tokens, as int64, out of the store's ``tokens.bin``:

* ``bare``: the bare segment copy of ``bench_loader.py`` (its "np.memmap copy (baseline), gathered", the README's
  baseline): each pack's segment ranges copied out of an ``np.memmap`` into one int64 array, one
  ``np.concatenate`` and ``torch.from_numpy`` per batch. ``ratio`` is against it.
* ``compiled``: one compiled call per batch that sums the packs' segment lengths, allocates one int64 buffer and
  copies every segment into it (no Python per segment or pack): what no reader can beat; ``ratio_compiled``.

Both floors and the reader read the same packs, batch after batch, in one shuffled order, from a warm page cache.
Each capacity has its own ffd index over the same documents (``bench_loader.py``'s: lognormal lengths, mean ~665
tokens; at 1024 most packs hold one or two segments, so the bare copy's Python per segment costs little there). Each round times every batch of the order through the floor, then through the reader,
then the reader again, then the floor (ABBA, both floors), in CPU seconds of this process (``time.process_time``:
the other users of a shared machine do not count; one thread: ``torch.set_num_threads(1)``, numba's kernels run in
the caller's thread); a ratio is the floor's seconds over the reader's (1.0: as fast as the floor), the median of
``--rounds`` rounds with its spread. ``--profile`` prints what the reader's batch spends its time in (cProfile, at
the first capacity).

    python benchmarks/bench_batch.py [--capacities 1024,4096,8192] [--batch 8] [--rounds 9] [--docs 20000]
        [--profile] [--out benchmarks/results/bench_batch.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from numba import njit

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_loader import memmap_baseline  # noqa: E402
from common import RESULTS_DIR, machine_info, print_table, write_json  # noqa: E402

import packfmt  # noqa: E402
from packfmt.packindex import build_pack_index  # noqa: E402
from packfmt.torch import PackedDataset, collate_varlen  # noqa: E402
from packfmt.torch.testing import write_flat_dataset  # noqa: E402


@njit(nogil=True)
def bare_copy(tokens, doc_offsets, segments, pack_offsets, packs):
    """The segments of ``packs``, end to end, as one new int64 array (the floor of a batch)."""
    total = 0
    for b in range(packs.shape[0]):
        p = packs[b]
        for s in range(pack_offsets[p], pack_offsets[p + 1]):
            total += segments[s, 2] - segments[s, 1]
    out = np.empty(total, dtype=np.int64)
    q = 0
    for b in range(packs.shape[0]):
        p = packs[b]
        for s in range(pack_offsets[p], pack_offsets[p + 1]):
            g = doc_offsets[segments[s, 0]] + segments[s, 1]
            n = segments[s, 2] - segments[s, 1]
            src, dst = tokens[g:g + n], out[q:q + n]
            for j in range(n):
                dst[j] = src[j]
            q += n
    return out


def make(root: Path, docs: int, capacities: list[int], seed: int = 0) -> Path:
    """The documents of ``bench_loader.py`` (lognormal lengths, mu 6, sigma 1: mean ~665 tokens, at most 32,768),
    one ffd index per capacity."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(6.0, 1.0, docs).astype(np.int64), 1, 32_768)
    offsets = np.zeros(docs + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    write_flat_dataset(root / "ds", rng.integers(0, 32_000, int(offsets[-1]), dtype=np.uint16), offsets,
                       vocab_size=32_000)
    for cap in capacities:
        build_pack_index(root / "ds", capacity=cap, algorithm="ffd", name=f"ffd-{cap}")
    return root / "ds"


def runners(path: Path, cap: int, batch: int, seed: int = 0):
    """``({name: function}, batches, tokens)``: the reader and the two floors, each reading every batch of one
    shuffled order once."""
    ds = PackedDataset(path, f"ffd-{cap}")
    store, idx = packfmt.open(path), ds.index
    tokens, doc_offsets = np.asarray(store.tokens), np.asarray(store.doc_offsets)
    segments, pack_offsets = np.asarray(idx.segments), np.asarray(idx.pack_offsets)
    order = np.random.default_rng(seed).permutation(len(ds))
    plan = [order[a:a + batch] for a in range(0, order.shape[0] - batch + 1, batch)]
    lists = [p.tolist() for p in plan]  # what a DataLoader's sampler hands __getitems__

    def compiled():
        for p in plan:
            torch.from_numpy(bare_copy(tokens, doc_offsets, segments, pack_offsets, p))

    def reader():
        for p in lists:
            collate_varlen(ds.__getitems__(p))

    n = sum(int(collate_varlen(ds.__getitems__(p))["cu_seqlens"][-1]) for p in lists)
    assert n == sum(bare_copy(tokens, doc_offsets, segments, pack_offsets, p).shape[0] for p in plan)
    bare = memmap_baseline(store, f"ffd-{cap}", False, lists)
    return {"reader": reader, "bare": bare, "compiled": compiled}, len(plan), n


def cpu(fn) -> float:
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def measure(path: Path, cap: int, batch: int, rounds: int) -> dict:
    fns, batches, tokens = runners(path, cap, batch)
    for fn in fns.values():
        fn()  # warm: page cache, numba kernels loaded, arrays mapped
    secs: dict[str, list[float]] = {k: [] for k in fns}
    ratios: dict[str, list[float]] = {"bare": [], "compiled": []}
    for _ in range(rounds):
        for floor in ratios:  # ABBA: floor, reader, reader, floor
            a1, b1, b2, a2 = cpu(fns[floor]), cpu(fns["reader"]), cpu(fns["reader"]), cpu(fns[floor])
            ratios[floor].append((a1 + a2) / (b1 + b2))
            secs[floor].append((a1 + a2) / 2)
            secs["reader"].append((b1 + b2) / 2)
    row = {"capacity": cap, "batch": batch, "batches": batches, "tokens": tokens}
    for k, v in secs.items():
        row[f"{k}_us_per_batch"] = 1e6 * statistics.median(v) / batches
        row[f"{k}_Mtok_s"] = tokens / statistics.median(v) / 1e6
    for floor, rs in ratios.items():
        tag = "" if floor == "bare" else "_compiled"
        row.update({f"ratio{tag}": statistics.median(rs), f"ratio{tag}_min": min(rs), f"ratio{tag}_max": max(rs),
                    f"ratios{tag}": [round(r, 3) for r in rs]})
    return row


def profile(path: Path, cap: int, batch: int) -> None:
    import cProfile
    import pstats

    reader = runners(path, cap, batch)[0]["reader"]
    reader()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(5):
        reader()
    prof.disable()
    print(f"--- profile: __getitems__ + collate_varlen, capacity {cap}, 5 passes")
    pstats.Stats(prof).sort_stats("tottime").print_stats(14)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--capacities", default="1024,4096,8192")
    ap.add_argument("--batch", type=int, default=8, help="packs per batch (default 8)")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--docs", type=int, default=20_000, help="documents of the store (default 20,000: ~13 M tokens)")
    ap.add_argument("--profile", action="store_true", help="cProfile the reader's batches at the first capacity")
    ap.add_argument("--out", type=Path, default=RESULTS_DIR / "bench_batch.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    caps = [int(c) for c in args.capacities.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_batch_") as tmp:
        path = make(Path(tmp), args.docs, caps)
        if args.profile:
            profile(path, caps[0], args.batch)
        for cap in caps:
            rows.append(measure(path, cap, args.batch, args.rounds))
            print({k: v for k, v in rows[-1].items() if not k.startswith("ratios")}, flush=True)
    print_table(rows, ["capacity", "batch", "batches", "bare_us_per_batch", "compiled_us_per_batch",
                       "reader_us_per_batch", "reader_Mtok_s", "ratio", "ratio_min", "ratio_max", "ratio_compiled"],
                title="reader's batch (__getitems__ + collate_varlen) against the bare segment copy (ratio) and a "
                      "compiled copy (ratio_compiled): floor CPU s / reader CPU s, median of ABBA rounds")
    write_json(args.out, {"machine": machine_info(), "load_average": os.getloadavg(), "packfmt": packfmt.__file__,
                          "args": vars(args), "rows": rows})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
