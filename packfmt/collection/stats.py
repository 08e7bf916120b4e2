"""The per-document passes behind ``packfmt inspect``'s numbers (a store's or a collection's), in bounded memory.

Each pass is one numba loop over arrays the caller already holds (document lengths, int32 when they fit:
``_resident.narrow_lengths``) or over ``segments.bin`` in runs of packs whose pages are handed back after each
(``_resident.release``), so that ``inspect`` holds no int64 copy per document or per segment: at 10^9
documents each such copy is 8 GB. ``packfmt.summary`` and ``collection.inspect`` turn the results into the
report; the numbers are those of the numpy expressions they replace (``tests/test_inspect.py``,
``tests/test_packscale.py`` compare them with references).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .._resident import release
from ..checks import pack_runs

__all__ = ["padding_rows", "distinct_documents", "sort_within", "segment_lengths_if_in_order"]

#: Members shorter than this are sorted by a comparison sort, longer ones by the radix sort (2,049 counters a pass).
_RADIX_MIN = 2048


def padding_rows(lengths: np.ndarray, capacity: int, batch_size: int) -> tuple[int, int, int]:
    """``(rows, tokens, pad_to_longest slots)`` of ``summary.row_lengths(lengths, capacity)`` without the rows
    array: each document cut into rows of at most ``capacity`` tokens in data order, batches of ``batch_size``
    consecutive rows each padded to its longest (the last, shorter batch to its own longest)."""
    return tuple(int(v) for v in _padding(np.asarray(lengths), int(capacity), int(batch_size)))


@njit(cache=True, nogil=True)
def _padding(lengths, capacity, batch):
    rows = 0
    real = 0
    longest = 0
    in_batch = 0
    top = 0
    for i in range(lengths.shape[0]):
        length = np.int64(lengths[i])
        real += length
        full = length // capacity
        rem = length - full * capacity
        for j in range(full + (1 if rem > 0 else 0)):
            row = capacity if j < full else rem
            if row > top:
                top = row
            in_batch += 1
            rows += 1
            if in_batch == batch:
                longest += top * batch
                in_batch = 0
                top = 0
    longest += top * in_batch
    return rows, real, longest


def distinct_documents(segs: np.ndarray, po: np.ndarray, n_docs: int) -> np.ndarray:
    """Distinct documents in each pack, int64 ``(n_packs,)``: ``summary.documents_per_pack``.

    One byte per document counts its segments (saturating at 2); only the segments of documents with several
    are then compared within their pack. ``segs`` is read in runs of packs, its pages handed back after each.
    """
    po = np.asarray(po)
    per_pack = np.diff(po).astype(np.int64)
    if po.shape[0] == 0 or int(po[0]) != 0 or int(po[-1]) != segs.shape[0] or bool((per_pack < 0).any()):
        raise ValueError(f"distinct_documents: pack offsets must rise from 0 to the {segs.shape[0]} segments, found "
                         f"{po[:1].tolist()} .. {po[-1:].tolist()}{' (decreasing)' if (per_pack < 0).any() else ''}: "
                         "pass the index's checked pack_offsets")  # _repeats indexes the segments with them unchecked
    if segs.shape[0] == 0:
        return per_pack
    counts = np.zeros(n_docs, dtype=np.uint8)
    several = 0
    for p0, p1 in pack_runs(po):
        got = _count_segments(np.asarray(segs[int(po[p0]):int(po[p1]), 0]), counts)
        if got < 0:  # the caller's n_docs is not the index's dataset's (the open's V27 bounds every id by that)
            raise ValueError(f"distinct_documents: a segment's document is outside [0, {n_docs}): pass the number "
                             "of documents of the dataset the index packs")
        several += got
        release(segs)
    if several:  # a pack can hold a document twice only through a document with several segments
        for p0, p1 in pack_runs(po):
            s0 = int(po[p0])
            _repeats(np.asarray(segs[s0:int(po[p1]), 0]), po[p0:p1 + 1] - s0, counts, per_pack[p0:p1])
            release(segs)
    return per_pack


@njit(cache=True, nogil=True)
def _count_segments(doc, counts):
    """``counts[d]`` += 1 for each ``d`` in ``doc``, saturating at 2; return how many documents reached 2, or -1
    (nothing written past it) at a ``d`` outside ``counts``: the kernel checks what it indexes with."""
    several = 0
    n = counts.shape[0]
    for i in range(doc.shape[0]):
        if doc[i] < 0 or doc[i] >= n:
            return -1
        c = counts[doc[i]]
        if c < 2:
            counts[doc[i]] = c + 1
            if c == 1:
                several += 1
    return several


@njit(cache=True, nogil=True)
def _repeats(doc, local_po, counts, per_pack):
    """``per_pack[p]`` -= the repeats among pack ``p``'s segments of documents with several segments."""
    widest = 0
    for p in range(local_po.shape[0] - 1):
        widest = max(widest, local_po[p + 1] - local_po[p])
    buf = np.empty(widest, dtype=doc.dtype)
    for p in range(local_po.shape[0] - 1):
        k = 0
        for s in range(local_po[p], local_po[p + 1]):
            if counts[doc[s]] > 1:
                buf[k] = doc[s]
                k += 1
        if k > 1:
            ordered = np.sort(buf[:k])
            for j in range(1, k):
                if ordered[j] == ordered[j - 1]:
                    per_pack[p] -= 1


