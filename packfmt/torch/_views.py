"""The arrays ``PackedDataset`` reads (``arrays_of``): plain ndarray views of its store's and its index's memmaps (no
copy: numpy's memmap ``__getitem__`` is Python code) and what the kernels need to know of them, built once per
process (a DataLoader worker builds its own)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ._arena import item_layout
from ._kernels import ROW_DIDS, ROW_IDS, ROW_POS
from ._sources import _ImageIndex, _token_source

__all__ = ["INDEX_DTYPES", "arrays_of", "ids_np"]

#: Accepted ``index_dtype`` of ``PackedDataset`` and the numpy dtype of each.
INDEX_DTYPES = {torch.int64: np.int64, torch.int32: np.int32}
_INT32_LIMIT = 2**31  # int32 index mode: every token id and position must be < this


def arrays_of(ds) -> dict[str, Any]:
    """The arrays and settings a ``PackedDataset`` ``ds`` reads its items and batches from."""
    idx, store = ds.index, ds.store
    v = lambda a: None if a is None else np.asarray(a)  # noqa: E731
    src = _token_source(store)
    a = {
        "pack_offsets": v(idx.pack_offsets), "segments": v(idx.segments), "docs": src.docs,
        "tokens": src.tokens, "loss_mask": src.loss_mask,
        "pack_token_offsets": v(idx.pack_token_offsets), "packed_tokens": v(idx.packed_tokens),
        "packed_loss_mask": v(idx.packed_loss_mask), "num_packs": idx.num_packs,
        "images": _ImageIndex(store, src.members) if store.num_images else None,
        "members": src.members,  # None, or what maps the members a batch touches while it is read (ResidentMembers)
        "held": idx.held,  # an index read shard by shard: its rows held while read (else nothing to hold)
    }
    a["mask_or_dummy"] = a["loss_mask"] if a["loss_mask"] is not None else np.zeros(1, dtype=np.uint8)
    a["has_mask"] = a["loss_mask"] is not None
    a["pad_id"], a["capacity"] = ds.pad_token_id, ds.capacity
    I = INDEX_DTYPES[ds.index_dtype]
    a["index_np"], a["ids_np"] = I, ids_np(ds, store)
    a["rows"] = ROW_IDS | (ROW_POS if "position_ids" in ds.fields else 0) | (ROW_DIDS if "doc_ids" in ds.fields else 0)
    a["zero_copy"] = None
    if (ds.input_ids_dtype == "native" and a["packed_tokens"] is not None and a["packed_tokens"].size
            and not ds.pad_to_capacity):
        # copy-on-write private mapping: a writable zero-copy tensor that never writes the file
        zc = np.memmap(idx.path / "tokens.bin", dtype=store.np_token_dtype, mode="c")
        a["zero_copy"] = torch.from_numpy(zc.view(a["ids_np"]))
    rows = a["rows"] & ~ROW_IDS if a["zero_copy"] is not None else a["rows"]
    a["item_layout"] = item_layout(rows, I, a["ids_np"])  # which rows go in which dtype group (``ds[i]``)
    return a


def ids_np(ds, store):
    """numpy dtype of ``input_ids`` of ``ds`` over ``store``."""
    if ds.input_ids_dtype is None:
        return INDEX_DTYPES[ds.index_dtype]
    if ds.input_ids_dtype != "native":
        return INDEX_DTYPES[ds.input_ids_dtype]
    native = np.dtype(store.np_token_dtype).type
    if native == np.uint32 and store.vocab_size <= _INT32_LIMIT:
        return np.int32  # same bytes, every id < 2**31: the type nn.Embedding takes
    return native
