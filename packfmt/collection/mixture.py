"""Weighted mixtures of a collection's members (spec/COLLECTION.md §5): weights -> copies per document.

A member of weight ``w`` gives each of its documents ``floor(w)`` copies plus one more for the
documents whose seeded hash ``u(seed, d)`` falls below ``w - floor(w)``. Copies are packed in
rounds (round ``r`` holds one copy of every document with more than ``r`` copies), each round
packed on its own, so two copies of one document never share a pack. The packers stay pure: this
module only chooses which segments go into each round and records what came out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import format as F
from ..errors import WriteError
from .mixture_record import MAX_WEIGHT, is_number_in

__all__ = ["MAX_WEIGHT", "parse_weights", "member_keys", "member_weights", "extra_copy_draws", "document_copies",
           "kept_tokens", "pack_rounds", "RepeatedSegmentation", "mixture_record", "check_weights"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def parse_weights(text: str, flag: str = "--weights", kind: str = "WEIGHT", example: str = "web=1,code=2.5"
                  ) -> dict[str, float]:
    """``"web=1,code=2.5"`` -> ``{"web": 1.0, "code": 2.5}`` (the ``--weights`` and ``--proportions`` syntax)."""
    out: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",")):
        key, sep, value = part.partition("=")
        key = key.strip()
        try:
            weight = float(value) if sep and key else None
        except ValueError:
            weight = None
        if weight is None:
            raise WriteError(f"{flag}: {part!r} is not NAME={kind} (e.g. {flag} {example})",
                             field=flag, expected=f"NAME={kind}[,NAME={kind}...]", found=repr(text))
        if key in out:
            raise WriteError(f"{flag}: {key!r} is given twice", field=flag, expected="each key once",
                             found=repr(text))
        out[key] = weight
    return out


def check_weights(weights: dict) -> dict[str, float]:
    """``weights=`` as a ``{key: w}`` dict of finite numbers in ``[0, MAX_WEIGHT]``."""
    if not isinstance(weights, dict) or not weights:
        raise WriteError(field="weights=", expected="a non-empty dict {member or group name: weight}",
                         found=repr(weights))
    out = {}
    for key, w in weights.items():
        if not (isinstance(key, str) and is_number_in(w, 0, MAX_WEIGHT)):
            raise WriteError(f"weights: {key!r}: expected a number in [0, {MAX_WEIGHT}], found {w!r}",
                             field=f"weights[{key!r}]", expected=f"a number in [0, {MAX_WEIGHT}]", found=repr(w),
                             cli=f"--weights: {key}={w!r}: a weight must be a number in [0, {MAX_WEIGHT}]")
        out[key] = float(w)
    return out


def _groups(names: list[str]) -> list[str]:
    groups = {n.rsplit(".", k)[0] for n in names for k in range(1, n.count(".") + 1)}
    return sorted(groups)


def member_keys(names: list[str], keys, what: str = "weights") -> np.ndarray:
    """int64 ``(members,)``: the position in ``keys`` of each member's longest matching key, -1 when none
    matches (spec/COLLECTION.md §5: key ``k`` matches member ``n`` when ``n == k`` or ``n`` starts with ``k.``).

    Raises WriteError naming the members and groups there are when a key matches no member.
    """
    out = np.full(len(names), -1, dtype=np.int64)
    best = np.full(len(names), -1)
    for j, key in enumerate(keys):
        hit = [i for i, n in enumerate(names) if n == key or n.startswith(key + ".")]
        if not hit:
            groups = _groups(names)
            there = f"the members are {names}" + (f" and the groups {groups}" if groups else "")
            raise WriteError(f"{what}: {key!r} names no member; {there}", field=f"{what}[{key!r}]",
                             expected=f"one of {names + groups}", found=repr(key),
                             cli=f"--{what}: {key!r} names no member; {there}")
        for i in hit:
            if len(key) > best[i]:
                best[i], out[i] = len(key), j
    return out


def member_weights(names: list[str], weights: dict[str, float]) -> np.ndarray:
    """float64 ``(members,)``: each member's weight by its longest matching key (1 when none matches)."""
    key = member_keys(names, list(weights))
    values = np.array(list(weights.values()) + [1.0], dtype=np.float64)
    out = values[key]  # -1: the trailing 1.0
    if not np.any(out > 0):
        raise WriteError("weights: every member has weight 0: nothing to pack", field="weights=",
                         expected="at least one member with a weight > 0", found=repr(weights),
                         cli="--weights: every member has weight 0: nothing to pack")
    return out


