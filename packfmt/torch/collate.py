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

from ._kernels import count_labels, finish_varlen
from ._arena import _NP_OF, _Arena
from .batch import PackBatch
from .dataset import FIELDS, IGNORE_INDEX, PAD_DOC_ID

__all__ = ["collate_varlen", "collate_padded", "collate_hf", "SharedBatch"]

_ROW_KEYS = FIELDS  # the per-token rows, in their order


def _np(t: torch.Tensor) -> np.ndarray:
    """The numpy view of a CPU tensor (no copy)."""
    return t.numpy()


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


_VARLEN_ITEM_KEYS = ("input_ids", "labels", "seq_lens", "document_ids", "pack_id")


def _require(batch: Sequence[dict[str, Any]], keys: Sequence[str], who: str) -> None:
    """Raise a ValueError naming the item keys a collate needs and the items lack."""
    missing = [k for k in keys if batch and k not in batch[0]]
    if missing:
        raise ValueError(f"{who}: the items lack {missing}, found keys {sorted(batch[0])}; if a wrapper removed "
                         f"them (transformers' Trainer drops the keys its model's forward does not name), pass "
                         f"TrainingArguments(remove_unused_columns=False)")


def _check_segments(batch: Sequence[dict[str, Any]], seq_t: list, seq_all: np.ndarray, who: str) -> None:
    """What ``finish_varlen`` indexes with, which it does not check (numba): each item's ``seq_lens`` ``>= 0`` and
    summing to at most its tokens, one ``document_ids`` entry per segment. An item built or changed by hand that
    breaks these would have the kernel write past the batch's buffer: a ValueError naming the item instead.
    (A few microseconds for 8 items: Python over small lists, one pass over the lengths.)"""
    n_seg = [t.shape[0] for t in seq_t]
    n_doc = [item["document_ids"].shape[0] for item in batch]
    if n_doc != n_seg:
        r = next(r for r, (a, b) in enumerate(zip(n_doc, n_seg)) if a != b)
        raise ValueError(f"{who}: item {r}: document_ids: expected {n_seg[r]} entries (one per seq_lens entry), "
                         f"found {n_doc[r]}")
    lens = seq_all.tolist()  # a few entries an item: Python lists beat numpy's per-call cost here
    at = 0
    for r, (item, n) in enumerate(zip(batch, n_seg)):
        mine = lens[at:at + n]
        at += n
        if mine and min(mine) < 0:
            j = next(j for j, v in enumerate(mine) if v < 0)
            raise ValueError(f"{who}: item {r}: seq_lens[{j}]: expected a length >= 0, found {mine[j]}")
        if sum(mine) > item["input_ids"].shape[0]:
            raise ValueError(f"{who}: item {r}: seq_lens: expected lengths summing to at most its "
                             f"{int(item['input_ids'].shape[0])} tokens (input_ids), found {sum(mine)}")


def _fill_pack_ids(batch: Sequence[dict[str, Any]], ar: _Arena) -> None:
    # .item() on a 0-d tensor; items built by hand may carry plain ints
    ar.array("pack_ids")[:] = [t.item() if isinstance(t, torch.Tensor) else int(t) for t in
                               (item["pack_id"] for item in batch)]


def _index_np(batch: Sequence[dict[str, Any]]):
    """numpy dtype of the batch's position_ids / doc_ids (the items' own index dtype)."""
    for key in ("position_ids", "doc_ids"):
        if batch and key in batch[0]:
            return np.int32 if batch[0][key].dtype == torch.int32 else np.int64
    return np.int64


def _ids_np(batch: Sequence[dict[str, Any]]):
    """numpy dtype of the batch's input_ids (the items' own: int64, int32 or a native width)."""
    return _NP_OF[batch[0]["input_ids"].dtype] if batch else np.int64


