"""``packfmt inspect`` of a collection: its members (per member and whole) and its pack indexes.

The whole-collection numbers reuse ``packfmt.summary`` (length statistics, padding baselines,
index summaries); this module adds the members table and, for an index packed with a mixture,
its weights, tokens per member and effective proportions (spec/COLLECTION.md §5).
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from operator import itemgetter
from typing import Any

import numpy as np

from .. import format as F
from .._resident import narrow
from .stats import segment_lengths_if_in_order, sort_within

__all__ = ["summarize_collection", "format_collection", "format_mixture", "member_length_stats", "SHOWN_MEMBERS"]

#: Member rows ``format_collection`` prints before it elides (the first ones and the last few; ``--json`` lists all).
SHOWN_MEMBERS = 30


def member_length_stats(lengths: np.ndarray, doc_start: np.ndarray) -> list[dict]:
    """``summary.length_stats`` of each member's documents (``lengths[doc_start[m]:doc_start[m + 1]]``), equal to it
    value for value, for all members from one pass (``stats.sort_within``): numpy's ``linear`` percentile, its
    virtual index and interpolation written out (``tests/test_inspect.py`` compares the two). ``lengths`` keeps
    its type (int32 when every length fits): one sorted copy of it (and one member's scratch), nothing wider."""
    from ..summary import PERCENTILES

    doc_start = np.asarray(doc_start, dtype=np.int64)
    counts = np.diff(doc_start)
    if not lengths.size:
        return [{"count": 0} for _ in range(counts.shape[0])]
    ordered, totals = sort_within(lengths, doc_start)
    last = lengths.size - 1
    start = np.minimum(doc_start[:-1], last)  # an empty member's: clamped, and never read below
    n = np.maximum(counts, 1)
    cols = {"total": totals, "min": ordered[start], "max": ordered[np.minimum(start + n - 1, last)]}
    for q in PERCENTILES:
        quantile = np.float64(q) / 100
        virtual = (n - 1) * quantile  # numpy's method="linear"
        below = np.floor(virtual)
        gamma = virtual - below
        lo = np.clip(below.astype(np.int64), 0, n - 1)
        a = ordered[np.minimum(start + lo, last)].astype(np.float64)
        b = ordered[np.minimum(start + np.minimum(lo + 1, n - 1), last)].astype(np.float64)
        diff = b - a
        cols[f"p{q}"] = np.where(gamma >= 0.5, b - diff * (1 - gamma), a + diff * gamma)
    del ordered
    # rows from Python lists of each column (one ``tolist`` each), not a numpy scalar per value
    count, total, low, high = counts.tolist(), cols["total"].tolist(), cols["min"].tolist(), cols["max"].tolist()
    mean = [t / c if c else 0.0 for t, c in zip(total, count)]  # int / int, as ``total / count`` of one member
    keys = [f"p{q}" for q in PERCENTILES]
    ps = [cols[k].tolist() for k in keys]
    if len(keys) == 3:  # PERCENTILES as it is: each row one dict display (about half the cost of dict(zip(...)))
        k0, k1, k2 = keys
        return [{"count": c, "total": t, "min": a, "mean": u, k0: x0, k1: x1, k2: x2, "max": b} if c else {"count": 0}
                for c, t, a, u, x0, x1, x2, b in zip(count, total, low, mean, *ps, high)]
    names = ("count", "total", "min", "mean", *keys, "max")
    return [dict(zip(names, row)) if row[0] else {"count": 0} for row in zip(count, total, low, mean, *ps, high)]


def sorted_within(lengths: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``lengths`` (``>= 0``, ``counts[m]`` documents of member ``m`` after another) sorted within each member, of
    ``lengths``' type: each member by its own radix sort (``stats.sort_within``), linear in the documents."""
    doc_start = np.zeros(counts.shape[0] + 1, dtype=np.int64)
    np.cumsum(counts, out=doc_start[1:])
    return sort_within(np.asarray(lengths), doc_start)[0]


@contextmanager
def _gc_paused():
    """The cyclic garbage collector off while the member rows are made, as it was after. 10^5 rows (a dict each,
    holding a dict: tracked) trigger full collections, each walking every object of the process (0.1 s of a 1 s
    ``packfmt inspect``); the rows hold no cycle, so there is nothing for one to free."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def summarize_collection(coll, *, progress: bool = False, batch_size: int = 8) -> dict:
    """Everything ``packfmt inspect`` prints for a collection, as a JSON-ready dict."""
    from ..summary import index_summary, length_stats, mask_fraction

    raw = coll.manifest.raw
    # opened first: each open's scan (V27) reads the lengths at random, then hands their pages back
    indexes = {name: coll.pack_index(name) for name in coll.pack_index_names()}
    lengths = narrow(coll.doc_lengths)  # int32 when every length fits (its pages handed back): 4 bytes a document
    total = coll.num_tokens
    with _gc_paused():  # two dicts a member, no cycle among them: nothing for the collector to find
        stats = member_length_stats(lengths, coll.doc_start)  # every member's at once (10^5 members: not 10^5 sorts)
        table = coll.members  # its columns (a list or array each), not a ``Member`` object per member
        members = [{"name": name, "path": path, "documents": docs, "tokens": toks, "images": imgs,
                    "share": toks / total if total else 0.0, "document_lengths": st}
                   for name, path, docs, toks, imgs, st in zip(table.names, table.paths, table.documents.tolist(),
                                                                table.tokens.tolist(), table.images.tolist(), stats)]
    out: dict[str, Any] = {
        "path": coll.location,
        "kind": "collection",
        "format_version": raw.get("format_version"),
        "producer": raw.get("producer"),
        "counts": {"members": len(coll.members), "documents": coll.num_documents, "tokens": total,
                   "images": coll.num_images},
        "token_dtype": coll.token_dtype,
        "vocab_size": coll.vocab_size,
        "tokenizer": dict(coll.manifest.shared["tokenizer"]),
        "special_tokens": dict(coll.special_tokens),
        "members": members,
        "unified": {key: list(names) for key, names in coll.manifest.unified.items()},
        "layout": raw.get("layout"),  # a pack-ordered layout (spec/COLLECTION.md §9), or None
        "document_lengths": length_stats(lengths),
        "loss_mask": None,
        "pack_indexes": {},
    }
    if coll.has_loss_mask:
        # a member without a mask of its own reads as all-trained (spec/COLLECTION.md §6)
        trained = sum((1.0 if coll.all_trained[m] else mask_fraction(coll.member(m).loss_mask, progress)) * tokens
                      for m, tokens in enumerate(coll.members.tokens.tolist()))
        out["loss_mask"] = {"trained_fraction": trained / total if total else 0.0, "trained_tokens": int(round(trained))}
    layout = raw.get("layout")
    for name, index in indexes.items():
        mixture = index.manifest.raw.get("mixture")
        if layout is not None and layout.get("index") == name:  # its documents as the index covers them (§9.2)
            seen = segment_lengths_if_in_order(index.segments, index.pack_offsets, lengths.shape[0])
            seen = lengths if seen is None else seen
        else:
            seen = lengths if mixture is None else _copy_lengths(coll, lengths, mixture, index)
        summary = index_summary(index, seen, batch_size)
        if mixture is not None:
            summary["mixture"] = mixture
        out["pack_indexes"][name] = summary
    return out


def _copy_lengths(coll, lengths: np.ndarray, mixture: dict, index) -> np.ndarray:
    """The lengths of the mixture's document copies: what its padding baselines pad (the same data)."""
    from .proportions import copies_of_record

    copies = copies_of_record(coll, mixture, index.capacity, index.manifest.oversize,
                              file=f"{F.PACKS_DIR}/{index.name}/{F.PACK_INDEX_JSON}")[0]
    return np.repeat(lengths, copies)


def format_mixture(mixture: dict) -> list[str]:
    """The lines of a mixture: what it asked (weights, or shares of a total), then per member copies, tokens, share."""
    rounds = (f"seed {mixture['seed']}; {len(mixture['rounds'])} round(s) of "
              f"{', '.join(f'{p:,}' for p in mixture['rounds'])} packs")
    if "weights" in mixture:
        weights = ", ".join(f"{k}={v:g}" for k, v in mixture["weights"].items())
        lines = [f"mixture weights {weights} ({rounds})"]
        column, value = "weight", lambda m: f"{m['weight']:>8g}"
    else:
        target = mixture["target"]
        asked = ", ".join(f"{k}={v:g}" for k, v in target["proportions"].items())
        total = f"{target['total']:,} tokens" + ("" if target["tokens"] is not None else " (no key repeated)")
        lines = [f"mixture proportions {asked} of {total} ({rounds})"]
        for key, share in mixture["shares"].items():
            plan = mixture["plan"][key]
            lines.append(f"  {key}: {share['tokens']:,} tokens ({100 * share['share']:.4f}%; target {plan['tokens']:,}"
                         f", {plan['copies']} whole cop{'y' if plan['copies'] == 1 else 'ies'} + "
                         f"{plan['extra_documents']:,} documents)")
        column, value = "key", lambda m: f"{str(m['key']) if m['key'] is not None else '-':>8s}"
    lines.append(f"  {'member':24s} {column:>8s} {'documents':>12s} {'tokens':>14s} {'proportion':>10s}")
    for m in mixture["members"]:
        share = mixture["proportions"].get(m["name"], 0.0)
        lines.append(f"  {m['name']:24s} {value(m)} {m['documents']:>12,} {m['tokens']:>14,} {100 * share:>9.2f}%")
    return lines


def _group_lines(rows: list[dict], pct) -> list[str]:
    """Totals per group (the part of a member's name before its first dot, spec/COLLECTION.md §2.1), when the
    members form more than one group or the table above was cut. Groups in order of their first member; totals
    summed in member order (``np.bincount`` adds its weights one by one in index order: each share's float sum
    is the one a loop over the members gives, so the printed percentages are too), no Python object per member
    beyond the columns read out of ``rows``."""
    group = [name.partition(".")[0] for name in map(itemgetter("name"), rows)]
    first = dict.fromkeys(group)  # the groups, in order of their first member
    if len(first) < 2 or len(first) == len(rows):
        return []
    index = {g: i for i, g in enumerate(first)}
    of = np.fromiter(map(index.__getitem__, group), dtype=np.int64, count=len(group))
    k = len(index)

    def column(key, dtype):
        return np.fromiter(map(itemgetter(key), rows), dtype=dtype, count=len(rows))

    n = np.bincount(of, minlength=k).tolist()
    sums = []
    for key in ("documents", "tokens"):  # int64 sums, exact: no group holds more than the collection (int64 offsets)
        total = np.zeros(k, dtype=np.int64)
        np.add.at(total, of, column(key, np.int64))
        sums.append(total.tolist())
    share = np.bincount(of, weights=column("share", np.float64), minlength=k).tolist()
    out = ["groups:", f"  {'group':24s} {'members':>8s} {'documents':>12s} {'tokens':>14s} {'share':>8s}"]
    for name, c, docs, toks, sh in zip(first, n, *sums, share):
        out.append(f"  {name:24s} {c:>8,} {docs:>12,} {toks:>14,} {pct(sh):>8s}")
    return out


def format_collection(s: dict) -> str:
    """Human-readable report of ``summarize_collection``'s dict."""
    from ..render import counts_lines, format_index, length_and_mask_lines, pct

    lines = [
        f"collection {s['path']}  (packfmt {s['format_version']}, {s['counts']['members']:,} members)",
        *counts_lines(s),
        "members:",
        f"  {'name':24s} {'documents':>12s} {'tokens':>14s} {'share':>8s}  path",
    ]
    rows = s["members"]
    shown = rows if len(rows) <= SHOWN_MEMBERS + 5 else rows[:SHOWN_MEMBERS] + [None] + rows[-5:]
    for m in shown:
        if m is None:
            lines.append(f"  ... {len(rows) - SHOWN_MEMBERS - 5:,} more members (`packfmt inspect --json` lists every one)")
            continue
        lines.append(f"  {m['name']:24s} {m['documents']:>12,} {m['tokens']:>14,} {pct(m['share']):>8s}  {m['path']}")
    lines += _group_lines(rows, pct)
    from .unify import MEANING

    for key, names in s.get("unified", {}).items():
        lines.append(f"unified   {key}: {', '.join(names)} ({MEANING[key]})")
    layout = s.get("layout")
    if layout is not None:
        lines.append(f"layout    {layout['kind']}: index {layout['index']!r} in pack order, {len(layout['member_packs']):,} "
                     f"shard(s) of ~{layout['shard_bytes']:,} bytes; {layout['lookahead_tokens']:,} lookahead token(s) "
                     f"(labels only, never inputs); from {layout['source']['name']!r}")
        if layout["source"].get("mixture"):
            lines += ["  source " + line for line in format_mixture(layout["source"]["mixture"])[:1]]
        laid = s["pack_indexes"].get(layout["index"])
        if laid is not None and laid.get("shard_rows"):
            lines.append("  streamed (stream=True): its index is read a shard at a time, each shard's rows verified "
                         "(index 1.2, spec/COLLECTION.md §9.4)")
        elif laid is not None:
            lines.append("  streamed (stream=True): its index is fetched whole before the first batch (24 B a "
                         "document); `packfmt pack SRC --capacity N --shards OUT` writes one read a shard at a time")
    lines += length_and_mask_lines(s)
    for name, ix in s["pack_indexes"].items():
        lines += format_index(name, ix)
        if "mixture" in ix:
            lines += ["  " + line for line in format_mixture(ix["mixture"])]
    if not s["pack_indexes"]:
        lines.append("pack indexes: none (add one with `packfmt pack PATH --capacity N [--weights NAME=W,... | --proportions NAME=P,... --tokens N]`)")
    return "\n".join(lines)