def _splitmix64(x: np.ndarray) -> np.ndarray:
    z = x + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def extra_copy_draws(seed: int, docs: np.ndarray) -> np.ndarray:
    """``u(seed, d)`` in ``[0, 1)`` for each collection document id (spec/COLLECTION.md §5)."""
    with np.errstate(over="ignore"):
        s = _splitmix64(np.array([seed], dtype=np.uint64))
        h = _splitmix64(s ^ np.asarray(docs, dtype=np.uint64))
    return (h >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


def document_copies(doc_start: np.ndarray, weights: np.ndarray, seed: int) -> np.ndarray:
    """int64 ``(documents,)``: ``copies(d)`` for every collection document (member ``m`` holds
    documents ``doc_start[m]:doc_start[m + 1]`` and has weight ``weights[m]``)."""
    out = np.empty(int(doc_start[-1]), dtype=np.int64)
    for m, w in enumerate(weights):
        a, b = int(doc_start[m]), int(doc_start[m + 1])
        whole, frac = math.floor(w), w - math.floor(w)
        out[a:b] = whole
        if frac > 0 and b > a:
            out[a:b] += extra_copy_draws(seed, np.arange(a, b, dtype=np.int64)) < frac
    return out


def kept_tokens(seg, doc_lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """int64 ``(documents,)`` twice: each document's segments and the tokens they hold (what the
    oversize policy keeps of it: 0 for a dropped or empty document)."""
    n = doc_lengths.shape[0]
    if seg.is_whole_documents:
        return np.ones(n, dtype=np.int64), np.asarray(doc_lengths, dtype=np.int64)
    docs = seg.segments[:, 0]
    return (np.bincount(docs, minlength=n).astype(np.int64),
            np.bincount(docs, weights=seg.lengths, minlength=n).astype(np.int64))


class RepeatedSegmentation:
    """The items of a mixture: segment ``item_seg[i]`` of ``seg`` once per round it is in.

    Offers what ``build_pack_index`` uses of a ``Segmentation`` (``lengths``, ``rows``,
    ``image_counts`` and the oversize counters), the counters counting document copies.
    """

    def __init__(self, seg, item_seg: np.ndarray, doc_lengths: np.ndarray, copies: np.ndarray, capacity: int,
                 oversize: str) -> None:
        self.seg, self.item_seg = seg, item_seg
        self.lengths = np.ascontiguousarray(seg.lengths[item_seg])
        n = doc_lengths.shape[0]
        pieces, kept = kept_tokens(seg, doc_lengths)
        dropped = pieces == 0
        self.dropped_docs = int(copies[dropped].sum())
        self.dropped_tokens = int((copies * doc_lengths)[dropped].sum())
        self.split_docs = int(copies[pieces > 1].sum()) if oversize == "split" else 0
        cut = (doc_lengths > capacity) & ~dropped if oversize == "truncate" else np.zeros(n, dtype=bool)
        self.truncated_docs = int(copies[cut].sum())
        self.truncated_tokens = int((copies * (doc_lengths - kept))[cut].sum())

    @property
    def image_counts(self) -> np.ndarray:
        return self.seg.image_counts[self.item_seg]

    @property
    def num_segments(self) -> int:
        return int(self.item_seg.shape[0])

    def rows(self, idx: np.ndarray) -> np.ndarray:
        return self.seg.rows(self.item_seg[np.asarray(idx, dtype=np.int64)])

    def item_docs(self) -> np.ndarray:
        """int64 ``(items,)``: the document of each item."""
        if self.seg.is_whole_documents:
            return self.item_seg
        return self.seg.segments[self.item_seg, 0]


@dataclass(frozen=True)
class Rounds:
    items: RepeatedSegmentation
    result: object  # PackResult over items
    packs_per_round: list[int]


def pack_rounds(seg, doc_lengths: np.ndarray, copies: np.ndarray, capacity: int, algorithm: str, seed: int,
                oversize: str, *, with_images: bool, max_items_per_pack=None, max_images_per_pack=None) -> Rounds:
    """Pack round ``r`` (one copy of each document with ``copies(d) > r``) on its own, for every round."""
    from ..packing import pack_items
    from ..packing.algorithms import PackResult

    seg_doc = np.arange(seg.num_segments, dtype=np.int64) if seg.is_whole_documents else seg.segments[:, 0]
    seg_copies = copies[seg_doc]
    parts, orders, offsets, per_round = [], [], [np.zeros(1, dtype=np.int64)], []
    base = packs = 0
    for r in range(int(copies.max()) if copies.size else 0):
        sel = np.flatnonzero(seg_copies > r)
        res = pack_items(seg.lengths[sel], capacity, algorithm, seed=(seed + r) % F.SEED_LIMIT,
                         max_items_per_pack=max_items_per_pack, max_images_per_pack=max_images_per_pack,
                         image_counts=seg.image_counts[sel] if with_images else None)
        parts.append(sel)
        orders.append(res.order + base)
        offsets.append(res.pack_offsets[1:] + base)
        per_round.append(res.n_packs)
        base += sel.shape[0]
        packs += res.n_packs
    item_seg = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    result = PackResult(np.concatenate(offsets), np.concatenate(orders) if orders else np.zeros(0, dtype=np.int64))
    items = RepeatedSegmentation(seg, item_seg, np.asarray(doc_lengths, dtype=np.int64), copies, capacity, oversize)
    return Rounds(items, result, per_round)


def mixture_record(head: dict, seed: int, names: list[str], member_fields: list[dict], doc_start: np.ndarray,
                   copies: np.ndarray, seg_docs: np.ndarray, seg_len: np.ndarray, per_round: list[int]) -> dict:
    """``index.json``'s ``mixture`` (spec/COLLECTION.md §5) from the segments of the index.

    Args:
        head: what the mixture was asked for: ``{"weights": ...}`` or a proportions record's keys.
        member_fields: per member, the keys that say how its copies were set (``{"weight": w}``).
        seg_docs, seg_len: collection document and length of every segment of the index.
    """
    tokens = member_tokens(doc_start, seg_docs, seg_len, len(names))
    n = copies.shape[0]
    packed_doc = np.bincount(seg_docs, minlength=n) > 0
    doc_member = np.repeat(np.arange(len(names), dtype=np.int64), np.diff(doc_start))
    documents = np.bincount(doc_member[packed_doc], weights=copies[packed_doc], minlength=len(names)).astype(np.int64)
    total = int(tokens.sum())
    return {
        **head,
        "seed": int(seed),
        "rounds": [int(p) for p in per_round],
        "members": [{"name": name, **member_fields[m], "documents": int(documents[m]), "tokens": int(tokens[m])}
                    for m, name in enumerate(names)],
        "proportions": {name: (int(tokens[m]) / total if total else 0.0) for m, name in enumerate(names)},
    }


def member_tokens(doc_start: np.ndarray, seg_docs: np.ndarray, seg_len: np.ndarray, members: int) -> np.ndarray:
    """int64 ``(members,)``: the tokens of each member's segments (after oversize losses)."""
    member = np.searchsorted(doc_start, seg_docs, side="right") - 1
    return np.bincount(member, weights=seg_len, minlength=members).astype(np.int64)
