"""``PackBatch``: the items of ``PackedDataset.__getitems__``, views of one ``_Arena``."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ._arena import _Arena
from ._kernels import PLAN_COLS, PLAN_LENGTHS, PLAN_PACKS, PLAN_SEQ_BOUNDS, PLAN_WIDTHS, fill_item_doc_ids


class PackBatch(Sequence):
    """The items of ``PackedDataset.__getitems__``: a sequence of item dicts over one shared layout.

    Items are built when first accessed (``batch[j]``, iteration), so a collate of this module,
    which reads the layout directly, never pays for per-item tensor views; each item is the dict
    ``ds[i]`` would return, its tensors views of the shared buffer, and the same object on every
    access.

    Attributes (``B`` packs, ``W`` columns, ``S_all`` segments of which ``S`` are non-empty):
        arena: the ``_Arena`` holding everything (slots of ``_plan.batch_layout``): input_ids, labels,
            position_ids of the packs laid end to end; doc_ids: the batch segment index (``0..S-1``,
            what ``collate_varlen`` returns) when ``padded`` is false, else the segment index within
            each pack (what ``collate_padded`` returns), -1 for padding; cu_seqlens,
            kept_document_ids, pack_ids, num_label_tokens; hf_labels (room for ``collate_hf``, only
            once the dataset has seen one in this process); seq_lens, document_ids, num_labels.
            Every slot is written by the kernel: the buffer holds nothing unused (in a worker its
            size is what crossing to the main process costs).
        widths, lengths, pack_ids: int64 ``(B,)``: columns of each pack, its real tokens, its index.
        seq_lens: int32 ``(S_all,)``; document_ids: int64 ``(S_all,)`` (numpy views of the arena). max_seqlen: the longest segment; num_segments: ``S``.
        fields: the dataset's per-token rows. padded: the dataset's ``pad_to_capacity``.
    The items of an unpadded batch get their ``doc_ids`` (segment index within the pack) as a
    small tensor of their own, computed on first access.
    The collates use the layout only while every item built so far still holds the very tensors
    built here (``intact()``), so replacing an item's tensor falls back to copying.
    """

    def __init__(self, ds: Any, ar: _Arena, plan: np.ndarray, max_seqlen: int, num_segments: int, *,
                 padded: bool) -> None:
        """``plan``: int64 ``(5, B + 1)``, what ``_plan.plan_batch`` laid out (rows ``_kernels.PLAN_*``)."""
        self.arena, self._plan, self._n = ar, plan, plan.shape[1] - 1
        self.max_seqlen, self.num_segments, self.fields = max_seqlen, num_segments, ds.fields
        self.padded = padded
        # made when the first item is (a collate of this module never asks for one): a batch is a few objects
        self._bounds: tuple[list, list] | None = None  # each pack's first segment and column, as lists
        self._items: list[dict[str, Any] | None] | None = None
        self._built: list[tuple | None] | None = None
        self._ds = ds  # the PackedDataset that made it (batch.py sits below dataset.py): for images (pickles small; a batch pickles as its one buffer, e.g. collate_fn=lambda b: b)

    @property
    def widths(self) -> np.ndarray:
        return self._plan[PLAN_WIDTHS, :self._n]

    @property
    def lengths(self) -> np.ndarray:
        return self._plan[PLAN_LENGTHS, :self._n]

    @property
    def pack_ids(self) -> np.ndarray:
        return self._plan[PLAN_PACKS, :self._n]

    @property
    def seq_lens(self) -> np.ndarray:
        return self.arena.array("seq_lens")

    @property
    def document_ids(self) -> np.ndarray:
        return self.arena.array("document_ids")

    def __len__(self) -> int:
        return self._n

    def __iter__(self):
        for j in range(self._n):
            yield self[j]

    def __getitem__(self, j):
        if isinstance(j, slice):
            return [self[k] for k in range(*j.indices(len(self)))]
        j = operator.index(j)
        if j < 0:
            j += self._n
        if not 0 <= j < self._n:
            raise IndexError(f"PackBatch index {j} out of range [0, {self._n})")
        if self._items is None:
            self._items, self._built = [None] * self._n, [None] * self._n
            self._bounds = (self._plan[PLAN_SEQ_BOUNDS].tolist(), self._plan[PLAN_COLS].tolist())
        item = self._items[j]
        if item is None:
            item = self._items[j] = self._make(j)
            self._built[j] = tuple(item[k] for k in _ITEM_TENSOR_KEYS if k in item)
        return item

    def _make(self, j: int) -> dict[str, Any]:
        (seq_bounds, cols), ar = self._bounds, self.arena
        c0, c1, s0, s1 = cols[j], cols[j + 1], seq_bounds[j], seq_bounds[j + 1]
        out = {"input_ids": ar.tensor("input_ids")[c0:c1], "labels": ar.tensor("labels")[c0:c1]}
        if "position_ids" in self.fields:
            out["position_ids"] = ar.tensor("position_ids")[c0:c1]
        if "doc_ids" in self.fields:
            if self.padded:
                out["doc_ids"] = ar.tensor("doc_ids")[c0:c1]
            else:
                dids = torch.empty(c1 - c0, dtype=ar.tensor("doc_ids").dtype)
                fill_item_doc_ids(self.seq_lens[s0:s1], dids.numpy())
                out["doc_ids"] = dids
        out.update(seq_lens=ar.tensor("seq_lens")[s0:s1], document_ids=ar.tensor("document_ids")[s0:s1],
                   num_label_tokens=ar.tensor("num_labels")[j], pack_id=ar.tensor("pack_ids")[j])
        ds = self._ds
        a = ds._views()
        if a["images"] is not None:
            p = int(self.pack_ids[j])
            lens = self.seq_lens[s0:s1].astype(np.int64)
            starts = np.zeros_like(lens)
            np.cumsum(lens[:-1], out=starts[1:])
            sg = a["segments"][a["pack_offsets"][p]:a["pack_offsets"][p + 1]]
            out.update(ds._images(sg[:, 0], sg[:, 1], sg[:, 2], starts))
        return out

    def intact(self) -> bool:
        """Whether every item built so far still holds exactly the tensors of the shared layout."""
        if self._items is None:
            return True
        for item, built in zip(self._items, self._built):
            if item is None:
                continue
            keys = [k for k in _ITEM_TENSOR_KEYS if k in item]
            if len(keys) != len(built) or any(item[k] is not t for k, t in zip(keys, built)):
                return False
        return True


_ITEM_TENSOR_KEYS = ("input_ids", "labels", "position_ids", "doc_ids", "seq_lens", "document_ids",
                     "num_label_tokens", "pack_id")
