"""A dataset's per-token and per-image arrays read as one, without copying a member's data.

What packing, materializing, validating, describing and exporting need beyond the ``Dataset``
itself (a store is a collection of one): the tokens (and loss mask) by dataset-wide token offset,
and the image token spans of all members in dataset coordinates. Nothing here asks whether it
holds a store or a collection: ``MemberArray`` is what a collection gives as ``tokens``, ``loss_mask``
and its images' arrays (spec/COLLECTION.md §6: the arrays a physical merge of its members would have).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

__all__ = ["MemberArray", "whole_array", "token_sources", "relative_image_spans", "doc_image_offsets",
           "member_image_table", "image_token_spans"]


class MemberArray:
    """One read-only array over the same array of every member, end to end, as a physical merge writes it (spec/
    COLLECTION.md §7.1): element ``i`` of member ``m``'s array (``of_member(store)``) is element ``starts[m] + i``,
    plus ``shift[m]`` when given (offsets and spans move by what the members before ``m`` hold).

    Nothing is read until it is indexed, and then only the members the index touches, opened through the
    collection (its LRU bounds the maps held at once). An integer gives an element (a row for 2-D arrays), a slice
    inside one member a view of its memmap (no copy, without ``shift``), any other slice or an integer array a new
    array, gathered member by member. ``numpy.asarray`` reads it whole: memory for the whole array. ``fill``: the
    value of every element of a member flagged in ``filled`` (a member without a loss mask reads as ones, §6),
    which is never opened.
    """

    def __init__(self, coll, of_member: Callable, starts, dtype, *, row: tuple[int, ...] = (), filled=(), fill=0,
                 shift=None) -> None:
        self.coll, self.of_member, self.starts = coll, of_member, np.asarray(starts, dtype=np.int64)
        self.dtype, self.row = np.dtype(dtype), tuple(row)
        self.filled, self.fill = tuple(filled), fill
        self.shift = None if shift is None else np.asarray(shift, dtype=np.int64)

    @property
    def shape(self) -> tuple[int, ...]:
        return (int(self.starts[-1]),) + self.row

    @property
    def ndim(self) -> int:
        return 1 + len(self.row)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __repr__(self) -> str:
        return f"MemberArray(shape={self.shape}, dtype={self.dtype}, members={self.starts.shape[0] - 1})"

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = self[0:len(self)]
        return out if dtype is None else out.astype(dtype, copy=False)

    def __getitem__(self, key):
        if isinstance(key, tuple):  # (rows, columns...): the rows first, then the rest on them
            head = self[key[0]]
            return head[key[1:]] if isinstance(key[0], (int, np.integer)) else head[(slice(None),) + key[1:]]
        if isinstance(key, (int, np.integer)):
            n = len(self)
            if not -n <= key < n:
                raise IndexError(f"index {key} out of range [0, {n})")
            i = int(key) % n
            m = self._member_of(i)
            return self._piece(m, i - int(self.starts[m]), i - int(self.starts[m]) + 1)[0]
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            if step == 1:
                return self._range(start, max(start, stop))
            key = np.arange(start, stop, step, dtype=np.int64)
        return self._gather(np.asarray(key))

    def _member_of(self, idx):
        return np.searchsorted(self.starts, idx, side="right") - 1

    def _piece(self, m: int, a: int, b: int) -> np.ndarray:
        """Elements ``[a, b)`` of member ``m``'s own array, shifted: a view of its memmap when nothing is added."""
        if m < len(self.filled) and self.filled[m]:
            return np.full((b - a,) + self.row, self.fill, dtype=self.dtype)
        part = self.of_member(self.coll.member(m))[a:b]
        return part if self.shift is None else (part + self.shift[m]).astype(self.dtype, copy=False)

    def _range(self, start: int, stop: int) -> np.ndarray:
        if start == stop:
            return np.empty((0,) + self.row, dtype=self.dtype)
        first, last = int(self._member_of(start)), int(self._member_of(stop - 1))
        parts = [self._piece(m, max(start, int(self.starts[m])) - int(self.starts[m]),
                             min(stop, int(self.starts[m + 1])) - int(self.starts[m]))
                 for m in range(first, last + 1) if self.starts[m + 1] > self.starts[m]]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _gather(self, idx: np.ndarray) -> np.ndarray:
        if idx.dtype == np.bool_:
            if idx.shape != (len(self),):
                raise IndexError(f"boolean index of shape {idx.shape} for an array of length {len(self)}")
            idx = np.flatnonzero(idx)
        if idx.size and idx.dtype.kind not in "iu":
            raise IndexError(f"only integers, slices and integer or boolean arrays are valid indices, not {idx.dtype}")
        idx = idx.astype(np.int64, copy=False)
        n = len(self)
        if idx.size and (idx.min() < -n or idx.max() >= n):
            raise IndexError(f"index out of range [0, {n})")
        idx = np.where(idx < 0, idx + n, idx)
        out = np.empty(idx.shape + self.row, dtype=self.dtype)
        if idx.size == 0:
            return out
        flat, view = idx.reshape(-1), out.reshape((-1,) + self.row)
        member = self._member_of(flat)
        order = np.argsort(member, kind="stable")
        for part in np.split(order, np.flatnonzero(np.diff(member[order])) + 1):  # each member it touches, once
            m = int(member[part[0]])
            local = flat[part] - int(self.starts[m])
            if m < len(self.filled) and self.filled[m]:
                view[part] = self.fill
                continue
            values = np.asarray(self.of_member(self.coll.member(m)))[local]
            view[part] = values if self.shift is None else values + self.shift[m]
        return out