def sort_within(lengths: np.ndarray, doc_start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(ordered, totals)``: ``lengths`` (``>= 0``, any integer type, kept) sorted within each member
    (``lengths[doc_start[m]:doc_start[m + 1]]``), and each member's int64 sum.

    Each member on its own: an LSD radix sort of 11-bit digits (a digit every length shares is skipped) for
    a long member, a comparison sort for a short one: the result and one member's scratch, of the input's type.
    """
    lengths = np.asarray(lengths)
    doc_start = np.asarray(doc_start, dtype=np.int64)
    if doc_start.shape[0] and (int(doc_start[0]) != 0 or int(doc_start[-1]) != lengths.shape[0]
                               or bool((np.diff(doc_start) < 0).any())):
        raise ValueError(f"sort_within: doc_start must rise from 0 to the {lengths.shape[0]} lengths, found "
                         f"{int(doc_start[0])} .. {int(doc_start[-1])}")  # the kernel indexes with them unchecked
    out = np.empty_like(lengths)
    widest = int(np.diff(doc_start).max()) if doc_start.shape[0] > 1 else 0
    scratch = np.empty(widest if widest >= _RADIX_MIN else 0, dtype=lengths.dtype)  # one member's, not every one's
    totals = _sort_runs(lengths, doc_start, out, scratch)
    return out, totals


@njit(cache=True, nogil=True)
def _sort_runs(values, starts, out, scratch):
    members = starts.shape[0] - 1
    totals = np.zeros(members, dtype=np.int64)
    count = np.zeros(2049, dtype=np.int64)
    for m in range(members):
        a, b = starts[m], starts[m + 1]
        top = 0
        total = 0
        for i in range(a, b):
            v = values[i]
            out[i] = v
            total += v
            if v > top:
                top = v
        totals[m] = total
        n = b - a
        if n < 2:
            continue
        if n < _RADIX_MIN:
            out[a:b] = np.sort(out[a:b])
            continue
        bits = 0
        while bits < 63 and (np.int64(top) >> bits) > 0:
            bits += 1
        mine, other = out[a:b], scratch[:n]
        in_other = False
        shift = 0
        while shift < bits:
            src = other if in_other else mine
            dst = mine if in_other else other
            count[:] = 0
            for i in range(n):
                count[((np.int64(src[i]) >> shift) & 2047) + 1] += 1
            if count.max() < n:  # else every length shares this digit: the order stays
                for d in range(2048):
                    count[d + 1] += count[d]
                for i in range(n):
                    d = (np.int64(src[i]) >> shift) & 2047
                    dst[count[d]] = src[i]
                    count[d] += 1
                in_other = not in_other
            shift += 11
        if in_other:
            mine[:] = other
    return totals


def segment_lengths_if_in_order(segs: np.ndarray, po: np.ndarray, n_docs: int) -> np.ndarray | None:
    """``end - begin`` of each segment (int32 when every one fits, else int64) when segment ``i`` is of document
    ``i`` for every ``i < n_docs`` (and there are ``n_docs``), else None; read in runs of packs, pages handed back."""
    po = np.asarray(po)
    if segs.shape[0] != n_docs:
        return None
    out = np.empty(n_docs, dtype=np.int32)
    for p0, p1 in pack_runs(po):
        s0, s1 = int(po[p0]), int(po[p1])
        rows = np.asarray(segs[s0:s1])
        if not np.array_equal(rows[:, 0], np.arange(s0, s1)):
            release(segs)
            return None
        seg_len = rows[:, 2] - rows[:, 1]
        if seg_len.size and int(seg_len.max()) > np.iinfo(np.int32).max:
            out = out.astype(np.int64)
        out[s0:s1] = seg_len
        release(segs)
    return out
