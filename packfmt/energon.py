"""One exported pack (spec/WEBDATASET.md §2) as a Megatron training sample: what a Megatron-Energon
cooker returns for a ``CrudeWebdataset`` sample of ``packfmt export webdataset``.

``sample_to_batch(sample)`` takes the crude sample (a dict keyed by member extension: ``input_ids.npy``,
``loss_mask.npy``, ``cu_seqlens.npy``, ``last_labels.npy``, ``json``; NumPy arrays and a dict as
Energon's default ``SampleDecoder`` gives them, or the raw member bytes with ``decoder = None``) and
returns the pack's ``input_ids``, ``labels`` (exactly ``PackedDataset``'s, spec/READER.md §2, the
true next token at every cut included), ``position_ids``, ``cu_seqlens`` and ``max_seqlen`` for the
``thd`` layout, and the images' collection-wide ids and token spans. Only NumPy and torch are needed;
``packed_seq_params=True`` adds Megatron-Core's ``PackedSeqParams`` (imported then, not before).
Worked example with the Energon task encoder: spec/WEBDATASET.md §3.
"""

from __future__ import annotations

import io
import json

import numpy as np

__all__ = ["sample_to_batch", "pack_labels", "make_packed_seq_params"]

IGNORE_INDEX = -100


def _array(sample: dict, ext: str) -> np.ndarray:
    value = sample[ext]
    if isinstance(value, (bytes, bytearray, memoryview)):  # decoder = None: the member's .npy bytes
        return np.load(io.BytesIO(bytes(value)), allow_pickle=False)
    return np.asarray(value)


def pack_labels(input_ids: np.ndarray, loss_mask: np.ndarray | None, cu_seqlens: np.ndarray,
                last_labels: np.ndarray) -> np.ndarray:
    """int64 ``(n,)``: the labels of spec/READER.md §2 from a sample's members.

    Inside a segment the label of token ``t`` is token ``t + 1`` when its mask bit is 1 (every bit is 1
    without a loss mask), else -100; the last token of segment ``j`` takes ``last_labels[j]`` (the true
    next token at a cut, -100 at a document's end).
    """
    n = input_ids.shape[0]
    labels = np.full(n, IGNORE_INDEX, dtype=np.int64)
    labels[:-1] = input_ids[1:]
    if loss_mask is not None:
        labels[:-1][np.asarray(loss_mask[1:]) == 0] = IGNORE_INDEX
    ends = np.asarray(cu_seqlens[1:], dtype=np.int64) - 1
    labels[ends] = last_labels  # also replaces the next segment's first token, never a label
    return labels


def make_packed_seq_params(cu_seqlens, max_seqlen: int):
    """Megatron-Core's ``PackedSeqParams`` for the ``thd`` layout (megatron-core imported here only)."""
    from megatron.core.packed_seq_params import PackedSeqParams

    return PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu_seqlens, cu_seqlens_kv=cu_seqlens,
                           max_seqlen_q=max_seqlen, max_seqlen_kv=max_seqlen)


def sample_to_batch(sample: dict, *, packed_seq_params: bool = False) -> dict:
    """The training sample of one exported pack (a batch of one row, Megatron's ``thd`` layout).

    Returns torch tensors: ``input_ids``, ``labels`` (int64, -100 = no target), ``loss_mask`` (float32,
    1 where ``labels != -100``: Megatron's per-prediction mask, shifted like the labels, unlike the
    sample's ``loss_mask.npy`` which marks target tokens), ``position_ids`` (int64, restarting at 0 at
    every segment), all ``(1, n)``; ``cu_seqlens`` int32 ``(k + 1,)``, ``max_seqlen`` (a Python int),
    ``pack`` (int), ``document_ids`` int64 ``(k,)``, ``image_ids`` int64 ``(m,)`` (collection-wide),
    ``image_spans`` int64 ``(m, 2)`` (token spans in the row); with ``packed_seq_params=True`` also
    ``packed_seq_params`` (:func:`make_packed_seq_params`). Images stay in the sample under
    ``json["images"][j]["member"]``.
    """
    import torch

    meta = sample["json"]
    if isinstance(meta, (bytes, bytearray, memoryview)):
        meta = json.loads(bytes(meta))
    if "last_labels.npy" not in sample:
        raise ValueError("sample has no last_labels.npy member: it was exported by packfmt before WEBDATASET.md "
                         "revision 1.1 and cannot give the label at a cut; export it again with "
                         "`packfmt export webdataset DATASET OUT --index NAME --overwrite`")
    ids = _array(sample, "input_ids.npy").astype(np.int64)
    mask = _array(sample, "loss_mask.npy") if "loss_mask.npy" in sample else None
    cu = _array(sample, "cu_seqlens.npy").astype(np.int32)
    labels = pack_labels(ids, mask, cu, _array(sample, "last_labels.npy"))
    lens = np.diff(cu).astype(np.int64)
    positions = np.arange(ids.shape[0], dtype=np.int64) - np.repeat(cu[:-1].astype(np.int64), lens)
    images = meta.get("images", [])
    max_seqlen = int(lens.max()) if lens.size else 0
    batch = {"input_ids": torch.from_numpy(ids)[None], "labels": torch.from_numpy(labels)[None],
             "loss_mask": torch.from_numpy((labels != IGNORE_INDEX).astype(np.float32))[None],
             "position_ids": torch.from_numpy(positions)[None], "cu_seqlens": torch.from_numpy(cu),
             "max_seqlen": max_seqlen, "pack": int(meta["pack"]),
             "document_ids": torch.tensor([d["document"] for d in meta["documents"]], dtype=torch.int64),
             "image_ids": torch.tensor([m["image"] for m in images], dtype=torch.int64),
             "image_spans": torch.tensor([m["span"] for m in images], dtype=torch.int64).reshape(-1, 2)}
    if packed_seq_params:
        batch["packed_seq_params"] = make_packed_seq_params(batch["cu_seqlens"], max_seqlen)
    return batch
