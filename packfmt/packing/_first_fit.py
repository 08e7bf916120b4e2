"""First fit over an arbitrary item sequence in O(n log P), with a max segment tree over packs.

Used by ``ffd`` (sequence = lengths sorted descending), ``first_fit_shuffle`` (a seeded
permutation) and phase B of ``balanced`` (which starts from packs that already hold items).

Data structure: for each image class ``c`` (see ``_common.image_classes``) an implicit binary
tree over pack ids whose leaf ``p`` holds the remaining token capacity of pack ``p`` if the pack
may take an item of that class (item limit not reached, image headroom >= threshold ``c``), else
``-1``; inner nodes hold the maximum of their children. The leftmost pack with room ``>= L`` is
found by one root-to-leaf descent.

Consecutive items of equal length (and image count) are placed as a run: the leftmost pack with
room takes as many of them as fit at once. This is exactly what first fit does item by item (the
packs to its left could not take the first item, so they cannot take the next identical one), so
the result is unchanged; it only saves tree operations.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ._common import id_dtype, image_classes, run_end
from ._trees import leftmost_ge, pow2_at_least, rebuild_max, set_leaf_max

__all__ = ["FirstFitPacker", "first_fit"]

_INT32_MAX = np.iinfo(np.int32).max


@njit(cache=True, nogil=True)
def _update_pack(trees, size, thresholds, p, rem_p, full, head_p):
    """Write pack ``p``'s state into the leaf of every class tree."""
    for c in range(thresholds.shape[0]):
        v = rem_p
        if full or head_p < thresholds[c]:
            v = -1
        set_leaf_max(trees[c], size, p, v)


