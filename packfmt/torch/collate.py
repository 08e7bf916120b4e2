"""Collate functions for packs from ``PackedDataset`` (spec/READER.md §4).

* ``collate_varlen``: the batch as one row of ``T`` real tokens plus ``cu_seqlens`` (what
  ``flash_attn_varlen_func`` takes); padding is dropped.
* ``collate_padded``: ``B x L`` rows with ``doc_ids`` for a FlexAttention or SDPA document mask.
* ``collate_hf``: the keyword names of transformers' padding-free path, so ``model(**batch)`` works.

Every batch carries ``num_label_tokens`` (0-d int64 tensor) so a training loop can normalise
the loss by the global count of supervised tokens.

Every batch is a ``SharedBatch`` (a ``dict``) whose tensors are views of ONE byte buffer (images
of multimodal stores excepted): a DataLoader worker sends it as one shared-memory segment, and
``SharedBatch.pin_memory()`` / ``.to(device)`` copy that buffer once and rebuild the views.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch

from ._kernels import fill_batch_doc_ids, fill_padding
from .dataset import IGNORE_INDEX, PackBatch, _Arena

__all__ = ["collate_varlen", "collate_padded", "collate_hf", "SharedBatch"]

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


class SharedBatch(dict):
    """A collated batch: a plain ``dict`` whose tensors are views of one buffer.

    Pickling (a DataLoader worker's queue) sends the buffer once: torch's pickler memoizes the
    storage and rebuilds each view. Pinning or moving tensor by tensor would make one allocation
    and one copy per key; ``pin_memory()`` (which the DataLoader's pin-memory thread calls) and
    ``to(device)`` copy the bytes spanned by the views of each storage once and rebuild the views
    on the copy. Keys whose tensors were replaced by the caller are handled the same way (their
    own storage is a group of its own); non-tensor values are kept (``images`` lists are
    pinned / moved image by image).
    """

    def pin_memory(self, device: str | torch.device | None = None) -> "SharedBatch":
        """This batch in pinned (page-locked) memory: one pinned allocation per storage."""
        from torch.utils.data._utils.pin_memory import pin_memory as pin_any

        return self._map(lambda t: t.pin_memory(), lambda v: pin_any(v, device))

    def to(self, device: str | torch.device, non_blocking: bool = False) -> "SharedBatch":
        """This batch on ``device``: one copy per storage (e.g. one host-to-device transfer)."""
        def move(v):
            if isinstance(v, torch.Tensor):
                return v.to(device, non_blocking=non_blocking)
            if isinstance(v, list):
                return [move(x) for x in v]
            return v

        return self._map(move, move)

    def _map(self, copy_span: Callable[[torch.Tensor], torch.Tensor], other: Callable[[Any], Any]) -> "SharedBatch":
        groups: dict[tuple[str, int], list[str]] = {}
        out = SharedBatch()
        for k, v in self.items():
            out[k] = v
            if isinstance(v, torch.Tensor) and v.layout == torch.strided and v.device.type == "cpu":
                groups.setdefault((str(v.device), v.untyped_storage().data_ptr()), []).append(k)
            else:
                out[k] = other(v)
        for keys in groups.values():
            ts = [self[k] for k in keys]
            lo = min(t.storage_offset() * t.element_size() for t in ts) // _ALIGN_BYTES * _ALIGN_BYTES
            hi = max(_end_byte(t) for t in ts)
            raw = torch.empty(0, dtype=torch.uint8).set_(ts[0].untyped_storage(), 0, (ts[0].untyped_storage().nbytes(),))
            moved = copy_span(raw[lo:hi])
            for k, t in zip(keys, ts):
                off = t.storage_offset() * t.element_size() - lo
                out[k] = torch.empty(0, dtype=t.dtype, device=moved.device).set_(
                    moved.untyped_storage(), moved.storage_offset() + off // t.element_size(), t.size(), t.stride())
        return out


_ALIGN_BYTES = 8  # every view starts at a multiple of its itemsize (<= 8) in the buffer


def _end_byte(t: torch.Tensor) -> int:
    """One past the last byte of storage that tensor ``t`` uses."""
    if t.numel() == 0:
        return t.storage_offset() * t.element_size()
    last = t.storage_offset() + sum((n - 1) * st for n, st in zip(t.shape, t.stride()))
    return (last + 1) * t.element_size()


def _fill_pack_ids(batch: Sequence[dict[str, Any]], ar: _Arena) -> None:
    ar.array("pack_ids")[:] = [int(item["pack_id"]) for item in batch]


def _index_np(batch: Sequence[dict[str, Any]]):
    """numpy dtype of the batch's input_ids / position_ids / doc_ids (the items' own dtype)."""
    return np.int32 if batch and batch[0]["input_ids"].dtype == torch.int32 else np.int64


def _varlen_shared(batch: PackBatch) -> SharedBatch:
    """``collate_varlen`` of an intact, unpadded ``PackBatch``: views of its buffer, no copy."""
    ar, S = batch.arena, batch.num_segments
    out = SharedBatch((k, ar.tensor(k).unsqueeze(0)) for k in _ROW_KEYS)
    out["cu_seqlens"] = ar.tensor("cu_seqlens")[:S + 1]
    out["max_seqlen"] = batch.max_seqlen
    out["document_ids"] = ar.tensor("kept_document_ids")[:S]
    out["pack_ids"] = ar.tensor("pack_ids")
    out["num_label_tokens"] = ar.tensor("num_label_tokens")
    out._hf_labels = ar.tensor("hf_labels").unsqueeze(0)
    if "images" in batch[0]:
        out.update(_images(batch, np.concatenate([[0], np.cumsum(batch.lengths)[:-1]]).tolist()))
    return out


def _padded_shared(batch: PackBatch, L: int) -> SharedBatch:
    """``collate_padded`` of an intact ``PackBatch`` whose items all have ``L`` columns: views, no copy."""
    B, ar = len(batch), batch.arena
    out = SharedBatch((k, ar.tensor(k).view(B, L)) for k in _ROW_KEYS[:3])
    out["doc_ids"] = ar.tensor("item_doc_ids").view(B, L)
    out["pack_ids"] = ar.tensor("pack_ids")
    out["num_label_tokens"] = ar.tensor("num_label_tokens")
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
    T, B = int(real.sum()), len(batch)
    lens = seq_lens[keep]
    S, I = lens.shape[0], _index_np(batch)
    ar = _Arena([("labels", np.int64, (T,)), ("input_ids", I, (T,)), ("position_ids", I, (T,)), ("doc_ids", I, (T,)),
                 ("cu_seqlens", np.int32, (S + 1,)), ("document_ids", np.int64, (S,)), ("pack_ids", np.int64, (B,)),
                 ("num_label_tokens", np.int64, ()), ("hf_labels", np.int64, (T,))])
    for key in _TOKEN_KEYS:
        parts = [_np(item[key])[:n] for item, n in zip(batch, real.tolist())]
        if parts:
            np.concatenate(parts, out=ar.array(key))
    max_seqlen = int(fill_batch_doc_ids(lens, ar.array("doc_ids")))  # segment index 0..S-1 over the batch
    cu = ar.array("cu_seqlens")
    cu[0] = 0
    np.cumsum(lens, out=cu[1:])
    if B:
        ar.array("document_ids")[:] = np.concatenate([_np(item["document_ids"]) for item in batch])[keep]
    _fill_pack_ids(batch, ar)
    ar.array("num_label_tokens")[()] = np.count_nonzero(ar.array("labels") != IGNORE_INDEX)
    out = SharedBatch((k, ar.tensor(k).unsqueeze(0)) for k in _ROW_KEYS)
    out["cu_seqlens"] = ar.tensor("cu_seqlens")
    out["max_seqlen"] = max_seqlen
    out["document_ids"] = ar.tensor("document_ids")
    out["pack_ids"] = ar.tensor("pack_ids")
    out["num_label_tokens"] = ar.tensor("num_label_tokens")
    out._hf_labels = ar.tensor("hf_labels").unsqueeze(0)
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
    for r, n in enumerate(lengths):
        if n > L:
            raise ValueError(f"collate_padded: item {r} has {n} tokens, more than length {L}")
    I = _index_np(batch)
    ar = _Arena([("labels", np.int64, (B, L)), ("input_ids", I, (B, L)), ("position_ids", I, (B, L)),
                 ("doc_ids", I, (B, L)), ("pack_ids", np.int64, (B,)), ("num_label_tokens", np.int64, ())])
    rows = [ar.array(key) for key in _ROW_KEYS]
    for r, (item, n) in enumerate(zip(batch, lengths)):
        for k, key in enumerate(_ROW_KEYS):
            rows[k][r, :n] = _np(item[key])
        if n < L:
            fill_padding(rows[0], rows[1], rows[2], rows[3], r, n, pad_token_id)
    _fill_pack_ids(batch, ar)
    ar.array("num_label_tokens")[()] = np.count_nonzero(rows[1] != IGNORE_INDEX)
    out = SharedBatch((k, ar.tensor(k)) for k in _ROW_KEYS)
    out["pack_ids"] = ar.tensor("pack_ids")
    out["num_label_tokens"] = ar.tensor("num_label_tokens")
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
    hf_labels = getattr(v, "_hf_labels", None)  # room in the batch's own buffer
    if hf_labels is None or hf_labels.shape != shift.shape:
        hf_labels = torch.empty_like(shift)
    hf = _np(hf_labels)[0]
    hf[1:] = s[:-1]
    hf[cu[:-1]] = IGNORE_INDEX  # a segment's first token has no in-row predecessor (hf[0] included)
    return SharedBatch({
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
    })
