"""One-pass numba kernels of the torch reader (spec/READER.md §1-§4).

``fill_item`` writes the per-token rows of one pack (input_ids, labels, position_ids,
doc_ids; which of them is chosen by a ``rows`` bit set) in a single pass over its segments, reading tokens straight from the memmaps.
``fill_packs`` lays out a whole batch of packs end to end in one call, with its
``cu_seqlens``. The rows are separate arrays so that input_ids may be int64, int32 or the
store's own width and position_ids / doc_ids int64 or int32 (labels stay int64).
All kernels are ``cache=True`` (compiled once per dtype combination, then loaded from
``__pycache__``) and ``nogil=True``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["fill_item", "fill_packs", "fill_item_doc_ids", "ROW_IDS", "ROW_POS", "ROW_DIDS", "doc_span", "finish_varlen",
           "count_labels", "IGNORE", "PAD_DOC", "PLAN_PACKS", "PLAN_LENGTHS", "PLAN_WIDTHS", "PLAN_SEQ_BOUNDS",
           "PLAN_COLS"]

IGNORE = -100
PAD_DOC = -1


#: ``rows`` bit flags of the kernels: which optional per-token rows to write.
ROW_IDS = 1  # input_ids (off when they are a zero-copy view of the source instead)
ROW_POS = 2  # position_ids
ROW_DIDS = 4  # doc_ids (segment index within the pack)


@njit(cache=True, nogil=True)
def fill_item(tokens, loss_mask, has_mask, doc_table, segments, seg_lo, seg_hi, src, src_mask, src_start, rows,
              b64, b32, bI, bJ, o_labels, o_ids, o_pos, o_dids, o_seq, o_docs, o_scalars, width, pack_id, pad_id):
    """Fill one item (``PackedDataset.__getitem__``): pack ``segments[seg_lo:seg_hi]`` in one buffer.

    Args:
        tokens: the store's token array (any unsigned int dtype), ``(num_tokens,)``.
        loss_mask: the store's uint8 loss mask, ``(num_tokens,)`` (ignored unless ``has_mask``).
        has_mask: whether the store has a loss mask.
        doc_table: where documents are, ``(doc_offsets, doc_start, doc_base, token_base, member_mask)`` (see
            ``doc_span``): for a store ``(its doc_offsets, [0, D], [0], [0], [has_mask])``.
        segments: int64 ``(S, 3)`` rows ``(doc, begin, end)``, document-relative half-open ranges.
        seg_lo, seg_hi: the pack's segment range ``[seg_lo, seg_hi)``.
        src, src_mask: where the pack's tokens / mask are read: the materialized pack tokens
            (then ``src_start`` is the pack's first token there) or ``tokens`` / ``loss_mask``
            themselves (then ``src_start < 0`` and each segment is read at its global offset).
        rows: bit set of ``ROW_IDS | ROW_POS | ROW_DIDS``: the rows to write (labels always).
        b64, b32, bI, bJ: int64, int32, index-dtype and input_ids-dtype views of the item's buffer.
        o_*: element offsets in those views: labels (b64, ``width``), input_ids (bJ), position_ids
            and doc_ids (bI), seq_lens (b32, ``k = seg_hi - seg_lo``), document_ids (b64, ``k``),
            scalars (b64, 2: the label count, then ``pack_id``). A row not in ``rows`` is not
            touched (its offset may be anything).
        width: columns of the item, ``>= n`` (the pack's tokens); ``[n, width)`` is padding
            (``pad_id``, -100, ``0, 1, ...``, -1).
    """
    k = seg_hi - seg_lo
    labels = b64[o_labels:o_labels + width]
    ids = bJ[o_ids:o_ids + width] if (rows & ROW_IDS) != 0 else bJ[0:1]
    pos = bI[o_pos:o_pos + width] if (rows & ROW_POS) != 0 else bI[0:1]
    dids = bI[o_dids:o_dids + width] if (rows & ROW_DIDS) != 0 else bI[0:1]
    b64[o_scalars] = _fill_one(tokens, loss_mask, has_mask, doc_table, segments, seg_lo, seg_hi, src, src_mask,
                               src_start, rows, ids, labels, pos, dids, 0, width, b32[o_seq:o_seq + k],
                               b64[o_docs:o_docs + k], 0, pad_id)
    b64[o_scalars + 1] = pack_id


#: Rows of the int64 ``(5, B + 1)`` plan of a batch (``_plan.plan_batch``): each pack's index, real tokens and
#: columns (``B`` entries), then where each pack's segments and columns start (``B + 1``).
PLAN_PACKS, PLAN_LENGTHS, PLAN_WIDTHS, PLAN_SEQ_BOUNDS, PLAN_COLS = range(5)


@njit(cache=True, nogil=True)
def fill_packs(tokens, loss_mask, has_mask, doc_table, segments, pack_offsets, src, src_mask, pack_token_offsets,
               materialized, rows, batch_rows, pad_id, plan, b64, b32, bI, bJ, offsets):
    """Fill a whole batch of packs, laid end to end, in one call (``PackedDataset.__getitems__``).

    Pack ``packs[b]`` occupies columns ``[W_b, W_b + widths[b])`` with ``W_b = sum(widths[:b])``
    (``widths[b]`` is its token count, or ``capacity`` when padded). ``W = sum(widths)``,
    ``S_all = seq_bounds[-1]`` segments (empty ones included), ``B`` packs.

    Args (those of the reader first, the same for every batch; then the batch's own):
        tokens, loss_mask, has_mask, doc_table, segments, src, src_mask, pad_id: as in ``fill_item``.
        pack_offsets: int64 ``(P + 1,)``: segment range of every pack.
        pack_token_offsets: int64 ``(P + 1,)``: first token of every pack in ``src`` (materialized only).
        materialized: whether ``src`` holds the materialized pack tokens.
        rows: as in ``fill_item``; ``ROW_DIDS`` there selects ``item_doc_ids``.
        batch_rows: ``ROW_DIDS`` to write ``doc_ids`` (the batch segment index), else 0.
        plan: int64 ``(5, B + 1)`` (``_plan.plan_batch``, rows ``PLAN_*``): the pack indices of the batch
            (``packs``), their ``widths`` and ``seq_bounds``.
        b64, b32, bI, bJ: int64, int32, index-dtype and input_ids-dtype views of one buffer.
        offsets: int64 ``(>= 12,)``: element offset of every slot of ``_plan.BATCH_SLOTS`` in its view:
            labels (b64, W), input_ids (bJ, W), position_ids (bI, W), doc_ids (bI, W: the *batch*
            segment index ``0..S-1`` over the non-empty segments, -1 for padding), item_doc_ids
            (bI, W: segment index within its pack, -1 for padding), seq_lens (b32, S_all),
            document_ids (b64, S_all), num_labels (b64, B), cu_seqlens (b32, ``0`` then the
            cumulative lengths of the ``S`` non-empty segments; ``S + 1`` entries),
            kept_document_ids (b64, the documents of the non-empty segments), pack_ids (b64, B),
            num_label_tokens (b64, 1). A slot of a row that is not written may have any offset.

    Returns:
        ``(longest segment (0 when none), S)``.
    """
    B = plan.shape[1] - 1
    packs, widths, seq_bounds = plan[PLAN_PACKS], plan[PLAN_WIDTHS], plan[PLAN_SEQ_BOUNDS]
    W = 0
    for b in range(B):
        W += widths[b]
    S_all = seq_bounds[B]
    labels = b64[offsets[0]:offsets[0] + W]
    ids = bJ[offsets[1]:offsets[1] + W] if (rows & ROW_IDS) != 0 else bJ[0:1]
    pos = bI[offsets[2]:offsets[2] + W] if (rows & ROW_POS) != 0 else bI[0:1]
    batch_seg = bI[offsets[3]:offsets[3] + W] if (batch_rows & ROW_DIDS) != 0 else bI[0:1]
    item_doc_ids = bI[offsets[4]:offsets[4] + W] if (rows & ROW_DIDS) != 0 else bI[0:1]
    seq_lens = b32[offsets[5]:offsets[5] + S_all]
    docs = b64[offsets[6]:offsets[6] + S_all]
    num_labels = b64[offsets[7]:offsets[7] + B]
    cu_seqlens = b32[offsets[8]:offsets[8] + S_all + 1]  # S + 1 used (S non-empty segments)
    kept_docs = b64[offsets[9]:offsets[9] + S_all]  # S used
    pack_ids = b64[offsets[10]:offsets[10] + B]
    p = 0
    batch_seg_i = 0
    longest = 0
    real = 0  # real (unpadded) tokens so far
    total_labels = 0
    cu_seqlens[0] = 0
    write_seg = (batch_rows & ROW_DIDS) != 0
    for b in range(B):
        i = packs[b]
        pack_ids[b] = i
        lo = pack_offsets[i]
        hi = pack_offsets[i + 1]
        start = pack_token_offsets[i] if materialized else -1
        num_labels[b] = _fill_one(tokens, loss_mask, has_mask, doc_table, segments, lo, hi, src, src_mask, start,
                                  rows, ids, labels, pos, item_doc_ids, p, widths[b], seq_lens, docs, seq_bounds[b],
                                  pad_id)
        total_labels += num_labels[b]
        q = p
        for k in range(seq_bounds[b], seq_bounds[b + 1]):
            ln = seq_lens[k]
            if ln > 0:
                if write_seg:
                    bv = batch_seg[q:q + ln]
                    for j in range(ln):
                        bv[j] = batch_seg_i
                kept_docs[batch_seg_i] = docs[k]
                batch_seg_i += 1
                q += ln
                real += ln
                cu_seqlens[batch_seg_i] = real
                if ln > longest:
                    longest = ln
        if write_seg:
            bv = batch_seg[q:p + widths[b]]
            for j in range(bv.shape[0]):
                bv[j] = PAD_DOC
        p += widths[b]
    b64[offsets[11]] = total_labels
    return longest, batch_seg_i


@njit(cache=True, nogil=True, inline="always")
def doc_span(doc_table, d):
    """``(first token, end, has mask)`` of document ``d`` in ``tokens``.

    ``doc_table = (doc_offsets, doc_start, doc_base, token_base, member_mask)``: document ``d``
    belongs to member ``m`` (``doc_start[m] <= d < doc_start[m + 1]``), whose ``doc_offsets`` start
    at element ``doc_base[m]`` of ``doc_offsets`` and whose tokens at element ``token_base[m]`` of
    ``tokens`` (a collection's members mapped end to end, spec/COLLECTION.md §6); ``member_mask[m]``
    is 0 when the member's mask is not mapped (its tokens are all trained). A store is one member.
    """
    doc_offsets, doc_start, doc_base, token_base, member_mask = doc_table
    lo, hi = 0, doc_start.shape[0] - 1  # the member m with doc_start[m] <= d < doc_start[m + 1]
    while hi - lo > 1:  # (np.searchsorted here costs a third of a collection's read throughput)
        mid = (lo + hi) >> 1
        if doc_start[mid] <= d:
            lo = mid
        else:
            hi = mid
    m = lo
    i = doc_base[m] + d - doc_start[m]
    return token_base[m] + doc_offsets[i], token_base[m] + doc_offsets[i + 1], member_mask[m] != 0


@njit(cache=True, nogil=True)
def _fill_one(tokens, loss_mask, has_mask, doc_table, segments, seg_lo, seg_hi, src, src_mask, src_start,
              rows, ids, labels, pos, dids, p0, width, seq_lens, docs, sl0, pad_id):
    """Write one pack at columns ``[p0, p0 + width)`` of the 1-D rows; return its label count."""
    p = p0
    nlab = 0
    ntok = tokens.shape[0]
    w_ids = (rows & ROW_IDS) != 0
    w_pos = (rows & ROW_POS) != 0
    w_dids = (rows & ROW_DIDS) != 0
    for s in range(seg_lo, seg_hi):
        d = segments[s, 0]
        b = segments[s, 1]
        e = segments[s, 2]
        ln = e - b
        doc_first, doc_end, member_mask = doc_span(doc_table, d)
        masked = has_mask and member_mask  # a member without a mask in a mixed collection: all trained
        g = doc_first + b  # index of the segment's first token in ``tokens``
        doc_len = doc_end - doc_first
        r = src_start + (p - p0) if src_start >= 0 else g  # where the segment starts in src
        k = s - seg_lo
        seq_lens[sl0 + k] = ln
        docs[sl0 + k] = d
        if ln <= 0:
            continue
        # Loops index slices from 0: with ``p + j`` numba cannot prove the index non-negative, keeps a
        # wraparound branch per element and the loop does not vectorize (measured 10x slower).
        sv = src[r:r + ln]
        lv = labels[p:p + ln]
        iv = ids[p:p + ln] if w_ids else ids[0:0]
        pv = pos[p:p + ln] if w_pos else pos[0:0]
        dv = dids[p:p + ln] if w_dids else dids[0:0]
        # One fused pass per row set (each loop vectorizes; a branch inside would not).
        if w_ids and w_pos and w_dids:
            for j in range(ln):
                iv[j] = sv[j]
                pv[j] = j
                dv[j] = k
        elif w_ids and w_pos:
            for j in range(ln):
                iv[j] = sv[j]
                pv[j] = j
        elif w_ids and w_dids:
            for j in range(ln):
                iv[j] = sv[j]
                dv[j] = k
        else:
            for j in range(iv.shape[0]):
                iv[j] = sv[j]
            for j in range(pv.shape[0]):
                pv[j] = j
            for j in range(dv.shape[0]):
                dv[j] = k
        if masked:
            mv = src_mask[r:r + ln]
            for j in range(ln - 1):
                keep = mv[j + 1] != 0
                lv[j] = sv[j + 1] if keep else IGNORE
                nlab += keep
        else:
            for j in range(ln - 1):
                lv[j] = sv[j + 1]
            nlab += ln - 1
        # Last token of the segment: the document's true next token at a cut, else nothing.
        nxt = g + ln
        if e < doc_len and nxt < ntok and not (masked and loss_mask[nxt] == 0):
            lv[ln - 1] = tokens[nxt]
            nlab += 1
        else:
            lv[ln - 1] = IGNORE
        p += ln
    npad = p0 + width - p
    labels[p:p + npad] = IGNORE
    if w_ids:
        ids[p:p + npad] = pad_id
    if w_pos:
        pv = pos[p:p + npad]
        for j in range(npad):
            pv[j] = j
    if w_dids:
        dids[p:p + npad] = PAD_DOC
    return nlab


@njit(cache=True, nogil=True)
def fill_item_doc_ids(seq_lens, out):
    """Write segment index ``k`` over segment ``k``'s run of ``out`` (empty segments count), -1 after."""
    p = 0
    for k in range(seq_lens.shape[0]):
        v = out[p:p + seq_lens[k]]
        for j in range(v.shape[0]):
            v[j] = k
        p += seq_lens[k]
    v = out[p:]
    for j in range(v.shape[0]):
        v[j] = PAD_DOC


@njit(cache=True, nogil=True)
def finish_varlen(seq_lens, docs, labels, cu_seqlens, kept_docs, doc_ids, write_doc_ids):
    """Segment metadata of a varlen batch collated from separate items (``collate_varlen``).

    Args:
        seq_lens: int32 ``(S_all,)``: every segment of every item, in order (empty ones included).
        docs: int64 ``(S_all,)``: their global document ids.
        labels: int64 ``(T,)``: the batch's labels (already copied).
        cu_seqlens: int32 ``(S + 1,)``, receives ``0`` and the cumulative lengths of the ``S``
            non-empty segments; kept_docs: int64 ``(S,)``, receives their document ids.
        doc_ids: ``(T,)``, receives the batch segment index ``0..S-1`` (if ``write_doc_ids``).

    Returns:
        ``(longest segment (0 when none), count of labels != -100)``.
    """
    s = 0
    p = 0
    longest = 0
    cu_seqlens[0] = 0
    for k in range(seq_lens.shape[0]):
        ln = seq_lens[k]
        if ln <= 0:
            continue
        if write_doc_ids:
            v = doc_ids[p:p + ln]
            for j in range(ln):
                v[j] = s
        kept_docs[s] = docs[k]
        p += ln
        s += 1
        cu_seqlens[s] = p
        if ln > longest:
            longest = ln
    return longest, count_labels(labels)


@njit(cache=True, nogil=True)
def count_labels(labels):
    """Count of ``labels != -100`` (no temporary mask)."""
    n = 0
    for j in range(labels.shape[0]):
        n += labels[j] != IGNORE
    return n
