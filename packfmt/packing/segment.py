"""Oversize handling: turn documents into packable segments of at most ``capacity`` tokens.

Documents that fit are one segment each (vectorised; when every document fits, nothing per segment
is allocated at all). Longer documents are split, truncated or dropped by a small numba loop over
the oversize documents only. A cut never falls strictly
inside an image's token run (spec/packing.md, "Segmentation").
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ._common import id_dtype

__all__ = ["OVERSIZE_POLICIES", "Segmentation", "segment_documents"]

OVERSIZE_POLICIES = ("split", "truncate", "drop")


class Segmentation:
    """Segments of documents, each at most ``capacity`` tokens.

    Three representations behind one interface. In the common case (every document non-empty and
    at most ``capacity`` tokens) segment ``j`` is the whole document ``j`` and nothing per segment
    is stored beyond the document lengths. Otherwise (``segment_documents`` with a document to
    cut, drop or skip) each segment keeps its document id (int32 below 2^31 - 1 documents) and its
    length (int32: at most the capacity), and only the segments that start inside their document
    keep that start: 8 bytes per segment instead of the 24 of its row. ``segments`` is built only
    when asked for; callers that stream (``build_pack_index``) use ``lengths`` and ``rows(idx)``.

    Attributes:
        segments: int64 (n_segments, 3) rows ``(doc, begin, end)``; token offsets relative to the
            document start, ``0 <= begin < end <= doc_len``; sorted by ``(doc, begin)``.
        image_counts: int64 (n_segments,) images whose token run lies inside the segment.
        dropped_docs: documents with no segment (``drop`` policy, or empty documents).
        dropped_tokens: tokens of the dropped documents.
        split_docs: documents cut into two or more segments (``split`` policy).
        truncated_docs: documents cut to their first segment (``truncate`` policy).
        truncated_tokens: tokens removed by truncation.
    """

    def __init__(self, segments: np.ndarray | None, image_counts: np.ndarray | None, dropped_docs: int = 0,
                 dropped_tokens: int = 0, split_docs: int = 0, truncated_docs: int = 0, truncated_tokens: int = 0,
                 *, whole_lengths: np.ndarray | None = None, compact: tuple | None = None) -> None:
        if sum(x is not None for x in (segments, whole_lengths, compact)) != 1:
            raise ValueError("give exactly one of segments, whole_lengths and compact")
        self._segments = segments
        self._whole = whole_lengths
        # compact: (doc, length, piece_ids, piece_begin): segment j is (doc[j], b, b + length[j]) where b
        # is piece_begin[i] if piece_ids[i] == j (piece_ids sorted), else 0
        self._compact = compact
        self._image_counts = image_counts
        self.dropped_docs = dropped_docs
        self.dropped_tokens = dropped_tokens
        self.split_docs = split_docs
        self.truncated_docs = truncated_docs
        self.truncated_tokens = truncated_tokens

    @classmethod
    def whole_documents(cls, doc_lengths: np.ndarray, image_counts: np.ndarray | None = None) -> "Segmentation":
        """One segment per document, ``(d, 0, len_d)``: every length must be in ``[1, capacity]``
        (int32 or int64 lengths, kept as given)."""
        return cls(None, image_counts, whole_lengths=doc_lengths)

    @property
    def is_whole_documents(self) -> bool:
        """True when segment ``j`` is document ``j`` entire (nothing cut, nothing dropped)."""
        return self._whole is not None

    @property
    def num_segments(self) -> int:
        if self._compact is not None:
            return int(self._compact[0].shape[0])
        return int(self._whole.shape[0] if self._whole is not None else self._segments.shape[0])

    @property
    def segments(self) -> np.ndarray:
        if self._segments is None:
            self._segments = self.rows(np.arange(self.num_segments, dtype=np.int64))
        return self._segments

    @property
    def image_counts(self) -> np.ndarray:
        if self._image_counts is None:
            self._image_counts = np.zeros(self.num_segments, dtype=np.int64)
        return self._image_counts

    @property
    def lengths(self) -> np.ndarray:
        """(n_segments,) tokens per segment: the document lengths themselves, not a copy, when whole
        (int32 when the caller gave int32 lengths), else int64."""
        if self._whole is not None:
            return self._whole
        if self._compact is not None:
            return self._compact[1]
        return self._segments[:, 2] - self._segments[:, 1]

    def rows(self, idx: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """int64 (len(idx), 3): the rows ``(doc, begin, end)`` of segments ``idx`` (int32 or int64), in
        that order; written into ``out`` (a buffer of at least ``len(idx)`` rows) when given."""
        idx = np.asarray(idx)
        if idx.dtype not in (np.int32, np.int64):
            idx = idx.astype(np.int64)
        n = idx.shape[0]
        out = np.empty((n, 3), dtype=np.int64) if out is None else out[:n]
        if self._whole is not None:
            _whole_rows(idx, self._whole, out)
        elif self._compact is not None:
            _compact_rows(idx, *self._compact, out)
        else:
            np.take(self._segments, idx, axis=0, out=out)
        return out

    def __repr__(self) -> str:
        return (f"Segmentation(segments={self.num_segments}, whole_documents={self.is_whole_documents}, "
                f"dropped_docs={self.dropped_docs}, split_docs={self.split_docs}, "
                f"truncated_docs={self.truncated_docs})")


@njit(cache=True, nogil=True, inline="always")
def whole_row(out, i, d, lengths):
    """``out[i] = (d, 0, lengths[d])``: the row of whole document ``d`` as a segment; returns its length."""
    n = lengths[d]
    out[i, 0] = d
    out[i, 1] = 0
    out[i, 2] = n
    return n


@njit(cache=True, nogil=True)
def _whole_rows(idx, lengths, out):
    """``out[i] = (idx[i], 0, lengths[idx[i]])``: rows of whole-document segments, in one pass."""
    for i in range(idx.shape[0]):
        whole_row(out, i, idx[i], lengths)


@njit(cache=True, nogil=True)
def _compact_rows(idx, doc, length, piece_ids, piece_begin, out):
    """``out[i] = (doc[j], b, b + length[j])`` for ``j = idx[i]``, ``b`` found by binary search in ``piece_ids``.

    Only a segment that follows one of its own document (``doc[j - 1] == doc[j]``: the segments are
    sorted by document and start) starts inside it, so the search runs for those alone.
    """
    k = piece_ids.shape[0]
    for i in range(idx.shape[0]):
        j = idx[i]
        b = 0
        if k > 0 and j > 0 and doc[j - 1] == doc[j]:
            pos = np.searchsorted(piece_ids, j)
            if pos < k and piece_ids[pos] == j:
                b = piece_begin[pos]
        out[i, 0] = doc[j]
        out[i, 1] = b
        out[i, 2] = b + length[j]


@njit(cache=True, nogil=True, inline="always")
def _next_cut(start, doc_len, capacity, spans, j, hi):
    """Where the piece starting at ``start`` ends, and the first image after it.

    Args:
        start: piece start (never strictly inside an image run).
        doc_len: document length.
        capacity: tokens per pack.
        spans: int64 (n_images, 2) image runs (relative to the document), sorted, disjoint.
        j, hi: the document's images not yet assigned to a piece are rows ``j..hi-1``.
    Returns:
        (cut, k): the piece is ``[start, cut)`` and holds images ``j..k-1``.
    """
    limit = start + capacity
    if limit >= doc_len:
        return doc_len, hi
    k = j
    while k < hi and spans[k, 1] <= limit:
        k += 1
    if k < hi and spans[k, 0] < limit:  # limit falls strictly inside image k: cut before it
        return spans[k, 0], k
    return limit, k


@njit(cache=True, nogil=True)
def _count_pieces(docs, doc_lengths, capacity, truncate, spans, img_off, counts):
    """``counts[i]``: the pieces of oversize document ``docs[i]`` (1 when ``truncate``)."""
    for i in range(docs.shape[0]):
        d = docs[i]
        doc_len = doc_lengths[d]
        j = img_off[d] if img_off.shape[0] > 0 else 0
        hi = img_off[d + 1] if img_off.shape[0] > 0 else 0
        start = 0
        pieces = 0
        while start < doc_len:
            cut, k = _next_cut(start, doc_len, capacity, spans, j, hi)
            pieces += 1
            start = cut
            j = k
            if truncate:
                break
        counts[i] = pieces


@njit(cache=True, nogil=True)
def _fill_segments(doc_lengths, capacity, policy, spans, img_off, per_doc_images, doc, length, img,
                   piece_ids, piece_begin):
    """One pass over the documents writing the compact segments (see ``Segmentation``).

    Args:
        policy: 0 split, 1 truncate, 2 drop (documents longer than ``capacity``).
        per_doc_images: int64 (n_docs,) images per document, or (0,) without images.
        doc, length, img: (n_segments,) outputs (``img`` is (0,) without images).
        piece_ids, piece_begin: (n_pieces,) outputs: the segments that start inside their document.
    Returns:
        Tokens kept of the oversize documents (the first piece of each, for ``truncate``).
    """
    row = 0
    k = 0
    kept = 0
    has_img = img.shape[0] > 0
    for d in range(doc_lengths.shape[0]):
        doc_len = doc_lengths[d]
        if doc_len == 0:
            continue
        if doc_len <= capacity:
            doc[row] = d
            length[row] = doc_len
            if has_img:
                img[row] = per_doc_images[d]
            row += 1
            continue
        if policy == 2:
            continue
        j = img_off[d] if img_off.shape[0] > 0 else 0
        hi = img_off[d + 1] if img_off.shape[0] > 0 else 0
        start = 0
        while start < doc_len:
            cut, nxt = _next_cut(start, doc_len, capacity, spans, j, hi)
            doc[row] = d
            length[row] = cut - start
            if has_img:
                img[row] = nxt - j
            if start > 0:
                piece_ids[k] = row
                piece_begin[k] = start
                k += 1
            row += 1
            start = cut
            j = nxt
            if policy == 1:
                kept += cut
                break
    return kept


def _check_spans(doc_lengths, capacity, image_spans, doc_image_offsets):
    """Validate the image runs; raise ValueError on malformed or over-capacity runs."""
    n_docs = doc_lengths.shape[0]
    if doc_image_offsets.shape != (n_docs + 1,) or doc_image_offsets[0] != 0 \
            or doc_image_offsets[-1] != image_spans.shape[0] or np.any(np.diff(doc_image_offsets) < 0):
        raise ValueError(f"doc_image_offsets must be non-decreasing, shape ({n_docs + 1},), from 0 to n_images")
    if image_spans.ndim != 2 or image_spans.shape[1] != 2:
        raise ValueError(f"image_spans must have shape (n_images, 2), got {image_spans.shape}")
    doc_of = np.repeat(np.arange(n_docs, dtype=np.int64), np.diff(doc_image_offsets))
    begin, end = image_spans[:, 0], image_spans[:, 1]
    bad = np.flatnonzero((begin < 0) | (end <= begin) | (end > doc_lengths[doc_of]))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"image {i} of document {int(doc_of[i])}: span [{int(begin[i])}, {int(end[i])}) "
                         f"is not inside [0, {int(doc_lengths[doc_of[i]])}) or is empty")
    same_doc = doc_of[1:] == doc_of[:-1]
    bad = np.flatnonzero(same_doc & (begin[1:] < end[:-1]))
    if bad.size:
        i = int(bad[0]) + 1
        raise ValueError(f"image {i} of document {int(doc_of[i])}: image runs must be sorted and disjoint")
    bad = np.flatnonzero(end - begin > capacity)
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"image {i} of document {int(doc_of[i])} has a token run of {int(end[i] - begin[i])} "
                         f"tokens, longer than the capacity {capacity}; it cannot be placed in any pack")


def segment_documents(doc_lengths, capacity, oversize="split", *, image_spans=None,
                      doc_image_offsets=None) -> Segmentation:
    """Cut documents into segments of at most ``capacity`` tokens.

    Args:
        doc_lengths: int (n_docs,) tokens per document (>= 0; empty documents are dropped); int32
            is used as is, any other integer type as int64.
        capacity: tokens per pack (>= 1).
        oversize: ``"split"`` (pieces tiling the document), ``"truncate"`` (keep the first
            piece) or ``"drop"`` (omit the document) for documents longer than ``capacity``.
        image_spans: int (n_images, 2) ``[begin, end)`` of each image's token run, relative to
            its document start; sorted and disjoint within a document.
        doc_image_offsets: int (n_docs + 1,) CSR: document d owns image rows
            ``doc_image_offsets[d]:doc_image_offsets[d + 1]``.
    Returns:
        The Segmentation. A piece ends at the largest position ``<= start + capacity`` that is not
        strictly inside an image run.
    Raises:
        ValueError: bad arguments, or an image run longer than ``capacity``.
    """
    lengths = np.asarray(doc_lengths)
    if lengths.ndim != 1 or (lengths.size and not np.issubdtype(lengths.dtype, np.integer)):
        raise ValueError("doc_lengths must be a 1-D integer array")
    if lengths.dtype != np.int32:  # int32 (what build_pack_index reads) is kept: no 8-byte copy per document
        lengths = lengths.astype(np.int64, copy=False)
    if lengths.size and lengths.min() < 0:
        raise ValueError("doc_lengths must be >= 0")
    if int(capacity) != capacity or capacity < 1:
        raise ValueError(f"capacity must be an integer >= 1, got {capacity!r}")
    capacity = int(capacity)
    if oversize not in OVERSIZE_POLICIES:
        raise ValueError(f"oversize must be one of {OVERSIZE_POLICIES}, got {oversize!r}")
    if (image_spans is None) != (doc_image_offsets is None):
        raise ValueError("image_spans and doc_image_offsets must be given together")
    if image_spans is not None:
        spans = np.asarray(image_spans, dtype=np.int64).reshape(-1, 2)
        img_off = np.asarray(doc_image_offsets, dtype=np.int64)
        _check_spans(lengths, capacity, spans, img_off)
        per_doc_images = np.diff(img_off)
    else:
        spans = np.zeros((0, 2), dtype=np.int64)
        img_off = np.zeros(0, dtype=np.int64)
        per_doc_images = None  # zeros, allocated only if asked for
    return _segment(lengths, capacity, oversize, spans, img_off, per_doc_images)


def _segment(lengths, capacity, oversize, spans, img_off, per_doc_images) -> Segmentation:
    """Build the Segmentation from validated arrays (compact unless every document is whole)."""
    if lengths.size == 0 or (lengths.min() >= 1 and lengths.max() <= capacity):
        return Segmentation.whole_documents(lengths, per_doc_images)  # nothing to cut: O(1) extra memory
    over = np.flatnonzero(lengths > capacity)
    n_empty = int(np.count_nonzero(lengths == 0))
    n_fit = lengths.shape[0] - n_empty - over.shape[0]
    counts = np.zeros(over.shape[0], dtype=np.int64)
    if oversize != "drop" and over.size:
        _count_pieces(over, lengths, capacity, oversize == "truncate", spans, img_off, counts)
    n_seg = n_fit + int(counts.sum())
    doc = np.empty(n_seg, dtype=id_dtype(lengths.shape[0]))
    seg_len = np.empty(n_seg, dtype=np.int32)  # at most the capacity < 2^31 (spec/packing.md §1)
    n_pieces = int(counts.sum()) - int(np.count_nonzero(counts)) if oversize == "split" else 0
    piece_ids = np.empty(n_pieces, dtype=np.int64)
    piece_begin = np.empty(n_pieces, dtype=np.int64)
    img = np.zeros(n_seg if per_doc_images is not None else 0, dtype=np.int64)
    kept_over = _fill_segments(lengths, capacity, {"split": 0, "truncate": 1, "drop": 2}[oversize], spans, img_off,
                               per_doc_images if per_doc_images is not None else np.zeros(0, np.int64), doc, seg_len,
                               img, piece_ids, piece_begin)
    over_tokens = int(lengths[over].sum(dtype=np.int64))
    return Segmentation(
        None,
        image_counts=img if per_doc_images is not None else None,
        dropped_docs=n_empty + (int(over.size) if oversize == "drop" else 0),
        dropped_tokens=over_tokens if oversize == "drop" else 0,
        split_docs=int(np.count_nonzero(counts > 1)) if oversize == "split" else 0,
        truncated_docs=int(over.size) if oversize == "truncate" else 0,
        truncated_tokens=over_tokens - int(kept_over) if oversize == "truncate" else 0,
        compact=(doc, seg_len, piece_ids, piece_begin),
    )
