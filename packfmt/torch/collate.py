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

import torch

from .dataset import IGNORE_INDEX, PAD_DOC_ID

__all__ = ["collate_varlen", "collate_padded", "collate_hf"]

_TOKEN_KEYS = ("input_ids", "labels", "position_ids")


def _real(item: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The per-token tensors of an item without its padding (``doc_ids == -1``)."""
    keep = item["doc_ids"] != PAD_DOC_ID
    if bool(keep.all()):
        return {k: item[k] for k in (*_TOKEN_KEYS, "doc_ids")}
    return {k: item[k][keep] for k in (*_TOKEN_KEYS, "doc_ids")}


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
    items = [_real(item) for item in batch]
    seq_lens = torch.cat([item["seq_lens"] for item in batch]).to(torch.int32)
    seq_lens = seq_lens[seq_lens > 0]
    cu = torch.zeros(seq_lens.numel() + 1, dtype=torch.int32)
    torch.cumsum(seq_lens, 0, out=cu[1:])
    out: dict[str, Any] = {k: torch.cat([it[k] for it in items]).unsqueeze(0) for k in _TOKEN_KEYS}
    out["doc_ids"] = torch.repeat_interleave(torch.arange(seq_lens.numel(), dtype=torch.int64), seq_lens.long()).unsqueeze(0)
    out["cu_seqlens"] = cu
    out["max_seqlen"] = int(seq_lens.max()) if seq_lens.numel() else 0
    out["document_ids"] = torch.cat([item["document_ids"] for item in batch])
    out["pack_ids"] = torch.stack([item["pack_id"] for item in batch])
    out["num_label_tokens"] = (out["labels"] != IGNORE_INDEX).sum()
    offsets = [0]
    for it in items[:-1]:
        offsets.append(offsets[-1] + it["input_ids"].shape[0])
    out.update(_images(batch, offsets))
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
    L = length if length is not None else max(int(item["input_ids"].shape[0]) for item in batch)
    B = len(batch)
    fill = {"input_ids": pad_token_id, "labels": IGNORE_INDEX, "doc_ids": PAD_DOC_ID}
    out: dict[str, Any] = {k: torch.full((B, L), v, dtype=torch.int64) for k, v in fill.items()}
    out["position_ids"] = torch.arange(L, dtype=torch.int64).repeat(B, 1)
    for r, item in enumerate(batch):
        n = int(item["input_ids"].shape[0])
        if n > L:
            raise ValueError(f"collate_padded: item {r} has {n} tokens, more than length {L}")
        for k in (*_TOKEN_KEYS, "doc_ids"):
            out[k][r, :n] = item[k]
        out["position_ids"][r, n:] = torch.arange(L - n)
    out["pack_ids"] = torch.stack([item["pack_id"] for item in batch])
    out["num_label_tokens"] = (out["labels"] != IGNORE_INDEX).sum()
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
    hf_labels = torch.full_like(shift, IGNORE_INDEX)
    hf_labels[:, 1:] = shift[:, :-1]
    hf_labels[:, v["cu_seqlens"][:-1].long()] = IGNORE_INDEX  # a segment's first token has no in-row predecessor
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
