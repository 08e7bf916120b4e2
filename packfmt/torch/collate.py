"""Collate functions for packs from ``PackedDataset`` (spec/READER.md §4).

* ``collate_varlen``: the batch as one row of ``T`` real tokens plus ``cu_seqlens`` (what
  ``flash_attn_varlen_func`` takes); padding is dropped.
* ``collate_padded``: ``B x L`` rows with ``doc_ids`` for a FlexAttention or SDPA document mask.
* ``collate_hf``: the keyword names of transformers' padding-free path, so ``model(**batch)`` works.

Every batch carries ``num_label_tokens`` (0-d int64 tensor) so a training loop can normalise
the loss by the global count of supervised tokens.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from ._kernels import fill_batch_doc_ids, fill_padding
from .dataset import IGNORE_INDEX, PackBatch

__all__ = ["collate_varlen", "collate_padded", "collate_hf"]

_TOKEN_KEYS = ("input_ids", "labels", "position_ids")
_ROW_KEYS = ("input_ids", "labels", "position_ids", "doc_ids")


def _np(t: torch.Tensor) -> np.ndarray:
    """The numpy view of a CPU tensor (no copy)."""
    return t.numpy()


def _real_lengths(batch: Sequence[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Segment lengths of a batch and each item's real (unpadded) token count.

    Padding always follows an item's segments (``PackedDataset`` pads on the right), so an
    item's real tokens are its first ``sum(seq_lens)`` positions.

    Returns:
        seq_lens int32 ``(S_all,)`` (every segment of every item, in order), keep bool
        ``(S_all,)`` (``seq_lens > 0``) and real int64 ``(B,)``.
    """
    parts = [_np(item["seq_lens"]) for item in batch]
    seq_lens = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)
    csum = np.zeros(seq_lens.shape[0] + 1, dtype=np.int64)
    np.cumsum(seq_lens, out=csum[1:])
    bounds = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum([p.shape[0] for p in parts], out=bounds[1:])
    return seq_lens, seq_lens > 0, csum[bounds[1:]] - csum[bounds[:-1]]


def _label_count(labels: np.ndarray) -> torch.Tensor:
    """int64 0-d tensor: positions of ``labels`` that are not -100."""
    return torch.scalar_tensor(int(np.count_nonzero(labels != IGNORE_INDEX)), dtype=torch.int64)


def _pack_ids(batch: Sequence[dict[str, Any]]) -> torch.Tensor:
    return torch.from_numpy(np.array([int(item["pack_id"]) for item in batch], dtype=np.int64))


def _varlen_shared(batch: PackBatch) -> dict[str, Any]:
    """``collate_varlen`` of an intact, unpadded ``PackBatch``: views of its buffer, no copy."""
    keep = batch.seq_lens > 0
    lens = batch.seq_lens[keep]
    cu = np.zeros(lens.shape[0] + 1, dtype=np.int32)
    np.cumsum(lens, out=cu[1:])
    out: dict[str, Any] = dict(zip(_ROW_KEYS, batch.rows.unsqueeze(1).unbind(0)))
    out["cu_seqlens"] = torch.from_numpy(cu)
    out["max_seqlen"] = batch.max_seqlen
    out["document_ids"] = torch.from_numpy(batch.document_ids[keep])
    out["pack_ids"] = torch.from_numpy(batch.pack_ids.copy())
    out["num_label_tokens"] = _label_count(batch.rows.numpy()[1])
    if "images" in batch[0]:
        out.update(_images(batch, np.concatenate([[0], np.cumsum(batch.lengths)[:-1]]).tolist()))
    return out


def _padded_shared(batch: PackBatch, L: int) -> dict[str, Any]:
    """``collate_padded`` of an intact ``PackBatch`` whose items all have ``L`` columns: views, no copy."""
    B = len(batch)
    rows = batch.rows
    out: dict[str, Any] = {"input_ids": rows[0].view(B, L), "labels": rows[1].view(B, L),
                           "position_ids": rows[2].view(B, L), "doc_ids": batch.item_doc_ids.view(B, L)}
    out["pack_ids"] = torch.from_numpy(batch.pack_ids.copy())
    out["num_label_tokens"] = _label_count(rows.numpy()[1])
    out.update(_images(batch, [r * L for r in range(B)]))
    return out


def _images(batch: Sequence[dict[str, Any]], token_offsets: Sequence[int]) -> dict[str, Any]:
    """Images of a batch and their spans, shifted by each item's first token in the batch."""
    if "images" not in batch[0]:
        return {}
    images = [img for item in batch for img in item["images"]]
    spans = [item["image_spans"] + off for item, off in zip(batch, token_offsets)]
    return {"images": images, "image_spans": torch.cat(spans) if spans else torch.zeros(0, 2, dtype=torch.int64),
            "image_ids": torch.cat([item["image_ids"] for item in batch])}