def _row_keys(batch: Sequence[dict[str, Any]]) -> tuple[str, ...]:
    """The per-token keys the items carry, in ``_ROW_KEYS`` order (input_ids and labels always)."""
    if isinstance(batch, PackBatch):
        return batch.fields  # PackedDataset keeps its fields in FIELDS order
    return tuple(k for k in _ROW_KEYS if not batch or k in batch[0] or k in ("input_ids", "labels"))


def _varlen_shared(batch: PackBatch) -> SharedBatch:
    """``collate_varlen`` of an intact, unpadded ``PackBatch``: views of its buffer, no copy."""
    ar = batch.arena
    tensor = ar.tensor
    out = SharedBatch()
    for k in batch.fields:  # the per-token keys the items carry, in FIELDS order (``_row_keys``)
        out[k] = tensor(k, True)
    out["cu_seqlens"] = tensor("cu_seqlens")
    out["max_seqlen"] = batch.max_seqlen
    out["document_ids"] = tensor("kept_document_ids")
    out["pack_ids"] = tensor("pack_ids")
    out["num_label_tokens"] = tensor("num_label_tokens")
    out._hf_room = ar.room("hf_labels") if "hf_labels" in ar else None  # collate_hf's labels, same buffer
    if batch._ds._views()["images"] is not None:
        out.update(_images(batch, np.concatenate([[0], np.cumsum(batch.lengths)[:-1]]).tolist()))
    return out


def _padded_shared(batch: PackBatch, L: int) -> SharedBatch:
    """``collate_padded`` of an intact ``PackBatch`` whose items all have ``L`` columns: views, no copy."""
    B, ar = len(batch), batch.arena
    out = SharedBatch()
    for k in _row_keys(batch):
        out[k] = ar.tensor(k).view(B, L)
    out["pack_ids"] = ar.tensor("pack_ids")
    out["num_label_tokens"] = ar.tensor("num_label_tokens")
    if batch._ds._views()["images"] is not None:
        out.update(_images(batch, [r * L for r in range(B)]))
    return out


def _images(batch: Sequence[dict[str, Any]], token_offsets: Sequence[int]) -> dict[str, Any]:
    """Images of a batch and their spans, shifted by each item's first token in the batch."""
    if "images" not in batch[0]:
        return {}
    images = [img for item in batch for img in item["images"]]
    spans = [item["image_spans"] + off for item, off in zip(batch, token_offsets)]
    out = {"images": images, "image_spans": torch.cat(spans) if spans else torch.zeros(0, 2, dtype=torch.int64),
           "image_ids": torch.cat([item["image_ids"] for item in batch])}
    if images and all(isinstance(t, torch.Tensor) for t in images):
        shape, dtype = images[0].shape, images[0].dtype
        if all(t.shape == shape and t.dtype == dtype for t in images):
            # one tensor (and one shared-memory segment from a worker); ``images`` become its views
            out["pixel_values"] = torch.stack(images)
            out["images"] = list(out["pixel_values"].unbind(0))
    return out


