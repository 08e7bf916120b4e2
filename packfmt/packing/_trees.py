"""Implicit binary segment trees over a power-of-two number of leaves (numba helpers).

A tree with ``size`` leaves is an array of ``2 * size`` values: the root is index 1, node ``i``
has children ``2i`` and ``2i + 1``, leaf ``j`` is index ``size + j``; index 0 is unused by the
tree (the min tree keeps its "empty" sentinel there).
"""

from __future__ import annotations

from numba import njit

__all__ = ["pow2_at_least", "leftmost_ge", "set_leaf_max", "rebuild_max", "set_leaf_min", "range_min"]


def pow2_at_least(x: int) -> int:
    """Smallest power of two >= max(x, 1)."""
    return 1 << max(0, int(x - 1).bit_length())


@njit(cache=True, nogil=True, inline="always")
def leftmost_ge(tree, size, value):
    """Leftmost leaf of a max tree whose value is >= ``value``, or -1; O(log size)."""
    if tree[1] < value:
        return -1
    i = 1
    while i < size:
        i <<= 1
        if tree[i] < value:
            i += 1
    return i - size


@njit(cache=True, nogil=True, inline="always")
def set_leaf_max(tree, size, leaf, value):
    """Set a leaf of a max tree and restore the invariant upwards (stops once nothing changes)."""
    i = leaf + size
    tree[i] = value
    i >>= 1
    while i >= 1:
        a = tree[2 * i]
        b = tree[2 * i + 1]
        m = a if a > b else b
        if tree[i] == m:
            break
        tree[i] = m
        i >>= 1


@njit(cache=True, nogil=True)
def rebuild_max(trees):
    """Recompute every inner node of each max tree (rows of a 2-D array) from its leaves."""
    size = trees.shape[1] // 2
    for c in range(trees.shape[0]):
        for i in range(size - 1, 0, -1):
            a = trees[c, 2 * i]
            b = trees[c, 2 * i + 1]
            trees[c, i] = a if a > b else b


@njit(cache=True, nogil=True, inline="always")
def set_leaf_min(tree, size, leaf, value):
    """Set a leaf of a min tree and restore the invariant upwards."""
    i = leaf + size
    tree[i] = value
    i >>= 1
    while i >= 1:
        a = tree[2 * i]
        b = tree[2 * i + 1]
        m = a if a < b else b
        if tree[i] == m:
            break
        tree[i] = m
        i >>= 1


@njit(cache=True, nogil=True, inline="always")
def range_min(tree, size, lo, hi):
    """Minimum over leaves ``lo..hi`` (inclusive) of a min tree, or ``tree[0]`` if all are larger."""
    res = tree[0]
    lo += size
    hi += size + 1
    while lo < hi:
        if lo & 1:
            if tree[lo] < res:
                res = tree[lo]
            lo += 1
        if hi & 1:
            hi -= 1
            if tree[hi] < res:
                res = tree[hi]
        lo >>= 1
        hi >>= 1
    return res
