"""The files of a pack index written from a packing: ``segments.bin`` in pack order and, materialized,
the tokens (and loss mask) in pack order (spec/FORMAT.md §4.2), both streamed in bounded chunks.

``build_pack_index`` (``packfmt.packindex``) and hand-made test indexes (``packfmt.torch.testing``)
write them the same way.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from numba import njit

from . import format as F
from ._io import HashedFile, aligned_empty
from .collection.arrays import token_sources
from .packing.segment import whole_row

__all__ = ["write_segments", "write_packed_tokens", "SEGMENT_ROWS_CHUNK", "MATERIALIZE_CHUNK_TOKENS"]

#: Segments gathered per chunk when materializing (bounds the temporary index arrays).
MATERIALIZE_CHUNK_TOKENS = 1 << 24
#: Rows of segments.bin built and written per chunk (24 bytes each: bounds the temporary copy).
SEGMENT_ROWS_CHUNK = 1 << 20


def write_segments(path: Path, seg, result, *, direct: bool = True) -> tuple[dict, np.ndarray]:
    """Write ``segments.bin``: the rows ``(doc, begin, end)`` in pack order, built and written in chunks.

    One thread writes (and hashes) chunk ``i`` while this one builds chunk ``i + 1`` into the other
    of two buffers: the file's 24 bytes per segment go to disk at its speed, the building hides
    behind it. The buffers are aligned so that the disk reads them where they are (``O_DIRECT``,
    see ``HashedFile``). Returns the ``files`` entry and the tokens of each pack, summed from the
    same chunks (so the statistics need no second gather of the lengths in pack order). Whole
    documents whose lengths the packing gave in pack order (``PackResult.item_lengths``) take them
    from there: no row reads a length out of the rows' order.
    ``direct=False``: through the page cache (the same bytes; benchmarks/bench_write_segments.py).
    """
    from concurrent.futures import ThreadPoolExecutor

    from .packing import Segmentation

    po = np.ascontiguousarray(result.pack_offsets, dtype=np.int64)
    # whole documents (nothing cut): each row and its pack's tokens in one pass (the rows not read back)
    whole = seg.lengths if isinstance(seg, Segmentation) and seg.is_whole_documents else None
    # ... or with the packer's lengths in pack order (PackResult.item_lengths): read in order, none gathered per row
    in_order = result.item_lengths if whole is not None else None
    if in_order is not None and in_order.shape != result.order.shape:
        raise ValueError(f"write_segments: the packing's item_lengths hold {in_order.shape[0]} lengths for its "
                         f"{result.n_items} segments (expected one a segment, in pack order)")
    pack_tokens = np.zeros(max(0, po.shape[0] - 1), dtype=np.int64)
    pack = 0  # the pack of the first row of the next chunk
    f = HashedFile(path, direct=direct)  # gigabytes at 10^8 documents: disk writes, no page cache copy
    rows_per_chunk = min(result.n_items, SEGMENT_ROWS_CHUNK)
    # two row buffers, alternating, aligned for O_DIRECT (a mixture's RepeatedSegmentation makes its own rows)
    buffers = [aligned_empty((rows_per_chunk, 3), F.OFFSET_DTYPE) for _ in range(2)] \
        if isinstance(seg, Segmentation) else None
    pending = [None, None]  # the write of each buffer still in flight
    try:
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="packfmt-segments") as writer:
            for i, a in enumerate(range(0, result.n_items, SEGMENT_ROWS_CHUNK)):
                slot = i % 2
                if pending[slot] is not None:
                    pending[slot].result()  # its buffer is free again (and a write error surfaces here)
                idx = result.order[a:a + SEGMENT_ROWS_CHUNK]
                if in_order is not None:
                    rows = buffers[slot][:idx.shape[0]]
                    pack = _ordered_rows_summed(idx, in_order[a:a + SEGMENT_ROWS_CHUNK], rows, a, po, pack, pack_tokens)
                elif whole is not None:
                    rows = buffers[slot][:idx.shape[0]]
                    pack = _whole_rows_summed(idx, whole, rows, a, po, pack, pack_tokens)
                else:
                    rows = seg.rows(idx) if buffers is None else seg.rows(idx, out=buffers[slot])
                    pack = _add_pack_tokens(rows, a, po, pack, pack_tokens)
                if pack < 0:
                    raise ValueError(f"write_segments: segment {a + ~pack} lies past the last pack of the packing's "
                                     f"pack_offsets (expected them to end at its {result.n_items} segments, found "
                                     f"{int(po[-1]) if po.shape[0] else 'none'})")
                pending[slot] = writer.submit(f.write_array, rows, F.OFFSET_DTYPE)
            for fut in pending:
                if fut is not None:
                    fut.result()
    except BaseException:
        f.abort()
        raise
    return f.close(), pack_tokens


@njit(cache=True, nogil=True, inline="always")
def _pack_of(pack_offsets, pack, s):
    """The pack of segment ``s`` (segments in pack order), walking on from ``pack``, that of an earlier segment;
    -1 when ``s`` lies past the last pack (the caller's ``pack_offsets`` do not end at its segments): nothing
    indexed outside ``pack_offsets``."""
    last = pack_offsets.shape[0] - 2  # the last pack
    while pack < last and pack_offsets[pack + 1] <= s:
        pack += 1
    if pack < 0 or pack > last or pack_offsets[pack + 1] <= s:
        return -1
    return pack


@njit(cache=True, nogil=True)
def _add_pack_tokens(rows, start, pack_offsets, pack, sums):
    """Add each row's tokens (``end - begin``) to ``sums`` of its pack; the rows are segments
    ``start, start + 1, ...`` in pack order, the first in pack ``pack``. Returns the pack of the
    segment after the last row, or ``~i`` (negative) when row ``i`` lies past the last pack (``_pack_of``)."""
    for i in range(rows.shape[0]):
        pack = _pack_of(pack_offsets, pack, start + i)
        if pack < 0:
            return -1 - i
        sums[pack] += rows[i, 2] - rows[i, 1]
    return pack


@njit(cache=True, nogil=True)
def _ordered_rows_summed(idx, lengths, out, start, pack_offsets, pack, sums):
    """``_whole_rows_summed`` of whole documents whose lengths come in the rows' order (``lengths[i]`` is
    document ``idx[i]``'s): ``out[i] = (idx[i], 0, lengths[i])``, each pack's run of rows summed at once (no
    pack looked up per row, no length read out of order). Returns as ``_add_pack_tokens``."""
    n = idx.shape[0]
    i = 0
    while i < n:
        pack = _pack_of(pack_offsets, pack, start + i)
        if pack < 0:
            return -1 - i
        end = min(n, pack_offsets[pack + 1] - start)  # this pack's rows in the chunk
        total = 0
        for j in range(i, end):
            length = lengths[j]
            out[j, 0] = idx[j]
            out[j, 1] = 0
            out[j, 2] = length
            total += length
        sums[pack] += total
        i = end
    return pack


@njit(cache=True, nogil=True)
def _whole_rows_summed(idx, lengths, out, start, pack_offsets, pack, sums):
    """``_add_pack_tokens`` of the rows of whole documents ``idx`` as it writes them into ``out``
    (``Segmentation.rows``' ``(d, 0, len_d)``): one pass, each length read once, the rows not read back
    (0.1 s of ``packfmt pack``'s CPU at 10^8 documents). Returns as ``_add_pack_tokens``."""
    for i in range(idx.shape[0]):
        pack = _pack_of(pack_offsets, pack, start + i)
        if pack < 0:
            return -1 - i
        sums[pack] += whole_row(out, i, idx[i], lengths)
    return pack


def write_packed_tokens(store, tmp: Path, seg, order: np.ndarray, pack_tokens: np.ndarray) -> dict:
    """Write tokens (and loss mask) in pack order, gathered across members for a collection;
    return their ``files`` entries. The segments' rows are built one chunk at a time (as for
    ``segments.bin``), and each chunk is gathered in runs of about ``MATERIALIZE_CHUNK_TOKENS``."""
    from ._resident import release

    pack_token_offsets = np.zeros(pack_tokens.shape[0] + 1, dtype=np.int64)
    np.cumsum(pack_tokens, out=pack_token_offsets[1:])
    out = {}
    f = HashedFile(tmp / F.PACK_TOKEN_OFFSETS)
    f.write_array(pack_token_offsets, F.OFFSET_DTYPE)
    out[F.PACK_TOKEN_OFFSETS] = f.close()
    tokens, mask = token_sources(store)
    sources = [(F.PACKED_TOKENS, tokens, store.np_token_dtype)]
    if mask is not None:
        sources.append((F.PACKED_LOSS_MASK, mask, F.MASK_DTYPE))
    writers = {fname: HashedFile(tmp / fname) for fname, _, _ in sources}
    doc_offsets = store.doc_offsets
    for a in range(0, order.shape[0], SEGMENT_ROWS_CHUNK):
        segments = seg.rows(order[a:a + SEGMENT_ROWS_CHUNK])
        seg_len = segments[:, 2] - segments[:, 1]
        seg_tok_offsets = np.concatenate([[0], np.cumsum(seg_len)])
        starts = np.asarray(doc_offsets[segments[:, 0]]) + segments[:, 1]
        i = 0
        n = segments.shape[0]
        while i < n:
            # take segments until the run holds about MATERIALIZE_CHUNK_TOKENS tokens
            j = int(np.searchsorted(seg_tok_offsets, seg_tok_offsets[i] + MATERIALIZE_CHUNK_TOKENS, side="right"))
            j = min(max(j - 1, i + 1), n)
            lens = seg_len[i:j]
            total = int(lens.sum())
            # gather index: for each segment, starts[k] + arange(len[k])
            idx = np.repeat(starts[i:j] - seg_tok_offsets[i:j] + seg_tok_offsets[i], lens) + np.arange(total, dtype=np.int64)
            for fname, src, dtype in sources:
                writers[fname].write_array(np.asarray(src[idx]), dtype)
            i = j
    release(doc_offsets)
    for fname, w in writers.items():
        out[fname] = w.close()
    return out
