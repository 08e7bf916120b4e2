"""``PackedDataset``: a map-style torch Dataset over one pack index (spec/READER.md).

Each item is one pack, written in one pass by a numba kernel (``_kernels.fill_pack``); a batch
(``__getitems__``) is written by one kernel call (``_kernels.fill_packs``). Every item and every
batch lives in ONE byte buffer (an ``_Arena``) whose typed slots are returned as tensor views, so
a DataLoader worker sends it to the main process as one shared-memory segment (allocated in
shared memory directly inside workers, as ``default_collate`` does); nothing is cached per pack. The dataset pickles as (path, index name, options) only: the memmaps are
re-opened lazily in every DataLoader worker, so fork and spawn both stay small and safe.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch.utils.data import Dataset

from ..reader import PackIndex, Store, open_dataset
from ._kernels import fill_pack, fill_packs, pack_length, pack_lengths

__all__ = ["PackedDataset", "PackBatch", "IGNORE_INDEX", "PAD_DOC_ID", "INDEX_DTYPES"]

#: Label value of positions that are not trained on (PyTorch's cross_entropy default).
IGNORE_INDEX = -100
#: ``doc_ids`` value of padding positions.
PAD_DOC_ID = -1
#: Accepted ``index_dtype`` of ``PackedDataset`` and the numpy dtype of each.
INDEX_DTYPES = {torch.int64: np.int64, torch.int32: np.int32}
_INT32_LIMIT = 2**31  # int32 index mode: every token id and position must be < this
_ALIGN = 64  # byte alignment of every slot of an arena (a cache line; any dtype's alignment)


def _alloc(nbytes: int) -> torch.Tensor:
    """A uint8 tensor of ``nbytes``: in shared memory inside a DataLoader worker, else ordinary memory."""
    if torch.utils.data.get_worker_info() is not None:
        return torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage._new_shared(nbytes), 0, (nbytes,))
    return torch.empty(nbytes, dtype=torch.uint8)


class _Arena:
    """One byte buffer holding named typed arrays, each at a 64-byte aligned offset.

    ``array(name)`` is the numpy view (for the kernels), ``tensor(name)`` a torch view of the
    same bytes; every tensor view shares the single storage ``base``, which is what makes a batch
    cross the worker -> main process boundary as one shared-memory segment (torch's pickler
    memoizes the storage, see tests/test_torch_dataset.py::test_batch_is_one_storage).

    Args:
        slots: ``(name, numpy dtype, shape)`` in layout order.
    """

    __slots__ = ("base", "_np", "_slots", "_typed", "_typed_np")

    def __init__(self, slots) -> None:
        self._slots: dict[str, tuple[int, np.dtype, tuple[int, ...], int]] = {}
        pos = 0
        for name, dt, shape in slots:
            dt = _NP_DTYPES[dt]
            pos = -(-pos // _ALIGN) * _ALIGN
            n = math.prod(shape)
            self._slots[name] = (pos // dt.itemsize, dt, shape, n)  # offset in elements of dt
            pos += n * dt.itemsize
        self.base = _alloc(-(-max(pos, 1) // _ALIGN) * _ALIGN)
        self._np = self.base.numpy()
        self._typed: dict[Any, torch.Tensor] = {}
        self._typed_np: dict[Any, np.ndarray] = {}

    def array(self, name: str) -> np.ndarray:
        off, dt, shape, n = self._slots[name]
        typed = self._typed_np.get(dt)
        if typed is None:
            typed = self._typed_np[dt] = self._np.view(dt)
        return typed[off:off + n] if len(shape) == 1 else typed[off:off + n].reshape(shape)  # 0-d: a view too

    def tensor(self, name: str) -> torch.Tensor:
        off, dt, shape, n = self._slots[name]
        typed = self._typed.get(dt)
        if typed is None:
            typed = self._typed[dt] = self.base.view(_TORCH_OF[dt.type])
        if len(shape) == 1:
            return typed[off:off + n]
        if not shape:
            return typed[off]
        return typed.as_strided(shape, _contiguous_strides(shape), off)


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(strides))


_NP_DTYPES = {t: np.dtype(t) for t in (np.int64, np.int32, np.uint8)}
_TORCH_OF = {np.int64: torch.int64, np.int32: torch.int32, np.uint8: torch.uint8}


class PackedDataset(Dataset):
    """One pack per item, with labels, per-segment positions and segment ids.

    Args:
        path_or_store: a dataset directory or an open ``Store``.
        index: pack index name (default: the only index of the dataset) or an open ``PackIndex``.
        pad_to_capacity: pad every pack to ``capacity`` tokens (padding: ``pad`` token or 0,
            label -100, ``doc_ids`` -1, positions 0..pad_len-1 so it forms its own isolated run).
        image_transform: optional callable applied to each decoded image, a uint8 tensor
            ``(H, W, C)``; its result is returned in ``images`` instead. Must be picklable for workers.
        index_dtype: ``torch.int64`` (default) or ``torch.int32``: dtype of ``input_ids``,
            ``position_ids`` and ``doc_ids`` (and of the same keys in every collate). int32 halves
            their bytes; ``labels`` stay int64 (``cross_entropy`` needs Long targets). int32
            requires ``vocab_size <= 2**31`` and ``capacity < 2**31``.

    Item (``ds[i]``), with ``n`` tokens in the pack (``capacity`` when padded) and ``k`` segments;
    all its tensors are views of one buffer:
        input_ids: ``index_dtype`` ``(n,)``.
        labels: int64 ``(n,)``: the next token of the same document, -100 where there is none or
            it is not a training target (spec/READER.md §2).
        position_ids: ``index_dtype`` ``(n,)``: 0-based offset within the segment.
        doc_ids: ``index_dtype`` ``(n,)``: segment index within the pack, ``0..k-1``; -1 for padding.
        seq_lens: int32 ``(k,)``: token count of each segment (padding excluded).
        document_ids: int64 ``(k,)``: global document id of each segment.
        num_label_tokens: int64 scalar: count of ``labels != -100``.
        pack_id: int64 scalar: ``i``.
        images / image_spans / image_ids (multimodal stores only): list of decoded images,
            int64 ``(m, 2)`` half-open token spans ``[begin, end)`` inside the pack, int64 ``(m,)``.
    """

    def __init__(
        self,
        path_or_store: str | os.PathLike | Store,
        index: str | PackIndex | None = None,
        *,
        pad_to_capacity: bool = False,
        image_transform: Callable[[torch.Tensor], Any] | None = None,
        index_dtype: torch.dtype = torch.int64,
    ) -> None:
        if index_dtype not in INDEX_DTYPES:
            raise ValueError(f"index_dtype: expected torch.int64 or torch.int32, found {index_dtype!r}")
        store = path_or_store if isinstance(path_or_store, Store) else open_dataset(path_or_store)
        idx = index if isinstance(index, PackIndex) else store.pack_index(index)
        self.path = str(Path(store.path))
        self.index_name = idx.name
        self.pad_to_capacity = bool(pad_to_capacity)
        self.image_transform = image_transform
        self.index_dtype = index_dtype
        if index_dtype == torch.int32 and (store.vocab_size > _INT32_LIMIT or idx.capacity >= _INT32_LIMIT):
            raise ValueError(f"index_dtype=torch.int32: expected vocab_size <= 2**31 and capacity < 2**31, "
                             f"found vocab_size {store.vocab_size}, capacity {idx.capacity} ({store.path})")
        self._store: Store | None = store
        self._index: PackIndex | None = idx
        self._arrays: dict[str, Any] | None = None  # ndarray views of the memmaps, per process

    # ------------------------------------------------------------------ pickling / lazy opening
    def __getstate__(self) -> dict:
        return {"path": self.path, "index_name": self.index_name, "pad_to_capacity": self.pad_to_capacity,
                "image_transform": self.image_transform, "index_dtype": self.index_dtype}

    def __setstate__(self, state: dict) -> None:
        state.setdefault("index_dtype", torch.int64)
        self.__dict__.update(state)
        self._store = None
        self._index = None
        self._arrays = None

    @property
    def store(self) -> Store:
        if self._store is None:
            self._store = open_dataset(self.path)
        return self._store

    @property
    def index(self) -> PackIndex:
        if self._index is None:
            self._index = PackIndex(self.store, self.index_name)
        return self._index

    # ------------------------------------------------------------------ metadata
    def __len__(self) -> int:
        return self.index.num_packs

    @property
    def capacity(self) -> int:
        return self.index.capacity

    @property
    def pad_token_id(self) -> int:
        pad = self.store.special_tokens.get("pad")
        return 0 if pad is None else int(pad)

    @property
    def fingerprint(self) -> str:
        """Identity of the packing: index name, its segment/offset checksums and the token store's."""
        files = self.index.manifest.files
        ds = self.index.manifest.dataset
        return "|".join([self.index_name, files["pack_offsets.bin"].checksum, files["segments.bin"].checksum,
                         ds["tokens.bin"], ds["doc_offsets.bin"]])

    def pack_num_tokens(self) -> np.ndarray:
        """int64 ``(num_packs,)``: real (unpadded) tokens of every pack."""
        idx = self.index
        if idx.pack_token_offsets is not None:
            return np.diff(np.asarray(idx.pack_token_offsets))
        return _segment_sums(np.asarray(idx.segments[:, 2] - idx.segments[:, 1]), np.asarray(idx.pack_offsets))

    def pack_num_images(self) -> np.ndarray:
        """int64 ``(num_packs,)``: images whose tokens lie in every pack (zeros for text-only stores)."""
        idx, images = self.index, self.store.images
        if images is None:
            return np.zeros(len(self), dtype=np.int64)
        segs = np.asarray(idx.segments)
        rel = _relative_spans(self.store)
        dio = np.asarray(images.doc_image_offsets)
        counts = np.zeros(segs.shape[0], dtype=np.int64)
        for s, (d, b, e) in enumerate(segs):  # one pass at sampler construction, not on the read path
            lo, hi = dio[d], dio[d + 1]
            if hi > lo:
                r = rel[lo:hi]
                counts[s] = int(((r[:, 0] >= b) & (r[:, 1] <= e)).sum())
        return _segment_sums(counts, np.asarray(idx.pack_offsets))

    # ------------------------------------------------------------------ items
    def _views(self) -> dict[str, Any]:
        """Plain ndarray views of the memmaps (no copy): numpy's memmap ``__getitem__`` is Python code."""
        if self._arrays is None:
            idx, store = self.index, self.store
            v = lambda a: None if a is None else np.asarray(a)  # noqa: E731
            self._arrays = {
                "pack_offsets": v(idx.pack_offsets), "segments": v(idx.segments), "doc_offsets": v(store.doc_offsets),
                "tokens": v(store.tokens), "loss_mask": v(store.loss_mask),
                "pack_token_offsets": v(idx.pack_token_offsets), "packed_tokens": v(idx.packed_tokens),
                "packed_loss_mask": v(idx.packed_loss_mask), "num_packs": idx.num_packs,
                "has_images": store.images is not None,
            }
            a = self._arrays
            a["mask_or_dummy"] = a["loss_mask"] if a["loss_mask"] is not None else np.zeros(1, dtype=np.uint8)
            a["pad_id"], a["capacity"] = self.pad_token_id, self.capacity
        return self._arrays

    def __getitem__(self, i: int) -> dict[str, Any]:
        a = self._views()
        n_packs = a["num_packs"]
        if not -n_packs <= i < n_packs:
            raise IndexError(f"pack {i} out of range [0, {n_packs})")
        i = int(i) % n_packs
        po = a["pack_offsets"]
        lo, hi = int(po[i]), int(po[i + 1])
        if a["pack_token_offsets"] is not None:  # materialized: the pack's tokens are one contiguous run
            src, src_mask, src_start = a["packed_tokens"], a["packed_loss_mask"], int(a["pack_token_offsets"][i])
            n = int(a["pack_token_offsets"][i + 1]) - src_start
        else:
            src, src_mask, src_start = a["tokens"], a["loss_mask"], -1
            n = pack_length(a["segments"], lo, hi)
        width = max(n, a["capacity"]) if self.pad_to_capacity else n
        I, k = INDEX_DTYPES[self.index_dtype], hi - lo
        ar = _Arena([("labels", np.int64, (width,)), ("rows", I, (3, width)), ("seq_lens", np.int32, (k,)),
                     ("document_ids", np.int64, (k,)), ("scalars", np.int64, (2,))])  # scalars: labels, pack
        seq_lens, rows, scalars = ar.array("seq_lens"), ar.array("rows"), ar.array("scalars")
        scalars[0] = fill_pack(a["tokens"], a["mask_or_dummy"], a["loss_mask"] is not None, a["doc_offsets"],
                               a["segments"], lo, hi, src, a["mask_or_dummy"] if src_mask is None else src_mask,
                               src_start, rows[0], ar.array("labels"), rows[1], rows[2], seq_lens,
                               ar.array("document_ids"), a["pad_id"])
        scalars[1] = i
        input_ids, position_ids, doc_ids = ar.tensor("rows").unbind(0)
        num_label_tokens, pack_id = ar.tensor("scalars").unbind(0)
        out = {"input_ids": input_ids, "labels": ar.tensor("labels"), "position_ids": position_ids, "doc_ids": doc_ids,
               "seq_lens": ar.tensor("seq_lens"), "document_ids": ar.tensor("document_ids"),
               "num_label_tokens": num_label_tokens, "pack_id": pack_id}
        if a["has_images"]:
            segs = a["segments"][lo:hi]
            lens = seq_lens.astype(np.int64)
            starts = np.zeros_like(lens)
            np.cumsum(lens[:-1], out=starts[1:])
            out.update(self._images(segs[:, 0], segs[:, 1], segs[:, 2], starts))
        return out

    def __getitems__(self, indices) -> "PackBatch":
        """Packs ``indices`` at once (what ``DataLoader`` calls for a batch): one kernel call.

        Returns a ``PackBatch``: a list of the same items ``ds[i]`` returns, whose per-token
        tensors are views of one buffer in which the packs lie end to end, so the collates of
        this module assemble the batch without copying the tokens again.
        """
        a = self._views()
        n_packs = a["num_packs"]
        packs = np.asarray(indices, dtype=np.int64).reshape(-1)
        if packs.size and (packs.min() < -n_packs or packs.max() >= n_packs):
            bad = packs[(packs < -n_packs) | (packs >= n_packs)][0]
            raise IndexError(f"pack {int(bad)} out of range [0, {n_packs})")
        packs = packs % max(n_packs, 1)
        po, segments = a["pack_offsets"], a["segments"]
        materialized = a["pack_token_offsets"] is not None
        if materialized:
            pto = a["pack_token_offsets"]
            lengths = pto[packs + 1] - pto[packs]
            src, src_mask = a["packed_tokens"], a["packed_loss_mask"]
        else:
            pto, src, src_mask = a["pack_offsets"], a["tokens"], a["loss_mask"]  # pto unused
            lengths = pack_lengths(segments, po, packs)
        widths = np.maximum(lengths, a["capacity"]) if self.pad_to_capacity else lengths
        nseg = po[packs + 1] - po[packs]
        seq_bounds = np.zeros(packs.shape[0] + 1, dtype=np.int64)
        np.cumsum(nseg, out=seq_bounds[1:])
        ar = _Arena(_batch_slots(int(widths.sum()), int(seq_bounds[-1]), packs.shape[0],
                                 INDEX_DTYPES[self.index_dtype]))
        mask, arr = a["mask_or_dummy"], ar.array
        num_labels = arr("num_labels")
        longest, kept = fill_packs(a["tokens"], mask, a["loss_mask"] is not None, a["doc_offsets"], segments, po, packs,
                                   src, mask if src_mask is None else src_mask, pto, materialized, widths,
                                   arr("input_ids"), arr("labels"), arr("position_ids"), arr("doc_ids"),
                                   arr("item_doc_ids"), arr("seq_lens"), arr("document_ids"), seq_bounds, num_labels,
                                   arr("cu_seqlens"), arr("kept_document_ids"), a["pad_id"])
        arr("pack_ids")[:] = packs
        arr("num_label_tokens")[()] = num_labels.sum()
        return PackBatch._build(self, ar, packs, lengths, widths, nseg, int(longest), int(kept))

    def _images(self, docs, begins, ends, starts) -> dict[str, Any]:
        """Decoded images of the pack and their token spans inside the pack."""
        store = self.store
        images = store.images
        dio = images.doc_image_offsets
        ids, spans = [], []
        for d, b, e, s in zip(docs, begins, ends, starts):
            lo, hi = int(dio[d]), int(dio[d + 1])
            if hi == lo:
                continue
            rel = np.asarray(images.token_spans[lo:hi]) - store.doc_offsets[d]
            keep = (rel[:, 0] >= b) & (rel[:, 1] <= e)
            ids.append(np.arange(lo, hi, dtype=np.int64)[keep])
            spans.append(rel[keep] - b + s)
        image_ids = np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64)
        image_spans = np.concatenate(spans) if spans else np.zeros((0, 2), dtype=np.int64)
        decoded = []
        for j in image_ids:
            arr = images.decode(int(j))
            img = torch.from_numpy(arr if arr.flags.writeable and arr.flags.c_contiguous else np.array(arr))
            decoded.append(self.image_transform(img) if self.image_transform is not None else img)
        return {"images": decoded, "image_spans": torch.from_numpy(image_spans.astype(np.int64)),
                "image_ids": torch.from_numpy(image_ids)}


