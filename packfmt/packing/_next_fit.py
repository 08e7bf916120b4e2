"""Next fit in O(n): one open pack, closed as soon as the next item does not fit it."""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["next_fit"]


@njit(cache=True, nogil=True)
def _next_fit_kernel(lengths, images, seq, capacity, max_items, max_images, offsets):
    """Next fit of ``seq``; packs are contiguous runs of ``seq``.

    Args:
        lengths: int64 (n_items,) in [1, capacity].
        images: int64 (n_items,) or (0,) when images are not limited.
        seq: int64 (n,) placement order.
        capacity, max_items, max_images: per-pack limits (``max_images`` ignored without images).
        offsets: int64 (n + 1,) receives the pack start positions in ``seq`` (then ``n``).
    Returns:
        Number of packs P; ``offsets[:P + 1]`` is valid.
    """
    n = seq.shape[0]
    has_img = images.shape[0] > 0
    n_packs = 0
    used = capacity + 1  # forces a new pack for the first item
    count = 0
    imgs = 0
    for pos in range(n):
        item = seq[pos]
        length = lengths[item]
        m = images[item] if has_img else 0
        if used + length > capacity or count + 1 > max_items or imgs + m > max_images:
            offsets[n_packs] = pos
            n_packs += 1
            used = 0
            count = 0
            imgs = 0
        used += length
        count += 1
        imgs += m
    offsets[n_packs] = n
    return n_packs


def next_fit(lengths, seq, capacity, max_items=None, images=None, max_images=None):
    """Next fit of the items in ``seq`` order.

    Returns:
        ``pack_offsets`` int64 (P + 1,) into ``seq`` (which is the ``order`` of the result).
    """
    limited = images is not None and max_images is not None
    imgs = images if limited else np.zeros(0, dtype=np.int64)
    max_i = np.int64(1) << 62
    offsets = np.empty(seq.shape[0] + 1, dtype=np.int64)
    n_packs = _next_fit_kernel(lengths, imgs, seq, int(capacity), max_i if max_items is None else int(max_items),
                               int(max_images) if limited else max_i, offsets)
    return offsets[: n_packs + 1].copy()
