"""Packing algorithms: lengths (and image counts) in, a CSR pack assignment out. No I/O.

The normative description of every algorithm (order, tie-breaks, complexity) is spec/packing.md.

    >>> import numpy as np
    >>> r = pack_items(np.array([3, 5, 2, 4]), capacity=8, algorithm="ffd")
    >>> r.packs()
    [[1, 0], [3, 2]]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._balanced import balanced
from ._best_fit import best_fit
from ._common import group_by_pack, group_by_pack_with_lengths, id_dtype, sort_runs_desc
from ._first_fit import any_fit_pack_bound, first_fit
from ._next_fit import next_fit
from .segment import Segmentation, segment_documents

__all__ = ["ALGORITHMS", "PackResult", "Segmentation", "pack_items", "pack_stats", "segment_documents"]

ALGORITHMS = ("ffd", "bfd", "first_fit_shuffle", "shuffle_and_pack", "greedy", "balanced", "pad")


@dataclass(frozen=True)
class PackResult:
    """Assignment of items to packs, as CSR arrays.

    Attributes:
        pack_offsets: int64 (n_packs + 1,); pack ``p`` is ``order[pack_offsets[p]:pack_offsets[p + 1]]``.
        order: int64 (n_items,) item indices grouped by pack, in insertion order within a pack;
            int32 when ``pack_items(..., compact=True)`` and ``n_items < 2**31 - 1``.
        item_lengths: the lengths of ``order``'s items in its order (``lengths[order]``, of ``order``'s
            dtype) where the packing knew them without reading one per item (``ffd`` and ``bfd`` of a
            counting sort), else None.
    """

    pack_offsets: np.ndarray
    order: np.ndarray
    item_lengths: np.ndarray | None = None

    @property
    def n_packs(self) -> int:
        return int(self.pack_offsets.shape[0] - 1)

    @property
    def n_items(self) -> int:
        return int(self.order.shape[0])

    @property
    def items_per_pack(self) -> np.ndarray:
        """int64 (n_packs,)."""
        return np.diff(self.pack_offsets)

    def pack_of_item(self) -> np.ndarray:
        """int64 (n_items,): the pack holding each item."""
        out = np.empty(self.n_items, dtype=np.int64)
        out[self.order] = np.repeat(np.arange(self.n_packs, dtype=np.int64), self.items_per_pack)
        return out

    def pack_sums(self, values: np.ndarray) -> np.ndarray:
        """Per-pack sums of a per-item array (e.g. lengths -> tokens per pack); (n_packs,)."""
        if self.n_packs == 0:
            return np.zeros(0, dtype=np.asarray(values).dtype)
        return np.add.reduceat(np.asarray(values)[self.order], self.pack_offsets[:-1])

    def packs(self) -> list[list[int]]:
        """Item indices per pack as Python lists (for small inputs and tests only)."""
        return [self.order[a:b].tolist() for a, b in zip(self.pack_offsets[:-1], self.pack_offsets[1:])]


def _as_int_array(x, name: str, keep_int32: bool = False) -> np.ndarray:
    """1-D int64, or int32 as given when ``keep_int32`` (lengths: every value is <= capacity < 2**31, so
    the narrow array the caller built is used as is, not copied)."""
    a = np.asarray(x)
    if a.ndim != 1 or (a.size and not np.issubdtype(a.dtype, np.integer)):
        raise ValueError(f"{name} must be a 1-D integer array")
    if keep_int32 and a.dtype == np.int32:
        return np.ascontiguousarray(a)
    return np.ascontiguousarray(a, dtype=np.int64)


def _check_limit(value, name: str) -> int | None:
    if value is None:
        return None
    if int(value) != value or value < 1:
        raise ValueError(f"{name} must be an integer >= 1 or None, got {value!r}")
    return int(value)


def _validate(lengths, capacity, algorithm, max_items, image_counts, max_images):
    """Normalise and check the arguments of ``pack_items``; raise ValueError on bad input."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    if int(capacity) != capacity or not 1 <= capacity < 2**31 - 1:
        raise ValueError(f"capacity must be an integer in [1, 2**31 - 2], got {capacity!r}")
    lengths = _as_int_array(lengths, "lengths", keep_int32=True)
    if lengths.size and (lengths.min() < 1 or lengths.max() > capacity):
        bad = int(np.flatnonzero((lengths < 1) | (lengths > capacity))[0])
        raise ValueError(f"item {bad} has length {int(lengths[bad])}; every length must be in [1, {int(capacity)}]"
                         " (cut long documents with segment_documents first)")
    max_items = _check_limit(max_items, "max_items_per_pack")
    if max_images is not None and (int(max_images) != max_images or max_images < 0):
        raise ValueError(f"max_images_per_pack must be an integer >= 0 or None, got {max_images!r}")
    if image_counts is not None:
        image_counts = _as_int_array(image_counts, "image_counts")
        if image_counts.shape != lengths.shape:
            raise ValueError(f"image_counts has shape {image_counts.shape}, lengths {lengths.shape}")
        if image_counts.size and image_counts.min() < 0:
            raise ValueError("image_counts must be >= 0")
        if max_images is not None and image_counts.size and image_counts.max() > max_images:
            bad = int(np.argmax(image_counts))
            raise ValueError(f"item {bad} has {int(image_counts[bad])} images, more than max_images_per_pack="
                             f"{int(max_images)}; it fits in no pack")
    return lengths, int(capacity), max_items, image_counts, (None if max_images is None else int(max_images))