class PackBatch(list):
    """The items of ``PackedDataset.__getitems__``: a plain list of item dicts, plus their shared layout.

    Attributes (``B`` packs, ``W`` columns, ``S_all`` segments of which ``S`` are non-empty):
        arena: the ``_Arena`` holding everything (slots of ``_batch_slots``): input_ids, labels,
            position_ids of the packs laid end to end; doc_ids, the batch segment index (``0..S-1``;
            -1 for padding); cu_seqlens, kept_document_ids, pack_ids, num_label_tokens (the
            ``collate_varlen`` values); hf_labels (room for ``collate_hf``); item_doc_ids (segment
            index within each pack), seq_lens, document_ids, num_labels (the items' values).
        widths, lengths: int64 ``(B,)``: columns of each pack / its real tokens.
        seq_lens: int32 ``(S_all,)``; document_ids: int64 ``(S_all,)``; pack_ids: int64 ``(B,)``
            (numpy views of the arena). max_seqlen: the longest segment; num_segments: ``S``.
    The collates use the layout only while every item still holds the very tensors built here
    (``is`` checks), so replacing an item or one of its tensors falls back to copying.
    """

    _KEYS = ("input_ids", "labels", "position_ids", "doc_ids", "seq_lens", "document_ids", "num_label_tokens",
             "pack_id")

    @classmethod
    def _build(cls, ds: PackedDataset, ar: _Arena, packs, lengths, widths, nseg, max_seqlen: int,
               num_segments: int) -> "PackBatch":
        t = ar.tensor
        wl, sl = widths.tolist(), nseg.tolist()
        cols = (t("input_ids").split(wl), t("labels").split(wl), t("position_ids").split(wl),
                t("item_doc_ids").split(wl), t("seq_lens").split(sl), t("document_ids").split(sl),
                t("num_labels").unbind(0), t("pack_ids").unbind(0))
        batch = cls(dict(zip(cls._KEYS, values)) for values in zip(*cols))
        batch.arena, batch.widths, batch.lengths = ar, widths, lengths
        batch.seq_lens, batch.document_ids, batch.pack_ids = ar.array("seq_lens"), ar.array("document_ids"), packs
        batch.max_seqlen, batch.num_segments = max_seqlen, num_segments
        batch._tensors = list(zip(*cols))
        a = ds._views()
        if a["has_images"]:
            for item, p, ls in zip(batch, packs.tolist(), cols[4]):
                lens = ls.numpy().astype(np.int64)
                starts = np.zeros_like(lens)
                np.cumsum(lens[:-1], out=starts[1:])
                sg = a["segments"][a["pack_offsets"][p]:a["pack_offsets"][p + 1]]
                item.update(ds._images(sg[:, 0], sg[:, 1], sg[:, 2], starts))
        return batch

    def intact(self) -> bool:
        """Whether every item still holds exactly the tensors of the shared layout."""
        if not hasattr(self, "_tensors") or len(self) != len(self._tensors):
            return False
        keys = self._KEYS
        for item, tensors in zip(self, self._tensors):
            for k, t in zip(keys, tensors):
                if item.get(k) is not t:
                    return False
        return True


