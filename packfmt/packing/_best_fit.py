"""Best fit over an item sequence in O(n (D + 1) log C + n log P) with capacity buckets.

Data structure (D + 1 image classes, capacity C, P packs):

* ``root[c, r]``: a min-heap (pairing heap, keyed by pack id) of the packs of class ``c`` with
  exactly ``r`` tokens of room; each open pack sits in exactly one bucket. Pairing heaps are
  intrusive: ``child`` / ``sibling`` arrays indexed by pack id.
* ``mintree[c]``: an implicit min tree over ``r = 0..C`` whose leaf ``r`` is ``r`` when bucket
  ``(c, r)`` is non-empty and ``C + 1`` otherwise, so the smallest non-empty ``r >= L`` is a
  range-minimum query.

The best pack for an item of length L and image class k is the smallest room ``r >= L`` over
classes ``c >= k``; among the packs with that room, the lowest pack id (the heap minima of the
candidate buckets are compared). A pack leaves the structure when its item limit is reached or
its room is 0.

Runs of consecutive identical items (same length and image count) are placed at once: after
the best pack p takes one item, its room is strictly smaller than that of every other eligible
pack, so p stays the unique best pack while it can take the next item. The result equals
placing them one at a time.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ._common import id_dtype, image_classes, run_end
from ._trees import pow2_at_least, range_min, set_leaf_min

__all__ = ["best_fit"]

_INT32_MAX = np.iinfo(np.int32).max

#: Most (image class, remaining capacity) buckets best fit may allocate (16 bytes each).
MAX_BUCKETS = 1 << 24


@njit(cache=True, nogil=True, inline="always")
def _meld(a, b, child, sibling):
    """Meld two pairing-heap roots (lower pack id wins); returns the new root."""
    if b < a:
        a, b = b, a
    sibling[b] = child[a]
    child[a] = b
    return a


@njit(cache=True, nogil=True)
def _pop_root(root, child, sibling, scratch):
    """Delete the minimum ``root`` of its heap (two-pass pairing); returns the new root or -1."""
    c = child[root]
    child[root] = -1
    if c == -1:
        return -1
    k = 0
    while c != -1:  # first pass: meld pairs left to right
        a = c
        b = sibling[a]
        sibling[a] = -1
        if b == -1:
            scratch[k] = a
            k += 1
            break
        c = sibling[b]
        sibling[b] = -1
        scratch[k] = _meld(a, b, child, sibling)
        k += 1
    r = scratch[k - 1]
    for i in range(k - 2, -1, -1):  # second pass: meld right to left
        r = _meld(scratch[i], r, child, sibling)
    return r


@njit(cache=True, nogil=True)
def _push(p, c, r, root, mintree, size, child, sibling):
    """Insert pack ``p`` into bucket ``(c, r)``."""
    child[p] = -1
    sibling[p] = -1
    old = root[c, r]
    if old == -1:
        root[c, r] = p
        set_leaf_min(mintree[c], size, r, r)
    else:
        root[c, r] = _meld(old, p, child, sibling)


@njit(cache=True, nogil=True)
def _best_fit_kernel(lengths, images, seq, thresholds, capacity, max_items, max_images,
                     root, mintree, child, sibling, scratch, rem, cnt, head, pack_of_pos, start, n_packs):
    """Place ``seq[start:]`` by best fit until done or out of pack slots.

    Args mirror ``_first_fit._first_fit_kernel``; ``root`` is (D + 1, C + 1) of pack ids (-1:
    empty), ``mintree`` int32 (D + 1, 2 * size) with ``size >= C + 1``; ``child``, ``sibling``,
    ``scratch`` are (pack_cap,) of pack ids. Pack ids are ``id_dtype(n_items)``.
    Returns:
        (position reached, packs opened).
    """
    n = seq.shape[0]
    size = mintree.shape[1] // 2
    pack_cap = rem.shape[0]
    n_cls = thresholds.shape[0]
    empty = capacity + 1
    has_img = images.shape[0] > 0
    pos = start
    while pos < n:
        item = seq[pos]
        length = lengths[item]
        m = images[item] if has_img else 0
        end = run_end(seq, lengths, images, pos, has_img)
        k = np.searchsorted(thresholds, m)
        while pos < end:
            best_r = empty
            best_c = -1
            best_p = -1
            for c in range(k, n_cls):
                r = range_min(mintree[c], size, length, capacity)
                if r < best_r or (r == best_r and r != empty and root[c, r] < best_p):
                    best_r = r
                    best_c = c
                    best_p = root[c, r]
            if best_r == empty:
                if n_packs == pack_cap:
                    return pos, n_packs
                p = n_packs
                n_packs += 1
                rem[p] = capacity
                cnt[p] = 0
                head[p] = max_images
            else:
                p = best_p
                new_root = _pop_root(p, child, sibling, scratch)
                root[best_c, best_r] = new_root
                if new_root == -1:
                    set_leaf_min(mintree[best_c], size, best_r, empty)
            q = min(end - pos, rem[p] // length, max_items - cnt[p])
            if m > 0:
                q = min(q, head[p] // m)
            for t in range(pos, pos + q):
                pack_of_pos[t] = p
            pos += q
            rem[p] -= q * length
            cnt[p] += q
            head[p] -= q * m
            if rem[p] > 0 and cnt[p] < max_items:
                c2 = np.searchsorted(thresholds, head[p], side="right") - 1
                _push(p, c2, rem[p], root, mintree, size, child, sibling)
    return pos, n_packs


def best_fit(lengths, seq, capacity, max_items=None, images=None, max_images=None, pack_cap=1):
    """Best fit of the items in ``seq`` order (ties: lowest pack id).

    Args:
        lengths: int64 (n_items,) in [1, capacity].
        seq: int64 (n,) placement order.
        capacity: tokens per pack.
        max_items, max_images: per-pack limits or None.
        images: int64 (n_items,) images per item or None.
        pack_cap: initial pack slots (doubled when exceeded).
    Returns:
        (pack_of_pos (n,) of ``id_dtype(n_items)``, n_packs).
    Raises:
        ValueError: (distinct image counts + 1) * (capacity + 1) > MAX_BUCKETS.
    """
    capacity = int(capacity)
    limited = images is not None and max_images is not None
    imgs = images if limited else np.zeros(0, dtype=np.int64)
    max_images_i = min(int(max_images), _INT32_MAX) if limited else 0
    max_items_i = _INT32_MAX if max_items is None else min(int(max_items), _INT32_MAX)
    thresholds = image_classes(images, max_images)
    n_cls = thresholds.shape[0]
    if n_cls * (capacity + 1) > MAX_BUCKETS:
        raise ValueError(f"bfd needs one bucket per (image class, remaining capacity): {n_cls} x {capacity + 1} "
                         f"exceeds {MAX_BUCKETS}; use ffd for capacities this large")
    size = pow2_at_least(capacity + 1)
    ids = id_dtype(lengths.shape[0])
    root = np.full((n_cls, capacity + 1), -1, dtype=ids)
    mintree = np.full((n_cls, 2 * size), capacity + 1, dtype=np.int32)
    pack_cap = max(1, int(pack_cap))
    arrays = _alloc_packs(pack_cap, ids)
    pack_of_pos = np.empty(seq.shape[0], dtype=ids)
    pos, n_packs = 0, 0
    while True:
        pos, n_packs = _best_fit_kernel(lengths, imgs, seq, thresholds, capacity, max_items_i, max_images_i,
                                        root, mintree, *arrays, pack_of_pos, pos, n_packs)
        if pos == seq.shape[0]:
            return pack_of_pos, n_packs
        arrays = _grow_packs(arrays)


def _alloc_packs(pack_cap: int, ids: type) -> tuple:
    """(child, sibling, scratch, rem, cnt, head) for ``pack_cap`` packs; ids of dtype ``ids``."""
    return (np.full(pack_cap, -1, dtype=ids), np.full(pack_cap, -1, dtype=ids),
            np.empty(pack_cap, dtype=ids), np.zeros(pack_cap, dtype=np.int32),
            np.zeros(pack_cap, dtype=np.int32), np.zeros(pack_cap, dtype=np.int32))


def _grow_packs(arrays: tuple) -> tuple:
    """Double the pack slots, keeping contents."""
    old = arrays[0].shape[0]
    new = _alloc_packs(2 * old, arrays[0].dtype)
    for a, b in zip(arrays, new):
        b[:old] = a
    return new
