"""A dataset's per-token and per-image arrays read as one, without copying a member's data.

What packing, materializing, validating, describing and exporting need beyond the ``Dataset``
itself (a store is a collection of one): the tokens (and loss mask) by dataset-wide token offset,
and the image token spans of all members in dataset coordinates. Nothing here asks whether it
holds a store or a collection.
"""

from __future__ import annotations

import numpy as np

__all__ = ["MemberGather", "token_sources", "relative_image_spans", "member_image_table", "image_token_spans"]


class MemberGather:
    """``gather[idx]``: elements at collection-wide offsets ``idx`` of each member's ``attr`` array.

    Members are opened through the collection (its LRU bounds the maps held at once); each gather
    reads each member it touches once. ``fill``: the value of every element of a member flagged in
    ``filled`` (a member without a loss mask reads as ones, spec/COLLECTION.md §6); such a member is
    not opened.
    """

    def __init__(self, coll, attr: str, starts: np.ndarray, dtype, *, filled=(), fill=0) -> None:
        self.coll, self.attr, self.starts, self.dtype = coll, attr, np.asarray(starts, dtype=np.int64), np.dtype(dtype)
        self.filled, self.fill = tuple(filled), fill

    def __getitem__(self, idx) -> np.ndarray:
        idx = np.asarray(idx, dtype=np.int64)
        out = np.empty(idx.shape, dtype=self.dtype)
        if idx.size == 0:
            return out
        member = np.searchsorted(self.starts, idx, side="right") - 1
        order = np.argsort(member, kind="stable")
        sorted_members = member[order]
        cuts = np.flatnonzero(np.diff(sorted_members)) + 1
        for part in np.split(order, cuts):
            m = int(member[part[0]])
            if m < len(self.filled) and self.filled[m]:
                out[part] = self.fill
                continue
            src = getattr(self.coll.member(m), self.attr)
            out[part] = src[idx[part] - self.starts[m]]
        return out


def token_sources(source) -> tuple[object, object | None]:
    """``(tokens, loss_mask)`` indexable by dataset-wide token offsets; mask None if absent.

    One member with its own mask (or none): its memmaps themselves. Otherwise a gather across members,
    where a member without a mask gives ones in a dataset with one (spec/COLLECTION.md §6)."""
    from .. import format as F

    if source.num_members == 1 and not source.all_trained[0]:
        store = source.member(0)
        return store.tokens, store.loss_mask if source.has_loss_mask else None
    tokens = MemberGather(source, "tokens", source.token_start, source.np_token_dtype)
    mask = None
    if source.has_loss_mask:
        mask = MemberGather(source, "loss_mask", source.token_start, F.MASK_DTYPE, filled=source.all_trained, fill=1)
    return tokens, mask


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
        a, b = int(ds.doc_start[m]), int(ds.doc_start[m + 1])
        offsets[a + 1:b + 1] = dio[1:] + int(ds.image_start[m])
        offsets[b + 1:] = int(ds.image_start[m + 1])
    return np.concatenate(spans), offsets


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