def whole_array(ds, name: str):
    """``ds.tokens`` (``name`` ``"tokens"``) or ``ds.loss_mask`` (``"loss_mask"``; None without one) of a collection:
    one member with its own mask (or none), its memmap itself; otherwise a ``MemberArray`` over the members, where
    a member without a mask reads as ones in a dataset with one (spec/COLLECTION.md §6)."""
    from .. import format as F

    if name == "loss_mask" and not ds.has_loss_mask:
        return None
    if ds.num_members == 1 and not ds.all_trained[0]:
        return getattr(ds.member(0), name)
    if name == "tokens":
        return MemberArray(ds, lambda s: s.tokens, ds.token_start, ds.np_token_dtype)
    return MemberArray(ds, lambda s: s.loss_mask, ds.token_start, F.MASK_DTYPE, filled=ds.all_trained, fill=1)


def token_sources(source) -> tuple[object, object | None]:
    """``(tokens, loss_mask)`` indexable by dataset-wide token offsets; mask None if absent: a store's memmaps, a
    collection's ``MemberArray`` views (``whole_array``)."""
    return source.tokens, source.loss_mask if source.has_loss_mask else None


def _member_images(ds):
    """``(m, member store)`` of every member that holds images."""
    for m in range(ds.num_members):
        if ds.image_start[m + 1] > ds.image_start[m]:
            yield m, ds.member(m)


def relative_image_spans(ds) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Image token spans relative to their document start, and the doc->image CSR offsets, over all members
    (``(None, None)`` without images)."""
    if ds.num_images == 0:
        return None, None
    spans = [np.zeros((0, 2), dtype=np.int64)]
    offsets = np.zeros(ds.num_documents + 1, dtype=np.int64)
    for m, store in _member_images(ds):
        dio, rel = member_image_table(store)
        spans.append(rel)
        _place_offsets(offsets, ds, m, dio)
    return np.concatenate(spans), offsets


def doc_image_offsets(ds) -> np.ndarray:
    """int64 ``(documents + 1,)``: the dataset's ``doc_image_offsets``, as a physical merge writes it (spec/
    COLLECTION.md §7.1: each member's shifted by the images before it; a member without images adds none)."""
    offsets = np.zeros(ds.num_documents + 1, dtype=np.int64)
    for m, store in _member_images(ds):
        _place_offsets(offsets, ds, m, store.images.doc_image_offsets)
    return offsets


def _place_offsets(offsets: np.ndarray, ds, m: int, dio) -> None:
    """Member ``m``'s doc -> image offsets ``dio`` into the dataset's ``offsets`` (and the members after it start
    past its images)."""
    a, b = int(ds.doc_start[m]), int(ds.doc_start[m + 1])
    offsets[a + 1:b + 1] = np.asarray(dio[1:], dtype=np.int64) + int(ds.image_start[m])
    offsets[b + 1:] = int(ds.image_start[m + 1])


def member_image_table(store) -> tuple[np.ndarray, np.ndarray]:
    """int64 copies (none keeps the store's files mapped) of a store's ``doc_image_offsets`` and of its image token
    spans relative to their document start."""
    images = store.images
    dio = np.array(images.doc_image_offsets, dtype=np.int64)
    doc_of_image = np.repeat(np.arange(store.num_documents, dtype=np.int64), np.diff(dio))
    doc_begin = np.asarray(store.doc_offsets, dtype=np.int64)[doc_of_image]
    rel = np.asarray(images.token_spans, dtype=np.int64) - doc_begin[:, None]
    return dio, rel


def image_token_spans(ds) -> np.ndarray | None:
    """int64 ``(images, 2)``: every member's image token spans in dataset token offsets (sorted)."""
    if ds.num_images == 0:
        return None
    return np.concatenate([np.asarray(store.images.token_spans, dtype=np.int64) + int(ds.token_start[m])
                           for m, store in _member_images(ds)])
