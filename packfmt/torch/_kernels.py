"""One-pass numba kernels of the torch reader (spec/READER.md §1-§4).

``fill_pack`` writes the four per-token rows of one pack (input_ids, labels, position_ids,
doc_ids) in a single pass over its segments, reading tokens straight from the memmaps.
``fill_packs`` lays out a whole batch of packs end to end in one call, with its
``cu_seqlens``; ``fill_padding`` pads a row of the padded collate. The rows are separate
arrays so that input_ids / position_ids / doc_ids may be int64 or int32 (labels stay int64).
All kernels are ``cache=True`` (compiled once per dtype combination, then loaded from
``__pycache__``) and ``nogil=True``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["fill_pack", "fill_packs", "pack_length", "pack_lengths", "fill_batch_doc_ids", "fill_padding", "IGNORE", "PAD_DOC"]

IGNORE = -100
PAD_DOC = -1


@njit(cache=True, nogil=True)
def fill_pack(tokens, loss_mask, has_mask, doc_offsets, segments, seg_lo, seg_hi,
              src, src_mask, src_start, ids, labels, pos, dids, seq_lens, docs, pad_id):
    """Fill the four per-token rows of pack ``segments[seg_lo:seg_hi]``; return the label count.

    Args:
        tokens: the store's token array (any unsigned int dtype), ``(num_tokens,)``.
        loss_mask: the store's uint8 loss mask, ``(num_tokens,)`` (ignored unless ``has_mask``).
        has_mask: whether the store has a loss mask.
        doc_offsets: int64 ``(num_documents + 1,)``.
        segments: int64 ``(S, 3)`` rows ``(doc, begin, end)``, document-relative half-open ranges.
        seg_lo, seg_hi: the pack's segment range ``[seg_lo, seg_hi)``.
        src, src_mask: where the pack's tokens / mask are read: the materialized pack tokens
            (then ``src_start`` is the pack's first token there) or ``tokens`` / ``loss_mask``
            themselves (then ``src_start < 0`` and each segment is read at its global offset).
        ids, pos, dids: ``(N,)`` int64 or int32 rows input_ids, position_ids, doc_ids, with
            ``N >= n`` (the pack's tokens); labels: int64 ``(N,)``. Positions ``[n, N)`` are
            filled as padding (``pad_id``, -100, ``0, 1, ...``, -1).
        seq_lens: int32 ``(seg_hi - seg_lo,)``, receives each segment's length.
        docs: int64 ``(seg_hi - seg_lo,)``, receives each segment's global document id.
        pad_id: token id of padding positions.

    Returns:
        The number of positions whose label is not -100.
    """
    return _fill_one(tokens, loss_mask, has_mask, doc_offsets, segments, seg_lo, seg_hi, src, src_mask, src_start,
                     ids, labels, pos, dids, 0, ids.shape[0], seq_lens, docs, 0, pad_id)


@njit(cache=True, nogil=True)
def fill_packs(tokens, loss_mask, has_mask, doc_offsets, segments, pack_offsets, packs, src, src_mask,
               pack_token_offsets, materialized, widths, ids, labels, pos, batch_seg, item_doc_ids, seq_lens, docs,
               seq_bounds, num_labels, cu_seqlens, kept_docs, pad_id):
    """Fill a whole batch of packs, laid end to end, in one call (``PackedDataset.__getitems__``).

    Pack ``packs[b]`` occupies columns ``[W_b, W_b + widths[b])`` with ``W_b = sum(widths[:b])``
    (``widths[b]`` is its token count, or ``capacity`` when padded). ``W = sum(widths)``.

    Args:
        tokens, loss_mask, has_mask, doc_offsets, segments, src, src_mask: as in ``fill_pack``.
        pack_offsets: int64 ``(P + 1,)``: segment range of every pack.
        packs: int64 ``(B,)``: pack indices of the batch.
        pack_token_offsets: int64 ``(P + 1,)``: first token of every pack in ``src`` (materialized only).
        materialized: whether ``src`` holds the materialized pack tokens.
        widths: int64 ``(B,)``.
        ids, pos: ``(W,)`` int64 or int32 input_ids and position_ids; labels: int64 ``(W,)``.
        batch_seg: ``(W,)``: the *batch* segment index of every position (``0..S-1`` over the
            non-empty segments of the batch, -1 for padding).
        item_doc_ids: ``(W,)``: segment index within its pack (-1 for padding).
        seq_lens: int32 ``(S_all,)`` (the packs' segments, empty ones included); docs: int64
            ``(S_all,)``, their global document ids; seq_bounds: int64 ``(B + 1,)``, where pack
            ``b``'s segments start in ``seq_lens``.
        num_labels: int64 ``(B,)``, receives each pack's label count.
        cu_seqlens: int32 ``(S_all + 1,)``, receives ``0`` then the cumulative lengths of the
            ``S`` non-empty segments (entries past ``S`` are left untouched).
        kept_docs: int64 ``(S_all,)``, receives the document ids of the non-empty segments.

    Returns:
        ``(longest segment (0 when none), S)``.
    """
    p = 0
    batch_seg_i = 0
    longest = 0
    real = 0  # real (unpadded) tokens so far
    cu_seqlens[0] = 0
    for b in range(packs.shape[0]):
        i = packs[b]
        lo = pack_offsets[i]
        hi = pack_offsets[i + 1]
        start = pack_token_offsets[i] if materialized else -1
        num_labels[b] = _fill_one(tokens, loss_mask, has_mask, doc_offsets, segments, lo, hi, src, src_mask, start,
                                  ids, labels, pos, item_doc_ids, p, widths[b], seq_lens, docs, seq_bounds[b], pad_id)
        q = p
        for k in range(seq_bounds[b], seq_bounds[b + 1]):
            ln = seq_lens[k]
            if ln > 0:
                for j in range(ln):
                    batch_seg[q + j] = batch_seg_i
                kept_docs[batch_seg_i] = docs[k]
                batch_seg_i += 1
                q += ln
                real += ln
                cu_seqlens[batch_seg_i] = real
                if ln > longest:
                    longest = ln
        for j in range(p + widths[b] - q):
            batch_seg[q + j] = PAD_DOC
        p += widths[b]
    return longest, batch_seg_i


@njit(cache=True, nogil=True)
def _fill_one(tokens, loss_mask, has_mask, doc_offsets, segments, seg_lo, seg_hi, src, src_mask, src_start,
              ids, labels, pos, dids, p0, width, seq_lens, docs, sl0, pad_id):
    """Write one pack at columns ``[p0, p0 + width)`` of the four 1-D rows; return its label count."""
    p = p0
    nlab = 0
    ntok = tokens.shape[0]
    for s in range(seg_lo, seg_hi):
        d = segments[s, 0]
        b = segments[s, 1]
        e = segments[s, 2]
        ln = e - b
        g = doc_offsets[d] + b  # global index of the segment's first token
        doc_len = doc_offsets[d + 1] - doc_offsets[d]
        r = src_start + (p - p0) if src_start >= 0 else g  # where the segment starts in src
        k = s - seg_lo
        seq_lens[sl0 + k] = ln
        docs[sl0 + k] = d
        if ln <= 0:
            continue
        for j in range(ln):  # one fused pass: the fastest layout measured (one loop, three streams)
            ids[p + j] = src[r + j]
            pos[p + j] = j
            dids[p + j] = k
        if has_mask:
            for j in range(ln - 1):
                if src_mask[r + j + 1] == 0:
                    labels[p + j] = IGNORE
                else:
                    labels[p + j] = ids[p + j + 1]
                    nlab += 1
        else:
            for j in range(ln - 1):
                labels[p + j] = ids[p + j + 1]
            nlab += ln - 1
        # Last token of the segment: the document's true next token at a cut, else nothing.
        nxt = g + ln
        if e < doc_len and nxt < ntok and not (has_mask and loss_mask[nxt] == 0):
            labels[p + ln - 1] = tokens[nxt]
            nlab += 1
        else:
            labels[p + ln - 1] = IGNORE
        p += ln
    for j in range(p0 + width - p):
        ids[p + j] = pad_id
        labels[p + j] = IGNORE
        pos[p + j] = j
        dids[p + j] = PAD_DOC
    return nlab


@njit(cache=True, nogil=True)
def fill_batch_doc_ids(seq_lens, out):
    """Write segment index ``s`` over each segment's run of ``out`` (``seq_lens`` int32 ``(S,)``).

    Returns:
        The longest segment (0 when there is none).
    """
    p = 0
    longest = 0
    for s in range(seq_lens.shape[0]):
        ln = seq_lens[s]
        for j in range(ln):
            out[p + j] = s
        p += ln
        if ln > longest:
            longest = ln
    return longest


@njit(cache=True, nogil=True)
def pack_length(segments, seg_lo, seg_hi):
    """Token count of segments ``[seg_lo, seg_hi)`` of an int64 ``(S, 3)`` segment table."""
    n = 0
    for s in range(seg_lo, seg_hi):
        n += segments[s, 2] - segments[s, 1]
    return n


@njit(cache=True, nogil=True)
def fill_padding(ids, labels, pos, dids, r, n, pad_id):
    """Pad row ``r`` of the ``(B, L)`` arrays from column ``n``: pad_id, -100, 0, 1, ..., -1."""
    for j in range(ids.shape[1] - n):
        ids[r, n + j] = pad_id
        labels[r, n + j] = IGNORE
        pos[r, n + j] = j
        dids[r, n + j] = PAD_DOC


@njit(cache=True, nogil=True)
def pack_lengths(segments, pack_offsets, packs):
    """int64 ``(B,)``: token count of every pack in ``packs`` (from the segment table)."""
    out = np.empty(packs.shape[0], dtype=np.int64)
    for b in range(packs.shape[0]):
        out[b] = pack_length(segments, pack_offsets[packs[b]], pack_offsets[packs[b] + 1])
    return out
