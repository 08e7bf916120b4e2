"""Shared numba kernels: counting sort, grouping placements into packs, image classes.

Every kernel here takes its output arrays from the caller, so that all large allocations are
numpy allocations (visible to ``tracemalloc``) and the kernels stay allocation-free.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = [
    "NO_LIMIT",
    "id_dtype",
    "sort_by_length_desc",
    "sort_runs_desc",
    "group_by_pack",
    "group_by_pack_with_lengths",
    "image_classes",
]

#: Stand-in for "no limit" on items or images per pack (larger than any real count).
NO_LIMIT = np.int64(1) << np.int64(62)

def id_dtype(n_items: int) -> type:
    """Dtype of pack ids for ``n_items`` items (there are at most that many packs): int32 if it fits."""
    return np.int32 if n_items < np.iinfo(np.int32).max else np.int64


#: Above this capacity (or above 4 x n) the length sort uses numpy's stable argsort instead of
#: a counting sort, whose histogram is O(capacity) memory.
_COUNTING_SORT_MAX_CAPACITY = 1 << 24


@njit(cache=True, nogil=True, inline="always")
def run_end(seq, lengths, images, pos, has_img):
    """End (exclusive) of the run of items from ``seq[pos]`` on with equal length and image count.

    FFD/BFD place such a run together: equal items are interchangeable, so placing them as a run
    gives the textbook result while searching the tree once per run where possible.
    """
    n = seq.shape[0]
    length = lengths[seq[pos]]
    m = images[seq[pos]] if has_img else 0
    end = pos + 1
    while end < n and lengths[seq[end]] == length and (not has_img or images[seq[end]] == m):
        end += 1
    return end


@njit(cache=True, nogil=True)
def _counting_sort_desc(lengths, capacity, hist, out):
    """Stable counting sort of item indices by length, descending.

    Args:
        lengths: int32 or int64 (n,), values in [1, capacity].
        capacity: the largest possible length.
        hist: int64 (capacity + 1,) scratch, any content.
        out: int32 or int64 (n,) receives item indices; ties keep ascending index order.
    """
    hist[:] = 0
    for i in range(lengths.shape[0]):
        hist[lengths[i]] += 1
    acc = 0
    for length in range(capacity, -1, -1):
        c = hist[length]
        hist[length] = acc
        acc += c
    for i in range(lengths.shape[0]):
        length = lengths[i]
        out[hist[length]] = i
        hist[length] += 1


def sort_by_length_desc(lengths: np.ndarray, capacity: int, dtype=np.int64) -> np.ndarray:
    """Item indices sorted by length descending, ties by ascending index (a stable sort).

    Args:
        lengths: int32 or int64 (n,), values in [1, capacity].
        capacity: tokens per pack.
        dtype: of the result: int64, or int32 when ``n < 2**31 - 1`` (``id_dtype``).
    Returns:
        (n,) permutation of ``arange(n)``. O(n + capacity) time when the capacity is small
        relative to n (counting sort), O(n log n) otherwise.
    """
    return sort_runs_desc(lengths, capacity, dtype)[0]


def sort_runs_desc(lengths: np.ndarray, capacity: int, dtype=np.int64) -> tuple[np.ndarray, np.ndarray | None]:
    """``sort_by_length_desc`` and where each length's run ends in it: ``(seq, run_ends)``.

    ``run_ends``: int64 (capacity + 1,), the items of length ``l`` are ``seq[run_ends[l + 1]:run_ends[l]]``
    (``seq[:run_ends[capacity]]`` for ``l == capacity``): the length at every position of ``seq``
    without reading one (``group_by_pack_with_lengths``). None when sorted by argsort (a capacity
    large relative to n), where no such table is built.
    """
    n = lengths.shape[0]
    if capacity > _COUNTING_SORT_MAX_CAPACITY or capacity > 4 * n + 1024:
        return np.argsort(-lengths, kind="stable").astype(dtype, copy=False), None
    out = np.empty(n, dtype=dtype)
    hist = np.empty(capacity + 1, dtype=np.int64)
    _counting_sort_desc(lengths, capacity, hist, out)  # leaves hist[l] at the end of length l's run
    return out, hist


@njit(cache=True, nogil=True)
def _group_by_pack(seq, pack_of_pos, n_packs, offsets, order, record):
    """Counting sort of placements by pack id, keeping placement order inside each pack.

    Args:
        seq: int32 or int64 (n,) item index placed at each position.
        pack_of_pos: int32 or int64 (n,) pack id of the item placed at each position.
        n_packs: number of packs; ids are in [0, n_packs).
        offsets: int64 (n_packs + 1,) receives the CSR offsets into ``order``.
        order: (n,) of ``seq``'s dtype, receives item indices grouped by pack.
        record: overwrite ``pack_of_pos[pos]`` with the place of position ``pos`` in ``order``.
    """
    offsets[:] = 0
    for pos in range(seq.shape[0]):
        offsets[pack_of_pos[pos] + 1] += 1
    # exclusive prefix sum, shifted left by one: offsets[p] = start of pack p
    acc = 0
    for p in range(n_packs):
        c = offsets[p + 1]
        offsets[p] = acc
        acc += c
    offsets[n_packs] = acc
    for pos in range(seq.shape[0]):
        p = pack_of_pos[pos]
        at = offsets[p]
        order[at] = seq[pos]
        offsets[p] = at + 1
        if record:
            pack_of_pos[pos] = at
    # offsets[p] now holds the end of pack p; shift right by one to get the starts back
    for p in range(n_packs, 0, -1):
        offsets[p] = offsets[p - 1]
    offsets[0] = 0


@njit(cache=True, nogil=True)
def _lengths_by_place(place, run_ends, out):
    """``out[place[pos]] = `` the length at position ``pos`` of a sequence sorted by ``sort_runs_desc``
    (``run_ends``, its runs): one pass, no length read per item."""
    length = run_ends.shape[0] - 1
    for pos in range(place.shape[0]):
        while pos >= run_ends[length]:
            length -= 1
        out[place[pos]] = length


def group_by_pack(seq: np.ndarray, pack_of_pos: np.ndarray, n_packs: int) -> tuple[np.ndarray, np.ndarray]:
    """CSR (pack_offsets, order) from a placement sequence; O(n + n_packs).

    Args:
        seq: int32 or int64 (n,) item placed at each step.
        pack_of_pos: int32 or int64 (n,) pack receiving it.
        n_packs: number of packs (every id in [0, n_packs) must occur).
    Returns:
        ``pack_offsets`` int64 (n_packs + 1,) and ``order`` (n,) of ``seq``'s dtype.
    """
    offsets = np.empty(n_packs + 1, dtype=np.int64)
    order = np.empty(seq.shape[0], dtype=seq.dtype)
    _group_by_pack(seq, pack_of_pos, n_packs, offsets, order, False)
    return offsets, order


def group_by_pack_with_lengths(seq: np.ndarray, pack_of_pos: np.ndarray, n_packs: int,
                               run_ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``group_by_pack`` of a ``seq`` sorted by ``sort_runs_desc``, and the lengths of ``order``'s items in its order
    (``lengths[order]``) from ``run_ends``: ``(pack_offsets, order, item_lengths)``.

    What a writer of the packs' rows needs without gathering a length per item from the whole array
    (a cache miss each: 0.4 s of CPU at 10^8 items). ``seq`` and ``pack_of_pos`` are consumed: the
    lengths are written over ``seq`` (``item_lengths`` is that array), no new array of n.
    """
    offsets = np.empty(n_packs + 1, dtype=np.int64)
    order = np.empty(seq.shape[0], dtype=seq.dtype)
    _group_by_pack(seq, pack_of_pos, n_packs, offsets, order, True)
    _lengths_by_place(pack_of_pos, run_ends, seq)
    return offsets, order, seq


def image_classes(image_counts: np.ndarray | None, max_images: int | None) -> np.ndarray:
    """Thresholds of the image classes used by the first-fit and best-fit engines.

    A pack with image headroom ``h`` (images it may still take) is eligible for an item with
    ``m`` images iff ``h >= m``. The engines keep one structure per distinct positive ``m``
    among the items (plus one for ``m = 0``), so this returns ``[0, m_1 < m_2 < ...]``.

    Returns:
        int64 (D + 1,), sorted ascending, first element 0. ``[0]`` when images are not limited.
    """
    if image_counts is None or max_images is None or image_counts.size == 0:
        return np.zeros(1, dtype=np.int64)
    distinct = np.unique(image_counts)
    return np.concatenate([[0], distinct[distinct > 0]]).astype(np.int64)
