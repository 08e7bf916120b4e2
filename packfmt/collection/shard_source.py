"""What ``write_shards`` cuts its shards from: per source segment, its tokens, lookahead bit and images
(spec/COLLECTION.md §9.1)."""

from __future__ import annotations

import numpy as np

from ..writer import ImageRecord
from .arrays import image_token_spans

__all__ = ["Source", "images_of", "lookahead"]


def lookahead(segs: np.ndarray, off: np.ndarray, mask) -> np.ndarray:
    """bool per segment: it ends before its document does and the next token is a training target
    (its mask bit is 1, or the dataset has no mask), so the label at its cut is that token (FORMAT.md §7)."""
    end = off[segs[:, 0]] + segs[:, 2]
    ahead = end < off[segs[:, 0] + 1]
    if mask is not None and ahead.any():
        at = np.flatnonzero(ahead)
        ahead[at] = np.asarray(mask[end[at]]) == 1
    return ahead


def images_of(ds) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Every image's global token span (sorted) and encoded size, in dataset image order."""
    if ds.num_images == 0:
        return None, None
    sizes = [np.diff(np.asarray(ds.member(m).images.offsets, dtype=np.int64)) for m in range(ds.num_members)
             if ds.image_start[m + 1] > ds.image_start[m]]
    return image_token_spans(ds), np.concatenate(sizes)


class Source:
    """What the shards are cut from, per source segment in index order."""

    def __init__(self, ds, tokens, mask, start, seg_len, ahead, spans, first_image, last_image) -> None:
        self.ds, self.tokens, self.mask = ds, tokens, mask
        self.start, self.length = start, seg_len + ahead  # the shard document: the segment and its lookahead
        self.spans, self.first_image, self.last_image = spans, first_image, last_image

    def images(self, s: int, doc_start: int) -> list[ImageRecord]:
        """The images of segment ``s`` as records of its shard document (spans relative to ``doc_start``)."""
        if self.spans is None:
            return []
        out = []
        for i in range(int(self.first_image[s]), int(self.last_image[s])):
            m = int(np.searchsorted(self.ds.image_start, i, side="right")) - 1
            store, j = self.ds.member(m), i - int(self.ds.image_start[m])
            (width, height), (b, e) = store.images.size(j), self.spans[i]
            out.append(ImageRecord(bytes(store.images.data(j)), width, height, store.images.codec(j),
                                   int(b) - doc_start, int(e) - doc_start))
        return out
