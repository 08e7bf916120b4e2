"""What ``write_shards`` cuts its shards from: a bounded run of the source index's segments at a time.

``Source(ds).chunk(segs)`` describes segments ``(d, b, e)`` (rows of the index's ``segments.bin``, in pack
order) as OUT's documents (spec/COLLECTION.md §9.1): where their tokens start in the dataset, their
lookahead bits, their lengths ``L = e - b + a``, the images whose runs start inside them and the bytes
each takes in a shard. Everything is looked up in the members' own memory-mapped arrays (document
offsets, image spans and offsets) for the chunk's segments only: nothing the size of the index or of
the dataset is built, so ``write_shards`` holds what one chunk needs, whatever the number of segments.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..writer import ImageRecord
from .arrays import token_sources

__all__ = ["Chunk", "Source"]


@dataclass
class Chunk:
    """Segments of the source index as OUT's documents, one entry per segment (int64 unless said)."""

    start: np.ndarray  #: dataset-wide token offset of the segment's first token
    seg_len: np.ndarray  #: ``e - b``: the tokens the index covers
    ahead: np.ndarray  #: bool, the lookahead bit ``a``
    length: np.ndarray  #: ``L = e - b + a``: the shard document's tokens
    member: np.ndarray  #: the source member holding the segment
    local_start: np.ndarray  #: the segment's first token in its member's token offsets
    image0: np.ndarray | None  #: the member's first image whose run starts inside the segment (None: no images)
    image1: np.ndarray | None  #: one past its last
    nbytes: np.ndarray  #: what the document takes in a shard: tokens (and mask bytes) plus encoded images
    imaged: np.ndarray  #: the positions in the chunk of the segments that carry images, increasing

    def __len__(self) -> int:
        return int(self.start.shape[0])


class Source:
    """The dataset the shards are cut from: its tokens and loss mask by dataset-wide offset, and its members."""

    def __init__(self, ds) -> None:
        self.ds = ds
        self.tokens, self.mask = token_sources(ds)
        self.per_token = ds.np_token_dtype.itemsize + (1 if ds.has_loss_mask else 0)
        self.has_images = ds.num_images > 0

    def chunk(self, segs) -> Chunk:
        """``segs``: ``(n, 3)`` rows ``(d, b, e)`` of the source index (a slice of its memory map)."""
        ds = self.ds
        segs = np.asarray(segs, dtype=np.int64)
        d, b, e = segs[:, 0], segs[:, 1], segs[:, 2]
        n = d.shape[0]
        member = np.searchsorted(ds.doc_start, d, side="right") - 1
        doc_begin, doc_end = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)  # member token offsets
        image0 = image1 = None
        if self.has_images:
            image0, image1 = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
        image_bytes = np.zeros(n, dtype=np.int64)
        order = np.argsort(member, kind="stable")
        for part in np.split(order, np.flatnonzero(np.diff(member[order])) + 1):
            if part.size == 0:
                continue
            m = int(member[part[0]])
            store, local = ds.member(m), d[part] - int(ds.doc_start[m])
            off = store.doc_offsets
            doc_begin[part], doc_end[part] = off[local], off[local + 1]
            if image0 is not None and ds.image_start[m + 1] > ds.image_start[m]:
                # the images of a segment: those whose run starts inside it (V28: a run is never cut), found
                # among its document's images (sorted, FORMAT.md V19) by a vectorised binary search
                images = store.images
                lo, hi = images.doc_image_offsets[local], images.doc_image_offsets[local + 1]
                first = doc_begin[part] + b[part]
                image0[part] = _lower_bound(images.token_spans, lo, hi, first)
                image1[part] = _lower_bound(images.token_spans, lo, hi, first + e[part] - b[part])
                image_bytes[part] = images.offsets[image1[part]] - images.offsets[image0[part]]
        local_start = doc_begin + b
        start = np.asarray(ds.token_start, dtype=np.int64)[member] + local_start
        seg_len = e - b
        ahead = doc_begin + e < doc_end  # the segment ends before its document does ...
        if self.mask is not None and ahead.any():  # ... and the next token is a training target (FORMAT.md §7)
            at = np.flatnonzero(ahead)
            ahead[at] = np.asarray(self.mask[start[at] + seg_len[at]]) == 1
        length = seg_len + ahead
        imaged = np.zeros(0, dtype=np.int64) if image0 is None else np.flatnonzero(image1 > image0)
        return Chunk(start, seg_len, ahead, length, member, local_start, image0, image1,
                     length * self.per_token + image_bytes, imaged)

    def images(self, c: Chunk, k: int) -> list[ImageRecord]:
        """The images of the chunk's segment ``k`` as records of its shard document (runs relative to its start)."""
        if c.image0 is None or c.image1[k] <= c.image0[k]:
            return []
        images, begin = self.ds.member(int(c.member[k])).images, int(c.local_start[k])
        out = []
        for j in range(int(c.image0[k]), int(c.image1[k])):
            (width, height), (s, t) = images.size(j), images.token_spans[j]
            out.append(ImageRecord(bytes(images.data(j)), width, height, images.codec(j), int(s) - begin, int(t) - begin))
        return out


def _lower_bound(spans, lo: np.ndarray, hi: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Per query, the first ``i`` in ``[lo, hi)`` with ``spans[i, 0] >= target`` (``hi`` if none); ``spans`` sorted
    by its first column on each range. Reads ``spans`` (a memory map) at the probed rows only."""
    lo, hi = np.array(lo, dtype=np.int64), np.array(hi, dtype=np.int64)
    live = np.flatnonzero(lo < hi)
    while live.size:
        mid = (lo[live] + hi[live]) // 2
        below = np.asarray(spans[mid, 0]) < target[live]
        lo[live[below]] = mid[below] + 1
        hi[live[~below]] = mid[~below]
        live = live[lo[live] < hi[live]]
    return lo
