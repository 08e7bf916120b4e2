"""Laying out a batch of packs before it is filled (spec/READER.md §4): ``plan_batch`` checks the pack indices, sizes
every pack of a ``PackedDataset.__getitems__`` batch and places every slot of its one buffer (``batch_layout``), in one
compiled call; ``_kernels.fill_packs`` then writes the batch. A batch of short packs costs its Python calls more than
its tokens (8 packs of 1,024 tokens are copied in ~5 us): the layout is planned where the packs are sized, not slot by
slot in Python (benchmarks/bench_batch.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

from ._arena import _ALIGN
from ._kernels import PLAN_COLS, PLAN_LENGTHS, PLAN_PACKS, PLAN_SEQ_BOUNDS, PLAN_WIDTHS, ROW_DIDS, ROW_POS

__all__ = ["plan_batch", "pack_length", "BATCH_SLOTS", "N_SLOTS", "batch_layout"]


#: Order of the batch slots in the ``offsets`` argument of ``fill_packs`` (element offsets into
#: the typed view of the one batch buffer that holds each slot).
BATCH_SLOTS = ("labels", "input_ids", "position_ids", "doc_ids", "item_doc_ids", "seq_lens", "document_ids",
               "num_labels", "cu_seqlens", "kept_document_ids", "pack_ids", "num_label_tokens")
N_SLOTS = len(BATCH_SLOTS)


#: What the length of a batch slot is (``batch_layout``'s count kinds): ``W`` columns, ``S + 1``, ``S`` non-empty
#: segments, ``B`` packs, one (a 0-d slot), ``S_all`` segments.
COUNT_W, COUNT_S1, COUNT_S, COUNT_B, COUNT_ONE, COUNT_S_ALL = range(6)


def batch_layout(index_np, ids_np, rows: int, hf_room: bool) -> tuple[tuple, np.ndarray]:
    """The slots of a ``PackedDataset.__getitems__`` batch for one reader configuration: ``(slots, spec)``.

    ``slots``: ``(name, numpy dtype, 0-d)`` of each slot in buffer order; ``spec``: int64 ``(n, 3)``, what
    ``plan_batch`` places: each slot's itemsize, its count kind (``COUNT_*``) and its position in ``BATCH_SLOTS``
    (-1: none). What ``collate_varlen`` returns comes first (so a span of the buffer holds exactly it), then
    ``collate_hf``'s extra labels (with ``hf_room``), then what only the items use. Rows left out of ``rows`` get
    no slot (``item_doc_ids`` shares ``doc_ids``' slot: ``fill_packs`` writes one of them).
    """
    slots: list[tuple[str, Any, int]] = [("labels", np.int64, COUNT_W), ("input_ids", ids_np, COUNT_W)]
    if rows & ROW_POS:
        slots.append(("position_ids", index_np, COUNT_W))
    if rows & ROW_DIDS:
        slots.append(("doc_ids", index_np, COUNT_W))
    slots += [("cu_seqlens", np.int32, COUNT_S1), ("kept_document_ids", np.int64, COUNT_S),
              ("pack_ids", np.int64, COUNT_B), ("num_label_tokens", np.int64, COUNT_ONE)]
    if hf_room:
        slots.append(("hf_labels", np.int64, COUNT_W))
    slots += [("seq_lens", np.int32, COUNT_S_ALL), ("document_ids", np.int64, COUNT_S_ALL),
              ("num_labels", np.int64, COUNT_B)]
    spec = np.array([(np.dtype(dt).itemsize, kind, BATCH_SLOTS.index(name) if name in BATCH_SLOTS else -1)
                     for name, dt, kind in slots], dtype=np.int64)
    return tuple((name, np.dtype(dt), kind == COUNT_ONE) for name, dt, kind in slots), spec


@njit(cache=True, nogil=True)
def plan_batch(indices, num_packs, pack_offsets, pack_token_offsets, segments, materialized, capacity, pad, spec):
    """Check and lay out a batch of pack indices (negative ones count from the end).

    ``spec``: the slots of the batch's buffer (``batch_layout``).

    Returns:
        ``(plan, kept, bad, layout, nbytes)``. ``plan``: int64 ``(5, B + 1)``, rows ``_kernels.PLAN_*``: normalised
        pack indices, real tokens and columns of each pack (``max(length, capacity)`` when ``pad``; ``B``
        entries), where each pack's segments start among the batch's segments and where its columns start
        (``B + 1``). ``kept``: the number ``S`` of non-empty segments. ``bad``: the position of the first
        out-of-range index, or -1 (then nothing after it is set). ``layout``: int64, ``len(BATCH_SLOTS)`` element
        offsets (``fill_packs``' ``offsets``: 0 for a slot that is not there, ``item_doc_ids`` at ``doc_ids``'),
        then each slot's element offset (in the buffer viewed as its dtype, each slot 64-byte aligned) and length,
        in ``spec`` order. ``nbytes``: the buffer's size, a multiple of 64. Two arrays, not one per row: each array
        a compiled function returns costs a Python object and a look-up.
    """
    B = indices.shape[0]
    plan = np.zeros((5, B + 1), dtype=np.int64)
    packs, lengths, widths = plan[PLAN_PACKS], plan[PLAN_LENGTHS], plan[PLAN_WIDTHS]
    seq_bounds, cols = plan[PLAN_SEQ_BOUNDS], plan[PLAN_COLS]
    layout = np.zeros(N_SLOTS + 2 * spec.shape[0], dtype=np.int64)
    kept = 0
    for b in range(B):
        i = indices[b]
        if i < -num_packs or i >= num_packs:
            return plan, kept, b, layout, 0
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
    counts = np.empty(6, dtype=np.int64)  # by count kind (COUNT_*)
    counts[COUNT_W], counts[COUNT_S1], counts[COUNT_S] = cols[B], kept + 1, kept
    counts[COUNT_B], counts[COUNT_ONE], counts[COUNT_S_ALL] = B, 1, seq_bounds[B]
    pos = 0  # bytes
    for k in range(spec.shape[0]):
        size = spec[k, 0]
        pos = (pos + _ALIGN - 1) // _ALIGN * _ALIGN
        n = counts[spec[k, 1]]
        layout[N_SLOTS + 2 * k] = pos // size
        layout[N_SLOTS + 2 * k + 1] = n
        if spec[k, 2] >= 0:
            layout[spec[k, 2]] = pos // size
        pos += n * size
    layout[4] = layout[3]  # item_doc_ids and doc_ids: one slot, one of them written
    return plan, kept, -1, layout, (max(pos, 1) + _ALIGN - 1) // _ALIGN * _ALIGN


@njit(cache=True, nogil=True)
def pack_length(segments, seg_lo, seg_hi):
    """Token count of segments ``[seg_lo, seg_hi)`` of an int64 ``(S, 3)`` segment table."""
    n = 0
    for s in range(seg_lo, seg_hi):
        n += segments[s, 2] - segments[s, 1]
    return n
