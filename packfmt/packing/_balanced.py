"""``balanced``: token capacity plus an image budget, with images spread evenly over packs.

Three steps (normative text: spec/packing.md, "balanced"):

1. Big items (2 * length > capacity), by length desc then index: the i-th opens pack i (no two
   big items can share a pack). P0 = max(#big, ceil(tokens / C), ceil(images / max_images),
   ceil(items / max_items)) packs are open after this step (the rest empty).
2. Phase A - the other items with images, sorted by (images desc, length desc, index asc), go
   to the pack with the fewest images among the packs that can take them (room, item limit,
   image budget); ties: the most remaining room, then the lowest pack id. If no pack can, a new
   one is opened. Open packs are kept in one max-heap (by room) per image level plus a max
   segment tree over levels, so a step costs O(log M + log P) amortised.
3. Phase B - the other items without images are placed by first fit decreasing into all packs
   (ids in order), opening new packs as needed.

Packs left empty are removed. Without images the result equals ``ffd``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ._common import group_by_pack, id_dtype, sort_by_length_desc
from ._first_fit import FirstFitPacker, any_fit_pack_bound
from ._trees import leftmost_ge, pow2_at_least, set_leaf_max

__all__ = ["balanced"]


@njit(cache=True, nogil=True, inline="always")
def _meld(a, b, rem, child, sibling):
    """Meld two pairing-heap roots; the pack with more room (then the lower id) wins."""
    if rem[b] > rem[a] or (rem[b] == rem[a] and b < a):
        a, b = b, a
    sibling[b] = child[a]
    child[a] = b
    return a


@njit(cache=True, nogil=True)
def _pop_root(root, rem, child, sibling, scratch):
    """Delete ``root`` from its heap (two-pass pairing); returns the new root or -1."""
    c = child[root]
    child[root] = -1
    if c == -1:
        return -1
    k = 0
    while c != -1:
        a = c
        b = sibling[a]
        sibling[a] = -1
        if b == -1:
            scratch[k] = a
            k += 1
            break
        c = sibling[b]
        sibling[b] = -1
        scratch[k] = _meld(a, b, rem, child, sibling)
        k += 1
    r = scratch[k - 1]
    for i in range(k - 2, -1, -1):
        r = _meld(scratch[i], r, rem, child, sibling)
    return r


@njit(cache=True, nogil=True)
def _push(p, level, roots, tree, size, rem, child, sibling):
    """Insert pack ``p`` into the heap of its image level and refresh that level's leaf."""
    child[p] = -1
    sibling[p] = -1
    old = roots[level]
    top = p if old == -1 else _meld(old, p, rem, child, sibling)
    roots[level] = top
    set_leaf_max(tree, size, level, rem[top])


@njit(cache=True, nogil=True)
def _phase_a_kernel(lengths, images, seq, capacity, max_items, max_images, n_initial,
                    rem, cnt, imgs, child, sibling, scratch, roots, tree, pack_of_pos):
    """Fewest-images-first placement of the image-bearing items ``seq``.

    Args:
        lengths, images: int64 (n_items,).
        seq: int64 (n,) items sorted by (images desc, length desc, index asc).
        capacity, max_items, max_images: per-pack limits (``max_images`` = number of levels - 1).
        n_initial: packs 0..n_initial-1 are open before the first item.
        rem, cnt, imgs: int64 (n_initial + n,) room, items and images per pack (set for the
            open packs).
        child, sibling, scratch: int64 (n_initial + n,) heap links and scratch.
        roots: int64 (max_images + 1,) -1-initialised heap root per image level.
        tree: int32 (2 * size,) -1-initialised max tree over levels (leaf = room of the roomiest pack).
        pack_of_pos: int64 (n,) receives each position's pack.
    Returns:
        Number of packs.
    """
    size = tree.shape[0] // 2
    for p in range(n_initial):
        if rem[p] > 0 and cnt[p] < max_items and imgs[p] < max_images:
            _push(p, imgs[p], roots, tree, size, rem, child, sibling)
    n_packs = n_initial
    for pos in range(seq.shape[0]):
        item = seq[pos]
        length = lengths[item]
        m = images[item]
        level = leftmost_ge(tree, size, length)
        if level != -1 and level <= max_images - m:
            p = roots[level]
            top = _pop_root(p, rem, child, sibling, scratch)
            roots[level] = top
            set_leaf_max(tree, size, level, -1 if top == -1 else rem[top])
        else:
            p = n_packs
            n_packs += 1
            rem[p] = capacity
        pack_of_pos[pos] = p
        rem[p] -= length
        cnt[p] += 1
        imgs[p] += m
        if rem[p] > 0 and cnt[p] < max_items and imgs[p] < max_images:
            _push(p, imgs[p], roots, tree, size, rem, child, sibling)
    return n_packs


