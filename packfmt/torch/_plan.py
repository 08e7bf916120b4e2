"""Laying out a batch of packs before it is filled (spec/READER.md §4): ``plan_batch`` checks the pack indices and
sizes every pack of a ``PackedDataset.__getitems__`` batch in one compiled call; ``_kernels.fill_packs`` then writes
the batch."""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["plan_batch", "pack_length", "BATCH_SLOTS"]


#: Order of the batch slots in the ``offsets`` argument of ``fill_packs`` (element offsets into
#: the typed view of the one batch buffer that holds each slot).
BATCH_SLOTS = ("labels", "input_ids", "position_ids", "doc_ids", "item_doc_ids", "seq_lens", "document_ids",
               "num_labels", "cu_seqlens", "kept_document_ids", "pack_ids", "num_label_tokens")


@njit(cache=True, nogil=True)
def plan_batch(indices, num_packs, pack_offsets, pack_token_offsets, segments, materialized, capacity, pad):
    """Check and lay out a batch of pack indices (negative ones count from the end).

    Returns:
        ``(packs, lengths, widths, seq_bounds, cols, kept, bad)``: int64 ``(B,)`` normalised pack
        indices, real tokens and columns of each pack (``max(length, capacity)`` when ``pad``),
        ``(B + 1,)`` where each pack's segments start among the batch's segments and where its
        columns start, ``kept``: the number ``S`` of non-empty segments, and ``bad``: the
        position of the first out-of-range index, or -1.
    """
    B = indices.shape[0]
    packs = np.empty(B, dtype=np.int64)
    lengths = np.empty(B, dtype=np.int64)
    widths = np.empty(B, dtype=np.int64)
    seq_bounds = np.zeros(B + 1, dtype=np.int64)
    cols = np.zeros(B + 1, dtype=np.int64)
    kept = 0
    for b in range(B):
        i = indices[b]
        if i < -num_packs or i >= num_packs:
            return packs, lengths, widths, seq_bounds, cols, kept, b
        if i < 0:
            i += num_packs
        packs[b] = i
        lo = pack_offsets[i]
        hi = pack_offsets[i + 1]
        n = pack_token_offsets[i + 1] - pack_token_offsets[i] if materialized else pack_length(segments, lo, hi)
        lengths[b] = n
        widths[b] = max(n, capacity) if pad else n
        seq_bounds[b + 1] = seq_bounds[b] + hi - lo
        cols[b + 1] = cols[b] + widths[b]
        for s in range(lo, hi):
            kept += segments[s, 2] > segments[s, 1]
    return packs, lengths, widths, seq_bounds, cols, kept, -1


@njit(cache=True, nogil=True)
def pack_length(segments, seg_lo, seg_hi):
    """Token count of segments ``[seg_lo, seg_hi)`` of an int64 ``(S, 3)`` segment table."""
    n = 0
    for s in range(seg_lo, seg_hi):
        n += segments[s, 2] - segments[s, 1]
    return n
