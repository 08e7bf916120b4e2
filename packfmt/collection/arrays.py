"""A collection's per-token and per-image arrays read as one, without copying a member's data.

What packing, materializing and validating a collection need beyond ``Collection`` itself: the
tokens (and loss mask) gathered by collection-wide token offset across members, and the image
token spans of all members in collection coordinates.
"""

from __future__ import annotations

import numpy as np

__all__ = ["MemberGather", "token_sources", "relative_image_spans", "image_token_spans"]


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
    """``(tokens, loss_mask)`` indexable by collection-wide (or store) token offsets; mask None if absent.

    In a collection with a loss mask, a member without one gives ones (spec/COLLECTION.md §6)."""
    if not hasattr(source, "members"):
        return source.tokens, source.loss_mask
    from .. import format as F

    tokens = MemberGather(source, "tokens", source.token_start, source.np_token_dtype)
    mask = None
    if source.has_loss_mask:
        mask = MemberGather(source, "loss_mask", source.token_start, F.MASK_DTYPE, filled=source.all_trained, fill=1)
    return tokens, mask


def relative_image_spans(coll) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Image token spans relative to their document start, and the doc->image CSR, over all members."""
    if coll.num_images == 0:
        return None, None
    from ..packindex import relative_image_spans as store_spans

    spans, offsets = [], [np.zeros(1, dtype=np.int64)]
    for m, entry in enumerate(coll.members):
        s, dio = store_spans(coll.member(m)) if entry.images else (None, None)
        if s is None:
            s, dio = np.zeros((0, 2), dtype=np.int64), np.zeros(entry.documents + 1, dtype=np.int64)
        spans.append(s)
        offsets.append(dio[1:] + int(coll.image_start[m]))
    return np.concatenate(spans), np.concatenate(offsets)


def image_token_spans(coll) -> np.ndarray | None:
    """int64 ``(images, 2)``: every member's image token spans in collection token offsets (sorted)."""
    if coll.num_images == 0:
        return None
    parts = []
    for m, entry in enumerate(coll.members):
        if entry.images:
            parts.append(np.asarray(coll.member(m).images.token_spans, dtype=np.int64) + int(coll.token_start[m]))
    return np.concatenate(parts)
