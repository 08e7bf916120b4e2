"""``PackedDataset``: a map-style torch Dataset over one pack index (spec/READER.md).

Each item is one pack, assembled with a handful of vectorised numpy operations; nothing is
cached per pack. The dataset pickles as (path, index name, options) only: the memmaps are
re-opened lazily in every DataLoader worker, so fork and spawn both stay small and safe.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch.utils.data import Dataset

from ..reader import PackIndex, Store, open_dataset

__all__ = ["PackedDataset", "IGNORE_INDEX", "PAD_DOC_ID"]

#: Label value of positions that are not trained on (PyTorch's cross_entropy default).
IGNORE_INDEX = -100
#: ``doc_ids`` value of padding positions.
PAD_DOC_ID = -1


class PackedDataset(Dataset):
    """One pack per item, with labels, per-segment positions and segment ids.

    Args:
        path_or_store: a dataset directory or an open ``Store``.
        index: pack index name (default: the only index of the dataset) or an open ``PackIndex``.
        pad_to_capacity: pad every pack to ``capacity`` tokens (padding: ``pad`` token or 0,
            label -100, ``doc_ids`` -1, positions 0..pad_len-1 so it forms its own isolated run).
        image_transform: optional callable applied to each decoded image, a uint8 tensor
            ``(H, W, C)``; its result is returned in ``images`` instead. Must be picklable for workers.

    Item (``ds[i]``), with ``n`` tokens in the pack (``capacity`` when padded) and ``k`` segments:
        input_ids: int64 ``(n,)``.
        labels: int64 ``(n,)``: the next token of the same document, -100 where there is none or
            it is not a training target (spec/READER.md §2).
        position_ids: int64 ``(n,)``: 0-based offset within the segment.
        doc_ids: int64 ``(n,)``: segment index within the pack, ``0..k-1``; -1 for padding.
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
    ) -> None:
        store = path_or_store if isinstance(path_or_store, Store) else open_dataset(path_or_store)
        idx = index if isinstance(index, PackIndex) else store.pack_index(index)
        self.path = str(Path(store.path))
        self.index_name = idx.name
        self.pad_to_capacity = bool(pad_to_capacity)
        self.image_transform = image_transform
        self._store: Store | None = store
        self._index: PackIndex | None = idx
        self._arrays: dict[str, Any] | None = None  # ndarray views of the memmaps, per process

    # ------------------------------------------------------------------ pickling / lazy opening
    def __getstate__(self) -> dict:
        return {"path": self.path, "index_name": self.index_name, "pad_to_capacity": self.pad_to_capacity,
                "image_transform": self.image_transform}

    def __setstate__(self, state: dict) -> None:
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
            }
        return self._arrays

    def __getitem__(self, i: int) -> dict[str, Any]:
        a = self._views()
        n_packs = a["num_packs"]
        if not -n_packs <= i < n_packs:
            raise IndexError(f"pack {i} out of range [0, {n_packs})")
        i = int(i) % n_packs
        po = a["pack_offsets"]
        segs = a["segments"][po[i]:po[i + 1]]  # (k, 3): doc, begin, end
        docs, begins, ends = segs[:, 0], segs[:, 1], segs[:, 2]
        lens = ends - begins
        starts = np.zeros_like(lens)
        np.cumsum(lens[:-1], out=starts[1:])
        gstart = a["doc_offsets"][docs] + begins  # global offset of each segment's first token
        toks, mask = self._pack_tokens(a, i, gstart, starts, lens)
        out = _assemble(a, toks, mask, docs, ends, gstart, starts, lens)
        if self.pad_to_capacity:
            out = _pad(out, self.capacity, self.pad_token_id)
        out["seq_lens"] = torch.from_numpy(lens.astype(np.int32))
        out["document_ids"] = torch.from_numpy(docs.copy())
        out["num_label_tokens"] = (out["labels"] != IGNORE_INDEX).sum()
        out["pack_id"] = torch.tensor(i, dtype=torch.int64)
        if self.store.images is not None:
            out.update(self._images(docs, begins, ends, starts))
        return out

    @staticmethod
    def _pack_tokens(a: dict, i: int, gstart: np.ndarray, starts: np.ndarray, lens: np.ndarray):
        """Tokens and loss mask of pack ``i``: views when materialized, else one gather."""
        if a["pack_token_offsets"] is not None:
            o = a["pack_token_offsets"]
            lo, hi = o[i], o[i + 1]
            mask = a["packed_loss_mask"][lo:hi] if a["packed_loss_mask"] is not None else None
            return a["packed_tokens"][lo:hi], mask
        n = int(lens.sum())
        gidx = np.repeat(gstart - starts, lens) + np.arange(n, dtype=np.int64)
        mask = a["loss_mask"][gidx] if a["loss_mask"] is not None else None
        return a["tokens"][gidx], mask

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


def _assemble(a: dict, toks, mask, docs, ends, gstart, starts, lens) -> dict[str, torch.Tensor]:
    """input_ids, labels, position_ids, doc_ids of one unpadded pack (all int64, shape ``(n,)``)."""
    n = toks.shape[0]
    k = lens.shape[0]
    input_ids = toks.astype(np.int64)
    nxt = np.empty(n, dtype=np.int64)
    nxt[:-1] = input_ids[1:]
    nxt_mask = np.ones(n, dtype=bool)
    if mask is not None:
        nxt_mask[:-1] = np.asarray(mask[1:]).astype(bool)
    # The last token of each segment: the document's true next token (at a cut) or nothing.
    last = starts + lens - 1
    doc_offsets, tokens = a["doc_offsets"], a["tokens"]
    cut = ends < doc_offsets[docs + 1] - doc_offsets[docs]
    after = np.minimum(gstart + lens, tokens.shape[0] - 1)  # global index of the token after the segment
    nxt[last] = np.where(cut, tokens[after], IGNORE_INDEX)
    if a["loss_mask"] is not None:
        nxt_mask[last] = cut & a["loss_mask"][after].astype(bool)
    else:
        nxt_mask[last] = cut
    labels = np.where(nxt_mask, nxt, IGNORE_INDEX)
    seg_of_tok = np.repeat(np.arange(k, dtype=np.int64), lens)
    positions = np.arange(n, dtype=np.int64) - np.repeat(starts, lens)
    return {
        "input_ids": torch.from_numpy(input_ids),
        "labels": torch.from_numpy(labels),
        "position_ids": torch.from_numpy(positions),
        "doc_ids": torch.from_numpy(seg_of_tok),
    }


def _pad(out: dict[str, torch.Tensor], capacity: int, pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad every per-token tensor to ``capacity``."""
    n = out["input_ids"].shape[0]
    extra = capacity - n
    if extra <= 0:
        return out
    fill = {"input_ids": pad_id, "labels": IGNORE_INDEX, "doc_ids": PAD_DOC_ID}
    padded = {}
    for key, t in out.items():
        tail = torch.arange(extra, dtype=t.dtype) if key == "position_ids" else torch.full((extra,), fill[key], dtype=t.dtype)
        padded[key] = torch.cat([t, tail])
    return padded


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