def collate_varlen(batch: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Flatten a batch of packs into one row of ``T`` real tokens.

    Returns:
        input_ids, labels, position_ids: int64 ``(1, T)``.
        doc_ids: int64 ``(1, T)``: segment index within the batch, ``0..S-1``.
        cu_seqlens: int32 ``(S + 1,)``: cumulative segment lengths, ``cu_seqlens[0] = 0``,
            ``cu_seqlens[-1] = T``; every segment of every pack, none of length zero.
        max_seqlen: Python int, the longest segment (a tensor would force a device sync).
        document_ids: int64 ``(S,)``: global document id of each segment.
        pack_ids: int64 ``(B,)``.
        num_label_tokens: int64 0-d tensor.
        (images, image_spans, image_ids for multimodal stores; spans index the row of T tokens.)
    """
    if isinstance(batch, PackBatch) and not (batch.widths != batch.lengths).any() and batch.intact():
        return _varlen_shared(batch)
    seq_lens, keep, real = _real_lengths(batch)
    T = int(real.sum())
    rows = np.empty((4, T), dtype=np.int64)  # input_ids, labels, position_ids, doc_ids
    for k, key in enumerate(_TOKEN_KEYS):
        parts = [_np(item[key])[:n] for item, n in zip(batch, real.tolist())]
        if parts:
            np.concatenate(parts, out=rows[k])
    lens = seq_lens[keep]
    max_seqlen = int(fill_batch_doc_ids(lens, rows[3]))  # segment index 0..S-1 over the batch
    cu = np.zeros(lens.shape[0] + 1, dtype=np.int32)
    np.cumsum(lens, out=cu[1:])
    docs = np.concatenate([_np(item["document_ids"]) for item in batch])[keep]
    t = torch.from_numpy(rows).unsqueeze(1)  # (4, 1, T)
    out: dict[str, Any] = dict(zip(_ROW_KEYS, t.unbind(0)))
    out["cu_seqlens"] = torch.from_numpy(cu)
    out["max_seqlen"] = max_seqlen
    out["document_ids"] = torch.from_numpy(docs)
    out["pack_ids"] = _pack_ids(batch)
    out["num_label_tokens"] = _label_count(rows[1])
    if "images" in batch[0]:
        out.update(_images(batch, np.concatenate([[0], np.cumsum(real)[:-1]]).tolist()))
    return out


def collate_padded(batch: Sequence[dict[str, Any]], *, length: int | None = None, pad_token_id: int = 0) -> dict[str, Any]:
    """Stack packs into ``B x L`` rows (``L`` = ``length`` or the longest item).

    Padding positions get ``input_ids = pad_token_id``, ``labels = -100``, ``doc_ids = -1`` and
    positions ``0, 1, ...`` (so a position-based packing detector sees them as their own run).
    No attention_mask is returned: build the document mask from ``doc_ids``
    (``attention.document_causal_mask`` or ``attention.flex_document_block_mask``).

    Returns:
        input_ids, labels, position_ids, doc_ids: int64 ``(B, L)``.
        pack_ids: int64 ``(B,)``; num_label_tokens: int64 0-d tensor. (Images as in ``collate_varlen``, spans offset by ``row * L``.)
    """
    lengths = [int(item["input_ids"].shape[0]) for item in batch]
    L = length if length is not None else max(lengths)
    B = len(batch)
    if isinstance(batch, PackBatch) and all(n == L for n in lengths) and batch.intact():
        return _padded_shared(batch, L)
    rows = np.empty((4, B, L), dtype=np.int64)  # input_ids, labels, position_ids, doc_ids
    for r, (item, n) in enumerate(zip(batch, lengths)):
        if n > L:
            raise ValueError(f"collate_padded: item {r} has {n} tokens, more than length {L}")
        for k, key in enumerate(_ROW_KEYS):
            rows[k, r, :n] = _np(item[key])
        if n < L:
            fill_padding(rows, r, n, pad_token_id)
    t = torch.from_numpy(rows)
    out: dict[str, Any] = dict(zip(_ROW_KEYS, t.unbind(0)))
    out["pack_ids"] = _pack_ids(batch)
    out["num_label_tokens"] = _label_count(rows[1])
    out.update(_images(batch, [r * L for r in range(B)]))
    return out


def collate_hf(batch: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The padding-free batch of transformers' ``DataCollatorWithFlattening`` (plus exact labels).

    ``model(**batch)`` works for a transformers causal LM: no ``attention_mask`` (its presence
    turns off packed-sequence detection) and ``use_cache=False`` (a cache does too).

    Returns:
        input_ids, position_ids: int64 ``(1, T)``.
        labels: int64 ``(1, T)`` in transformers' unshifted convention (``labels[t]`` is the target
            of position ``t - 1``; -100 at each segment's first token).
        shift_labels: int64 ``(1, T)``, the exact next-token targets; transformers' loss uses
            these instead of shifting ``labels``, which keeps the true label at a split document's cut.
        cu_seq_lens_q, cu_seq_lens_k: int32 ``(S + 1,)``; max_length_q, max_length_k: Python int.
        use_cache: False. num_label_tokens: int64 0-d tensor.
    """
    v = collate_varlen(batch)
    shift = v["labels"]
    s, cu = _np(shift)[0], _np(v["cu_seqlens"])
    hf = np.empty_like(s)
    hf[1:] = s[:-1]
    hf[cu[:-1]] = IGNORE_INDEX  # a segment's first token has no in-row predecessor (hf[0] included)
    hf_labels = torch.from_numpy(hf).unsqueeze(0)
    return {
        "input_ids": v["input_ids"],
        "position_ids": v["position_ids"],
        "labels": hf_labels,
        "shift_labels": shift,
        "cu_seq_lens_q": v["cu_seqlens"],
        "cu_seq_lens_k": v["cu_seqlens"],
        "max_length_q": v["max_seqlen"],
        "max_length_k": v["max_seqlen"],
        "use_cache": False,
        "num_label_tokens": v["num_label_tokens"],
    }