def collate_varlen(batch: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Flatten a batch of packs into one row of ``T`` real tokens.

    Returns:
        input_ids, labels, position_ids: ``(1, T)`` (dtypes of the items: int64 by default).
        doc_ids: ``(1, T)``: segment index within the batch, ``0..S-1``.
        (position_ids and doc_ids only when the items carry them: ``PackedDataset(fields=...)``.)
        cu_seqlens: int32 ``(S + 1,)``: cumulative segment lengths, ``cu_seqlens[0] = 0``,
            ``cu_seqlens[-1] = T``; every segment of every pack, none of length zero.
        max_seqlen: Python int, the longest segment (a tensor would force a device sync).
        document_ids: int64 ``(S,)``: global document id of each segment.
        pack_ids: int64 ``(B,)``.
        num_label_tokens: int64 0-d tensor.
        (images, image_spans, image_ids for multimodal stores; spans index the row of T tokens;
        pixel_values: ``torch.stack(images)`` when every image is a tensor of one shape and dtype,
        e.g. after ``ImageProcessorTransform``; ``images`` are then views of it.)
    """
    return _varlen(batch, hf_room=False, who="collate_varlen")


def _varlen(batch: Sequence[dict[str, Any]], hf_room: bool, who: str) -> SharedBatch:
    """``collate_varlen``: views of an intact unpadded ``PackBatch``, else a copy of the items' rows.

    ``who``: the public collate the user called, named in errors.
    """
    if isinstance(batch, PackBatch) and not batch.padded and batch.intact():
        return _varlen_shared(batch)
    return _varlen_copy(batch, hf_room, who)


def _varlen_copy(batch: Sequence[dict[str, Any]], hf_room: bool, who: str) -> SharedBatch:
    """``collate_varlen`` by copying the items' rows (``hf_room``: reserve ``collate_hf``'s labels)."""
    _require(batch, _VARLEN_ITEM_KEYS, who)
    B, keys, I = len(batch), _row_keys(batch), _index_np(batch)
    seq_t = [item["seq_lens"] for item in batch]
    seq_all = torch.cat(seq_t).numpy() if B else np.zeros(0, dtype=np.int32)
    T, S = int(seq_all.sum(dtype=np.int64)), int(np.count_nonzero(seq_all))
    _check_segments(batch, seq_t, seq_all, who)
    # An item's real tokens are its first sum(seq_lens) positions (PackedDataset pads on the right).
    trim = None
    if sum(item["input_ids"].shape[0] for item in batch) != T:  # some item is padded: cut each to its real tokens
        csum = np.zeros(seq_all.shape[0] + 1, dtype=np.int64)
        np.cumsum(seq_all, out=csum[1:])
        bounds = np.cumsum([0] + [t.shape[0] for t in seq_t])
        trim = (csum[bounds[1:]] - csum[bounds[:-1]]).tolist()
    ar = _Arena([("labels", np.int64, (T,)), ("input_ids", _ids_np(batch), (T,))]
                + [(k, I, (T,)) for k in keys[2:]]
                + [("cu_seqlens", np.int32, (S + 1,)), ("document_ids", np.int64, (S,)), ("pack_ids", np.int64, (B,)),
                   ("num_label_tokens", np.int64, ())] + ([("hf_labels", np.int64, (T,))] if hf_room else []))
    for key in keys:
        if key == "doc_ids" or not B:
            continue
        parts = [item[key] for item in batch] if trim is None else [item[key][:n] for item, n in zip(batch, trim)]
        torch.cat(parts, out=ar.tensor(key))
    docs_all = torch.cat([item["document_ids"] for item in batch]).numpy() if B else np.zeros(0, dtype=np.int64)
    doc_ids = ar.array("doc_ids") if "doc_ids" in ar else np.zeros(1, dtype=I)
    max_seqlen, num_labels = finish_varlen(seq_all, docs_all, ar.array("labels"), ar.array("cu_seqlens"),
                                           ar.array("document_ids"), doc_ids, "doc_ids" in ar)
    _fill_pack_ids(batch, ar)
    ar.array("num_label_tokens")[()] = num_labels
    out = SharedBatch((k, ar.tensor(k, row=True)) for k in keys)
    out["cu_seqlens"] = ar.tensor("cu_seqlens")
    out["max_seqlen"] = int(max_seqlen)
    out["document_ids"] = ar.tensor("document_ids")
    out["pack_ids"] = ar.tensor("pack_ids")
    out["num_label_tokens"] = ar.tensor("num_label_tokens")
    out._hf_room = ar.room("hf_labels") if hf_room else None  # room for collate_hf's labels in the same buffer
    if B and "images" in batch[0]:
        reals = trim if trim is not None else [item["input_ids"].shape[0] for item in batch]
        out.update(_images(batch, np.concatenate([[0], np.cumsum(reals)[:-1]]).tolist()))
    return out


def collate_padded(batch: Sequence[dict[str, Any]], *, length: int | None = None, pad_token_id: int = 0) -> dict[str, Any]:
    """Stack packs into ``B x L`` rows (``L`` = ``length`` or the longest item).

    Padding positions get ``input_ids = pad_token_id``, ``labels = -100``, ``doc_ids = -1`` and
    positions ``0, 1, ...`` (so a position-based packing detector sees them as their own run).
    No attention_mask is returned: build the document mask from ``doc_ids``
    (``attention.document_causal_mask`` or ``attention.flex_document_block_mask``).

    Returns:
        input_ids, labels, position_ids, doc_ids: ``(B, L)`` (dtypes of the items: int64 by
        default; position_ids / doc_ids only when the items carry them).
        pack_ids: int64 ``(B,)``; num_label_tokens: int64 0-d tensor. (Images as in ``collate_varlen``, spans offset by ``row * L``.)
    """
    if isinstance(batch, PackBatch):  # the layout knows the widths: no item needs to be built
        lengths = batch.widths.tolist()
        L = length if length is not None else max(lengths, default=0)
        if batch.padded and all(n == L for n in lengths) and batch.intact():
            return _padded_shared(batch, L)
    _require(batch, ("input_ids", "labels", "pack_id"), "collate_padded")
    lengths = [int(item["input_ids"].shape[0]) for item in batch]
    L = length if length is not None else max(lengths)
    B = len(batch)
    for r, n in enumerate(lengths):
        if n > L:
            raise ValueError(f"collate_padded: item {r} has {n} tokens, more than length {L}")
    I, keys = _index_np(batch), _row_keys(batch)
    ar = _Arena([("labels", np.int64, (B, L)), ("input_ids", _ids_np(batch), (B, L))]
                + [(k, I, (B, L)) for k in keys[2:]]
                + [("pack_ids", np.int64, (B,)), ("num_label_tokens", np.int64, ())])
    pad_values = {"input_ids": pad_token_id, "labels": IGNORE_INDEX, "doc_ids": PAD_DOC_ID}
    full = all(n == L for n in lengths)
    for key in keys:
        if full and B:  # every item already has L columns (pad_to_capacity): one stack per key
            torch.stack([item[key] for item in batch], out=ar.tensor(key))
            continue
        row = ar.array(key)
        for r, (item, n) in enumerate(zip(batch, lengths)):
            row[r, :n] = _np(item[key])
            if n < L:
                row[r, n:] = np.arange(L - n) if key == "position_ids" else pad_values[key]
    _fill_pack_ids(batch, ar)
    ar.array("num_label_tokens")[()] = count_labels(ar.array("labels").reshape(-1))
    out = SharedBatch((k, ar.tensor(k)) for k in keys)
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
    v = _varlen(batch, hf_room=True, who="collate_hf")  # a copy reserves room for the unshifted labels in its buffer
    if "position_ids" not in v:
        raise ValueError("collate_hf: the items carry no position_ids (PackedDataset(fields=...) left them out); "
                         "transformers' padding-free path needs them: keep 'position_ids' in fields")
    if v["input_ids"].dtype not in (torch.int64, torch.int32):
        raise ValueError(f"collate_hf: input_ids are {v['input_ids'].dtype} (input_ids_dtype='native'); a "
                         f"transformers embedding takes int64 or int32: use input_ids_dtype=None or torch.int32")
    shift = v["labels"]
    s, cu = _np(shift)[0], _np(v["cu_seqlens"])
    room = getattr(v, "_hf_room", None)  # (buffer, int64 offset, length): room in the batch's own buffer
    hf_labels = None
    if room is not None and room[2] == shift.shape[1]:
        hf_labels = room[0].view(torch.int64).as_strided((1, room[2]), (room[2], 1), room[1])
    if hf_labels is None:
        if isinstance(batch, PackBatch):  # from now on this process's batches of that dataset reserve it
            batch._ds._hf_room = True
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