@njit(cache=True, nogil=True)
def _first_fit_kernel(lengths, images, seq, thresholds, capacity, max_items, max_images,
                      trees, rem, cnt, head, pack_of_pos, start, n_packs):
    """Place ``seq[start:]`` by first fit until done or out of pack slots.

    Args:
        lengths: int64 (n_items,) tokens per item, in [1, capacity].
        images: int64 (n_items,) images per item, or (0,) when images are not limited.
        seq: int64 (n,) item indices in placement order.
        thresholds: int64 (D + 1,) image class thresholds, ``thresholds[0] == 0``.
        capacity, max_items, max_images: limits per pack (``max_images`` is 0 when unlimited).
        trees: int32 (D + 1, 2 * size) one max tree per class; unused leaves are -1.
        rem, cnt, head: int32 (pack_cap,) remaining tokens, items, image headroom per pack.
        pack_of_pos: int32/int64 (n,) receives the pack of each position.
        start: first position to place.
        n_packs: packs opened so far.
    Returns:
        (position reached, packs opened). The position is ``n`` unless all ``pack_cap`` slots
        were used; the caller then grows the arrays and calls again.
    """
    n = seq.shape[0]
    size = trees.shape[1] // 2
    pack_cap = rem.shape[0]
    has_img = images.shape[0] > 0
    pos = start
    while pos < n:
        item = seq[pos]
        length = lengths[item]
        m = images[item] if has_img else 0
        end = run_end(seq, lengths, images, pos, has_img)
        k = np.searchsorted(thresholds, m)
        while pos < end:
            p = leftmost_ge(trees[k], size, length)
            if p < 0:
                if n_packs == pack_cap:
                    return pos, n_packs
                p = n_packs
                n_packs += 1
                rem[p] = capacity
                cnt[p] = 0
                head[p] = max_images
            q = min(end - pos, rem[p] // length, max_items - cnt[p])
            if m > 0:
                q = min(q, head[p] // m)
            for t in range(pos, pos + q):
                pack_of_pos[t] = p
            pos += q
            rem[p] -= q * length
            cnt[p] += q
            head[p] -= q * m
            _update_pack(trees, size, thresholds, p, rem[p], cnt[p] >= max_items, head[p])
    return pos, n_packs


class FirstFitPacker:
    """Resumable first-fit engine; all arrays are numpy allocations owned by this object.

    Args:
        lengths: int64 (n_items,) in [1, capacity].
        capacity: tokens per pack.
        max_items: items per pack, or None.
        images: int64 (n_items,) images per item, or None.
        max_images: images per pack, or None (then ``images`` is ignored for placement).
        pack_cap: initial number of pack slots (grown by doubling when exceeded).
    """

    def __init__(self, lengths, capacity, max_items, images, max_images, pack_cap):
        self.lengths = lengths
        self.capacity = int(capacity)
        self.max_items = _INT32_MAX if max_items is None else min(int(max_items), _INT32_MAX)
        limited = images is not None and max_images is not None
        self.images = images if limited else np.zeros(0, dtype=np.int64)
        self.max_images = min(int(max_images), _INT32_MAX) if limited else 0
        self.thresholds = image_classes(images, max_images)
        self.n_packs = 0
        self._alloc(max(1, int(pack_cap)))

    def _alloc(self, pack_cap: int) -> None:
        size = pow2_at_least(pack_cap)
        self.trees = np.full((self.thresholds.shape[0], 2 * size), -1, dtype=np.int32)
        self.rem = np.zeros(pack_cap, dtype=np.int32)
        self.cnt = np.zeros(pack_cap, dtype=np.int32)
        self.head = np.zeros(pack_cap, dtype=np.int32)

    def _grow(self) -> None:
        """Double the pack slots, keeping every opened pack; O(pack_cap)."""
        old_size = self.trees.shape[1] // 2
        rem, cnt, head = self.rem, self.cnt, self.head
        leaves = self.trees[:, old_size:].copy()
        self._alloc(2 * rem.shape[0])
        self.rem[: rem.shape[0]] = rem
        self.cnt[: cnt.shape[0]] = cnt
        self.head[: head.shape[0]] = head
        size = self.trees.shape[1] // 2
        self.trees[:, size: size + old_size] = leaves
        rebuild_max(self.trees)

    def open_packs(self, used_tokens, used_items, used_images) -> None:
        """Start from packs that already hold items (ids 0..k-1); each must still be valid.

        Args:
            used_tokens, used_items, used_images: int64 (k,) current contents per pack.
        """
        k = used_tokens.shape[0]
        while self.rem.shape[0] < k:
            self._grow()
        self.rem[:k] = self.capacity - used_tokens
        self.cnt[:k] = used_items
        self.head[:k] = (self.max_images - used_images) if self.max_images else 0
        size = self.trees.shape[1] // 2
        full = self.cnt[:k] >= self.max_items
        for c, thr in enumerate(self.thresholds):
            self.trees[c, size: size + k] = np.where(full | (self.head[:k] < thr), -1, self.rem[:k])
        rebuild_max(self.trees)
        self.n_packs = k

    def place(self, seq: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Place the items ``seq`` (int64 item indices) in that order; return their pack ids.

        Args:
            seq: int64 (n,) item indices.
            out: optional (n,) array to write the pack ids into (``id_dtype`` of the items).
        """
        pack_of_pos = np.empty(seq.shape[0], dtype=id_dtype(self.lengths.shape[0])) if out is None else out
        pos = 0
        while True:
            pos, self.n_packs = _first_fit_kernel(
                self.lengths, self.images, seq, self.thresholds, self.capacity, self.max_items,
                self.max_images, self.trees, self.rem, self.cnt, self.head, pack_of_pos, pos, self.n_packs)
            if pos == seq.shape[0]:
                return pack_of_pos
            self._grow()


def any_fit_pack_bound(total_tokens: int, capacity: int, n_items: int) -> int:
    """Upper bound on the packs of any any-fit algorithm (first fit, best fit) without limits.

    Any two packs i < j satisfy load_i + load_j > capacity (the first item of j did not fit
    into i), so P <= 2 * ceil(total / capacity) + 1. With item or image limits the bound can be
    exceeded; the engines then grow their arrays.
    """
    return max(1, min(n_items, 2 * (-(-total_tokens // capacity)) + 1))


def first_fit(lengths, seq, capacity, max_items=None, images=None, max_images=None):
    """First fit of the items in ``seq`` order.

    Returns:
        (pack_of_pos (n,) of ``id_dtype(n_items)``, n_packs).
    """
    bound = any_fit_pack_bound(int(lengths.sum()), capacity, lengths.shape[0])
    packer = FirstFitPacker(lengths, capacity, max_items, images, max_images, bound)
    pack_of_pos = packer.place(seq)
    return pack_of_pos, packer.n_packs