def pack_items(lengths, capacity, algorithm="ffd", *, seed=0, max_items_per_pack=None, image_counts=None,
               max_images_per_pack=None, compact=False) -> PackResult:
    """Assign every item to exactly one pack.

    Args:
        lengths: int (n_items,) tokens per item, each in [1, capacity]; an int32 array is used
            without a copy (the lengths are never widened: capacity < 2**31).
        capacity: tokens per pack.
        algorithm: one of ``ALGORITHMS`` (spec/packing.md).
        seed: seed of ``first_fit_shuffle`` / ``shuffle_and_pack`` (``np.random.default_rng``);
            ``None`` means 0, so every result is reproducible. Ignored by the others.
        max_items_per_pack: at most this many items per pack (None: unlimited).
        image_counts: int (n_items,) images per item (None: no images).
        max_images_per_pack: at most this many images per pack (None: unlimited).
        compact: item ids in int32 when ``n_items < 2**31 - 1`` (placement order and ``order``;
            ffd, bfd and first_fit_shuffle): 4 bytes per item instead of 8 for each of them.
            The packs are the same either way.
    Returns:
        The PackResult. No pack exceeds any limit; no pack is empty.
    Raises:
        ValueError: a length outside [1, capacity], an item with more images than the budget, or
            a bad argument.
    """
    lengths, capacity, max_items, images, max_images = _validate(
        lengths, capacity, algorithm, max_items_per_pack, image_counts, max_images_per_pack)
    n = lengths.shape[0]
    if n == 0:
        return PackResult(np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int64))
    limits = dict(max_items=max_items, images=images, max_images=max_images)
    if algorithm == "pad":
        return PackResult(np.arange(n + 1, dtype=np.int64), np.arange(n, dtype=np.int64))
    if algorithm in ("greedy", "shuffle_and_pack"):
        seq = np.arange(n, dtype=np.int64) if algorithm == "greedy" else _permutation(n, seed)
        return PackResult(next_fit(lengths, seq, capacity, **limits), seq)
    if algorithm == "balanced":
        return PackResult(*balanced(lengths, capacity, **limits))
    ids = id_dtype(n) if compact else np.int64
    run_ends = None  # where each length's run ends in seq, when sorted by counting
    if algorithm == "first_fit_shuffle":
        seq = _permutation(n, seed).astype(ids, copy=False)
        pack_of_pos, n_packs = first_fit(lengths, seq, capacity, **limits)
    else:
        seq, run_ends = sort_runs_desc(lengths, capacity, ids)
        if algorithm == "ffd":
            pack_of_pos, n_packs = first_fit(lengths, seq, capacity, **limits)
        else:
            bound = any_fit_pack_bound(int(lengths.sum()), capacity, n)
            pack_of_pos, n_packs = best_fit(lengths, seq, capacity, pack_cap=bound, **limits)
    if run_ends is not None:  # the lengths in pack order come free of the sort (seq's memory holds them)
        return PackResult(*group_by_pack_with_lengths(seq, pack_of_pos, n_packs, run_ends))
    offsets, order = group_by_pack(seq, pack_of_pos, n_packs)
    del seq, pack_of_pos  # before the caller's next step: order is all that is kept
    return PackResult(offsets, order)


def _permutation(n: int, seed) -> np.ndarray:
    """The seeded permutation of the shuffled algorithms: ``default_rng(seed).permutation(n)``."""
    return np.random.default_rng(0 if seed is None else seed).permutation(n).astype(np.int64, copy=False)


def _summary(values: np.ndarray, with_std: bool = False) -> dict:
    if values.size == 0:
        out = {"mean": 0.0, "max": 0, "min": 0}
        return {**out, "std": 0.0} if with_std else out
    out = {"mean": float(values.mean()), "max": int(values.max()), "min": int(values.min())}
    if with_std:
        out["std"] = float(values.std())
    return out


def pack_stats(lengths, result: PackResult, capacity, image_counts=None, pack_tokens=None) -> dict:
    """JSON-able statistics of a packing.

    Returns:
        ``packs``, ``items``, ``tokens``, ``capacity``, ``fill_efficiency`` (tokens / (packs *
        capacity)), ``lower_bound`` (ceil(tokens / capacity)), ``packs_over_lower_bound``
        (packs - lower_bound), ``max_pack_tokens``, ``items_per_pack`` {mean, max, min} and, when
        ``image_counts`` is given, ``images`` and ``images_per_pack`` {mean, max, min, std}.
        ``pack_tokens`` (tokens per pack) may be passed when the caller has summed them already (the
        total is then theirs: O(packs), no pass over ``lengths``).
    """
    lengths = np.asarray(lengths)  # int32 or int64; summed in int64, never copied
    per_pack_tokens = result.pack_sums(lengths) if pack_tokens is None else np.asarray(pack_tokens)
    # every item in one pack: the tokens given per pack are the items' (O(packs), no pass over the lengths)
    tokens = int((lengths if pack_tokens is None else per_pack_tokens).sum(dtype=np.int64))
    capacity = int(capacity)
    packs = result.n_packs
    lower = -(-tokens // capacity)
    stats = {
        "packs": packs,
        "items": result.n_items,
        "tokens": tokens,
        "capacity": capacity,
        "fill_efficiency": tokens / (packs * capacity) if packs else 0.0,
        "lower_bound": lower,
        "packs_over_lower_bound": packs - lower,
        "max_pack_tokens": int(per_pack_tokens.max()) if packs else 0,
        "items_per_pack": _summary(result.items_per_pack),
    }
    if image_counts is not None:
        images = np.asarray(image_counts, dtype=np.int64)
        stats["images"] = int(images.sum())
        stats["images_per_pack"] = _summary(result.pack_sums(images), with_std=True)
    return stats
