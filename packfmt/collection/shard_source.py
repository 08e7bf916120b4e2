"""What ``write_shards`` cuts its shards from: a bounded run of the source index's segments at a time.

``Source(ds).chunk(segs)`` describes segments ``(d, b, e)`` (rows of the index's ``segments.bin``, in pack
order) as OUT's documents (spec/COLLECTION.md §9.1): their lookahead bits, their lengths ``L = e - b + a``,
their tokens and loss mask (copied into one buffer), the images whose runs start inside them and the bytes
each takes in a shard. Everything is read from the members' own memory-mapped arrays (document offsets,
tokens, mask, image spans and offsets) for the chunk's segments only, each member opened once per chunk
(through the collection's LRU of open members): nothing the size of the index or of the dataset is built,
so ``write_shards`` holds what one chunk needs, whatever the number of segments.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..writer import ImageRecord

__all__ = ["Chunk", "Source"]


@dataclass
class Chunk:
    """Segments of the source index as OUT's documents, one entry per segment (int64 unless said)."""

    seg_len: np.ndarray  #: ``e - b``: the tokens the index covers
    ahead: np.ndarray  #: bool, the lookahead bit ``a``
    length: np.ndarray  #: ``L = e - b + a``: the shard document's tokens
    member: np.ndarray  #: the source member holding the segment
    local_start: np.ndarray  #: the segment's first token in its member's token offsets
    image0: np.ndarray | None  #: the member's first image whose run starts inside the segment (None: no images)
    image1: np.ndarray | None  #: one past its last
    nbytes: np.ndarray  #: what the document takes in a shard: tokens (and mask bytes) plus encoded images
    imaged: np.ndarray  #: the positions in the chunk of the segments that carry images, increasing
    first: np.ndarray  #: ``(n + 1,)``: document ``k``'s tokens are ``tokens[first[k]:first[k + 1]]``
    tokens: np.ndarray  #: every document's tokens, in order (the dataset's token dtype)
    mask: np.ndarray | None  #: their loss-mask bits (None: the dataset has no mask)

    def __len__(self) -> int:
        return int(self.seg_len.shape[0])


class Source:
    """The dataset the shards are cut from: its tokens and loss mask by dataset-wide offset, and its members."""

    def __init__(self, ds) -> None:
        self.ds = ds
        self.per_token = ds.np_token_dtype.itemsize + (1 if ds.has_loss_mask else 0)
        self.has_images = ds.num_images > 0

    def chunk(self, segs, row0: int = 0, label: str = "segments.bin") -> Chunk:
        """``segs``: ``(n, 3)`` rows ``(d, b, e)`` of the source index (a slice of its memory map), rows ``row0, row0 + 1,
        ...`` of its file ``label`` (named by the FormatError of a segment outside its document)."""
        ds = self.ds
        segs = np.asarray(segs, dtype=np.int64)
        d, b, e = segs[:, 0], segs[:, 1], segs[:, 2]
        n, seg_len = d.shape[0], e - b
        _check_rows(segs, (0 <= d) & (d < ds.num_documents), f"a document id in [0, {ds.num_documents})", row0, label)
        _check_rows(segs, (0 <= b) & (b < e), "0 <= begin < end", row0, label)
        member = np.searchsorted(ds.doc_start, d, side="right") - 1
        local_start, ahead = np.empty(n, dtype=np.int64), np.zeros(n, dtype=bool)
        image0 = image1 = None
        if self.has_images:
            image0, image1 = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
        image_bytes = np.zeros(n, dtype=np.int64)
        # every segment's tokens and mask copied, as each member is met, to ``upper[k]`` in one buffer that has
        # room for its lookahead token; the documents are then moved together (``first``)
        upper = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(seg_len + 1, out=upper[1:])
        tokens = np.empty(int(upper[-1]), dtype=ds.np_token_dtype)
        mask = np.ones(tokens.shape[0], dtype=np.uint8) if ds.has_loss_mask else None  # a member without: ones
        copy = _kernels()[0]
        order = np.argsort(member, kind="stable")
        for part in np.split(order, np.flatnonzero(np.diff(member[order])) + 1):
            m = int(member[part[0]])
            store, local = ds.member(m), d[part] - int(ds.doc_start[m])  # opened once per chunk
            off = store.doc_offsets
            doc_begin = np.asarray(off[local], dtype=np.int64)
            local_start[part] = doc_begin + b[part]
            end = doc_begin + e[part]
            doc_end = np.asarray(off[local + 1], dtype=np.int64)
            # the copy kernel reads the run unchecked: a streamed collection's index was bounded by member at open
            _check_rows(segs, end <= doc_end, "end <= the length of its document", row0, label, part, doc_end - doc_begin)
            # the lookahead bit: the segment ends before its document does and the next token is a training
            # target (its mask bit is 1; a member without a mask reads as ones: FORMAT.md §7, COLLECTION.md §6)
            cont = end < doc_end
            if mask is not None and not ds.all_trained[m] and cont.any():
                at = np.flatnonzero(cont)
                cont[at] = np.asarray(store.loss_mask[end[at]]) == 1
            ahead[part] = cont
            copy(np.asarray(store.tokens), local_start[part], seg_len[part] + cont, tokens, upper[part])
            if mask is not None and not ds.all_trained[m]:
                copy(np.asarray(store.loss_mask), local_start[part], seg_len[part] + cont, mask, upper[part])
            if image0 is not None and ds.image_start[m + 1] > ds.image_start[m]:
                # the images of a segment: those whose run starts inside it (V28: a run is never cut), found
                # among its document's images (sorted, FORMAT.md V19) by a vectorised binary search
                images = store.images
                lo, hi = images.doc_image_offsets[local], images.doc_image_offsets[local + 1]
                image0[part] = _lower_bound(images.token_spans, lo, hi, local_start[part])
                image1[part] = _lower_bound(images.token_spans, lo, hi, end)
                image_bytes[part] = images.offsets[image1[part]] - images.offsets[image0[part]]
        length = seg_len + ahead
        first = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(length, out=first[1:])
        close_up = _kernels()[1]
        close_up(tokens, upper, length, first)
        tokens = tokens[:first[-1]]
        if mask is not None:
            close_up(mask, upper, length, first)
            mask = mask[:first[-1]]
        imaged = np.zeros(0, dtype=np.int64) if image0 is None else np.flatnonzero(image1 > image0)
        return Chunk(seg_len, ahead, length, member, local_start, image0, image1,
                     length * self.per_token + image_bytes, imaged, first, tokens, mask)

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