def initial_packs(lengths, capacity, max_items, images, max_images) -> int:
    """P0: the largest of the token, image and item lower bounds (0 for no items)."""
    if lengths.shape[0] == 0:
        return 0
    p0 = -(-int(lengths.sum()) // capacity)
    if images is not None and max_images:
        p0 = max(p0, -(-int(images.sum()) // int(max_images)))
    if max_items:
        p0 = max(p0, -(-lengths.shape[0] // int(max_items)))
    return p0


def _image_levels(capacity, max_items, images, max_images) -> int:
    """Number of image levels 0..M: the budget M, or without one the most images a pack can hold."""
    if max_images is not None:
        return int(max_images) + 1
    most = int(images.max()) if images.size else 0
    items = capacity if max_items is None else min(capacity, int(max_items))
    return min(int(images.sum()), items * most) + 1


def balanced(lengths, capacity, max_items=None, images=None, max_images=None):
    """Balanced packing (module docstring).

    Args:
        lengths: int64 (n,) in [1, capacity].
        capacity: tokens per pack.
        max_items, max_images: per-pack limits or None.
        images: int64 (n,) images per item or None.
    Returns:
        ``(pack_offsets, order)`` as in ``PackResult``.
    """
    n = lengths.shape[0]
    img_item = images if images is not None else np.zeros(0, dtype=np.int64)
    seq, n_big, n_a = _placement_order(lengths, capacity, images)
    seq_big, seq_a, seq_b = seq[:n_big], seq[n_big: n_big + n_a], seq[n_big + n_a:]
    p0 = max(n_big, initial_packs(lengths, capacity, max_items, images, max_images))
    slots = p0 + n_a
    rem, cnt, imgs = (np.zeros(slots, dtype=np.int64) for _ in range(3))
    rem[:p0] = capacity
    rem[:n_big] -= lengths[seq_big]
    cnt[:n_big] = 1
    if images is not None:
        imgs[:n_big] = images[seq_big]
    pack_of_pos = np.empty(n, dtype=id_dtype(n))
    pack_of_pos[:n_big] = np.arange(n_big)
    n_packs = _phase_a(lengths, capacity, max_items, img_item, max_images, seq_a, p0, rem, cnt, imgs,
                       pack_of_pos[n_big: n_big + n_a])
    bound = n_packs + any_fit_pack_bound(int(lengths[seq_b].sum()), capacity, seq_b.shape[0])
    packer = FirstFitPacker(lengths, capacity, max_items, None, None, bound)
    packer.open_packs(capacity - rem[:n_packs], cnt[:n_packs], imgs[:n_packs])
    del rem, cnt, imgs
    packer.place(seq_b, out=pack_of_pos[n_big + n_a:])
    offsets, order = group_by_pack(seq, pack_of_pos, packer.n_packs)
    keep = np.concatenate([[True], offsets[1:] > offsets[:-1]])  # drop packs left empty
    return offsets[keep], order


def _placement_order(lengths, capacity, images):
    """Items in placement order: big items, then phase A, then phase B, each sorted as specified.

    Returns:
        (seq int64 (n,), number of big items, number of phase-A items).
    """
    seq = sort_by_length_desc(lengths, capacity)  # length desc, index asc
    n_big = int(np.count_nonzero(lengths > capacity // 2))  # 2 L > C; a prefix of seq
    if images is None:
        return seq, n_big, 0
    rest = seq[n_big:]
    has_img = images[rest] > 0
    n_a = int(np.count_nonzero(has_img))
    if n_a:
        with_img = rest[has_img]
        with_img = with_img[np.argsort(-images[with_img], kind="stable")]
        rest[n_a:] = rest[~has_img]
        rest[:n_a] = with_img
    return seq, n_big, n_a


def _phase_a(lengths, capacity, max_items, img_item, max_images, seq_a, p0, rem, cnt, imgs, pack_a):
    """Run phase A in place on the per-pack arrays and ``pack_a``; returns the number of packs."""
    levels = _image_levels(capacity, max_items, img_item, max_images)
    child, sibling, scratch = (np.zeros(rem.shape[0], dtype=np.int64) for _ in range(3))
    roots = np.full(levels, -1, dtype=np.int64)
    tree = np.full(2 * pow2_at_least(levels), -1, dtype=np.int32)
    no_limit = np.int64(1) << 62
    n_a = _phase_a_kernel(lengths, img_item, seq_a, int(capacity), no_limit if max_items is None else int(max_items),
                          levels - 1, p0, rem, cnt, imgs, child, sibling, scratch, roots, tree, pack_a)
    return n_a