def _batch_slots(W: int, S: int, B: int, index_np) -> list[tuple[str, Any, tuple[int, ...]]]:
    """Arena layout of a ``PackedDataset.__getitems__`` batch: ``W`` columns, ``S`` segments, ``B`` packs.

    What ``collate_varlen`` returns comes first (so a span of the buffer holds exactly it), then
    ``collate_hf``'s extra labels, then what only the items use.
    """
    return [("labels", np.int64, (W,)), ("input_ids", index_np, (W,)), ("position_ids", index_np, (W,)),
            ("doc_ids", index_np, (W,)), ("cu_seqlens", np.int32, (S + 1,)), ("kept_document_ids", np.int64, (S,)),
            ("pack_ids", np.int64, (B,)), ("num_label_tokens", np.int64, ()), ("hf_labels", np.int64, (W,)),
            ("item_doc_ids", index_np, (W,)), ("seq_lens", np.int32, (S,)), ("document_ids", np.int64, (S,)),
            ("num_labels", np.int64, (B,))]


def _segment_sums(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Sum of ``values[offsets[p]:offsets[p+1]]`` for every p (empty ranges give 0)."""
    csum = np.zeros(values.shape[0] + 1, dtype=np.int64)
    np.cumsum(values, out=csum[1:])
    return csum[offsets[1:]] - csum[offsets[:-1]]


def _relative_spans(store: Store) -> np.ndarray:
    """Image token spans relative to their document start, int64 ``(num_images, 2)``."""
    images = store.images
    dio = np.asarray(images.doc_image_offsets)
    doc_of_image = np.repeat(np.arange(store.num_documents, dtype=np.int64), np.diff(dio))
    return np.asarray(images.token_spans, dtype=np.int64) - np.asarray(store.doc_offsets)[doc_of_image][:, None]