def _check_rows(segs: np.ndarray, ok: np.ndarray, expected: str, row0: int, label: str, rows: np.ndarray | None = None,
                lengths: np.ndarray | None = None) -> None:
    """V27 where ``Source.chunk``'s kernels index with a segment: a FormatError naming the first of ``rows`` (default:
    every row of ``segs``, file rows ``row0, row0 + 1, ...``) where ``ok`` fails; ``lengths``: its document's, per row."""
    bad = np.flatnonzero(~ok)
    if bad.size:
        from ..errors import FormatError

        k = int(bad[0])
        r = k if rows is None else int(rows[k])
        d, b, e = (int(v) for v in segs[r])
        what = expected if lengths is None else f"{expected}, {int(lengths[k])}"
        raise FormatError(f"{label}: [{row0 + r}]: expected {what}, found (doc {d}, begin {b}, end {e}) ({bad.size} bad "
                          "segment(s) in this chunk; V27: the index does not describe this dataset's documents). Run "
                          "`packfmt validate --deep` on the source", file=label, field=f"[{row0 + r}]", expected=what,
                          found=f"({d}, {b}, {e})")


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


_KERNELS = None


def _kernels():
    """``(copy, close_up)``, numba loops (numba is imported on first use, as for ``checks.segments``): no index
    array the size of the tokens, and a memory-mapped source read at the copied runs only.

    ``copy(src, starts, lens, out, at)``: ``out[at[i]:at[i] + lens[i]] = src[starts[i]:starts[i] + lens[i]]``.
    ``close_up(buf, upper, lens, first)``: run ``i`` moved from ``upper[i]`` to ``first[i] <= upper[i]``, in place."""
    global _KERNELS
    if _KERNELS is None:
        from numba import njit

        @njit(cache=True, nogil=True)
        def copy(src, starts, lens, out, at):
            for i in range(starts.shape[0]):
                s, o = starts[i], at[i]
                for j in range(lens[i]):
                    out[o + j] = src[s + j]

        @njit(cache=True, nogil=True)
        def close_up(buf, upper, lens, first):
            for i in range(lens.shape[0]):
                s, o = upper[i], first[i]
                if s != o:
                    for j in range(lens[i]):
                        buf[o + j] = buf[s + j]

        _KERNELS = (copy, close_up)
    return _KERNELS
