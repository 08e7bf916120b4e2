"""Reader throughput over a collection of M members against the same documents as one store.

The documents (lognormal lengths, uint16 ids) are written once as one store and once split into
M member stores gathered by a collection; both get the same pack index (next-fit, capacity 4096,
shuffled document order, so consecutive segments come from different members). Each row reads
every pack in batches of 8 through ``PackedDataset.__getitems__`` + ``collate_varlen`` in this
process (warm page cache; best of ``--repeat`` runs, the cases interleaved), and reports tokens/s, the ratio to one store
and ``first_batch_s`` (from ``PackedDataset(...)`` to pack 0 read: open, and every member mapped or only pack 0's).
The collection is read twice: every member mapped at the first batch (the default up to ``lazy_members.MAP_BUDGET``
mappings), and its members mapped as batches need them (``collection.lazy_members``, past it).

With ``--mixed`` every store has a loss mask except every other member, which has none (a
collection 1.2 that unifies text with chat, COLLECTION.md §2.3): the kernels then read ones for those
members' tokens; the baseline store holds the same mask with ones written out.

    python benchmarks/bench_collection_read.py [--docs 200000] [--members 100] [--repeat 3] [--mixed]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS_DIR, machine_info, print_table, web_like_corpus, write_json  # noqa: E402

from packfmt.collection import lazy_members as L  # noqa: E402
from packfmt.collection import write_collection  # noqa: E402
from packfmt.torch import PackedDataset, collate_varlen  # noqa: E402
from packfmt.torch.testing import next_fit_segments, write_flat_dataset, write_pack_index  # noqa: E402

CAPACITY, BATCH = 4096, 8
DEFAULT_BUDGET, DEFAULT_EAGER = L.MAP_BUDGET, L.EAGER_MOST


def make(root: Path, n_docs: int, members: int, mixed: bool = False) -> tuple[Path, Path]:
    rng, lengths, offsets, tokens = web_like_corpus(n_docs)
    cuts = np.linspace(0, n_docs, members + 1).astype(np.int64)
    mask = None
    if mixed:  # chat-like masks on even members, none (all trained) on odd ones
        mask = rng.integers(0, 2, int(offsets[-1]), dtype=np.uint8)
        for m in range(1, members, 2):
            mask[offsets[cuts[m]]:offsets[cuts[m + 1]]] = 1
    single = write_flat_dataset(root / "single", tokens, offsets, vocab_size=50_000, loss_mask=mask)
    paths = []
    for m in range(members):
        a, b = cuts[m], cuts[m + 1]
        paths.append(root / f"m{m:05d}")
        own = None if mask is None or m % 2 else mask[offsets[a]:offsets[b]]
        write_flat_dataset(paths[-1], tokens[offsets[a]:offsets[b]], offsets[a:b + 1] - offsets[a], vocab_size=50_000,
                           loss_mask=own)
    coll = write_collection(root / "coll", [(None, p) for p in paths])
    segs, po = next_fit_segments(lengths, CAPACITY, order=rng.permutation(n_docs))
    write_pack_index(single, segs, po, capacity=CAPACITY, name="p")
    write_pack_index(coll, segs, po, capacity=CAPACITY, name="p")
    return single.path, coll.path


def read_all(path: Path, lazy: bool = False) -> tuple[float, int, float]:
    """(seconds reading every pack after the first batch, tokens, seconds to the first batch: open, map, pack 0).
    ``lazy``: the members mapped as batches need them (``collection.lazy_members``, as past ``MAP_BUDGET``)."""
    L.MAP_BUDGET = 0 if lazy else DEFAULT_BUDGET
    L.EAGER_MOST = 0 if lazy else 1 << 62  # (eager: every member at the first batch, whatever the count)
    try:
        t0 = time.perf_counter()
        ds = PackedDataset(path, "p")
        ds.__getitems__([0])  # open, map (every member, or pack 0's) outside the read timing
        first = time.perf_counter() - t0
    finally:
        L.MAP_BUDGET, L.EAGER_MOST = DEFAULT_BUDGET, DEFAULT_EAGER
    t0 = time.perf_counter()
    tokens = 0
    for start in range(0, len(ds), BATCH):
        batch = collate_varlen(ds.__getitems__(list(range(start, min(start + BATCH, len(ds))))))
        tokens += int(batch["input_ids"].shape[-1])
    return time.perf_counter() - t0, tokens, first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=200_000)
    ap.add_argument("--members", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--mixed", action="store_true", help="every other member without a loss mask")
    ap.add_argument("--out", default=None, help="file name under benchmarks/results/")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_coll_") as tmp:
        single, coll = make(Path(tmp), args.docs, args.members, args.mixed)
        kind = " (every other member without a mask)" if args.mixed else ""
        cases = (("one store", single, False), (f"collection of {args.members}{kind}", coll, False),
                 (f"collection of {args.members}{kind}, mapped as batches need them", coll, True))
        read_all(single)  # numba compiled before any timing
        best = {case: (float("inf"), 0) for case, _, _ in cases}
        first = {case: float("inf") for case, _, _ in cases}
        for _ in range(args.repeat):  # interleaved, so that a change of machine load hits every case alike
            for case, path, lazy in cases:
                seconds, tokens, to_first = read_all(path, lazy)
                best[case] = min(best[case], (seconds, tokens))
                first[case] = min(first[case], to_first)
        rows = [{"case": case, "documents": args.docs, "tokens": tokens, "seconds": seconds,
                 "tokens_per_s": tokens / seconds, "first_batch_s": first[case]}
                for case, (seconds, tokens) in best.items()]
    for row in rows:
        row["vs_one_store"] = row["tokens_per_s"] / rows[0]["tokens_per_s"]
    print_table(rows, ["case", "documents", "tokens", "seconds", "tokens_per_s", "vs_one_store", "first_batch_s"],
                title=f"PackedDataset batches of {BATCH} packs (capacity {CAPACITY}), best of {args.repeat}")
    write_json(RESULTS_DIR / (args.out or f"bench_collection_read{'_mixed' if args.mixed else ''}.json"),
               {"rows": rows, "machine": machine_info(), "args": vars(args)})


if __name__ == "__main__":
    main()
