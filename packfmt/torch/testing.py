"""Helpers for tests and benchmarks of the torch reader: write datasets and pack indexes directly.

``write_pack_index`` stores any segment layout you give it (independent of the packing
engine), so tests can exercise split documents, shuffled segment orders and odd packs.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from .. import format as F
from .._io import HashedFile, publish_dir, temp_sibling
from ..reader import PackIndex, Store, open_dataset
from ..version import __version__

__all__ = ["next_fit_segments", "write_pack_index", "write_flat_dataset"]


def next_fit_segments(lengths: np.ndarray, capacity: int, *, order: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Next-fit packing that splits long documents (and fills packs by splitting at the boundary).

    Documents are laid end to end (in ``order``) and cut every ``capacity`` tokens, so any
    document crossing a pack boundary becomes two or more segments.

    Returns:
        segments int64 ``(S, 3)`` ``(doc, begin, end)`` and pack_offsets int64 ``(P + 1,)``.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    order = np.arange(lengths.shape[0]) if order is None else np.asarray(order, dtype=np.int64)
    lens = lengths[order]
    doc_start = np.concatenate([[0], np.cumsum(lens)])
    total = int(doc_start[-1])
    cuts = np.union1d(doc_start, np.arange(0, total + 1, capacity))
    seg_lo, seg_hi = cuts[:-1], cuts[1:]
    which = np.searchsorted(doc_start, seg_lo, side="right") - 1
    segments = np.stack([order[which], seg_lo - doc_start[which], seg_hi - doc_start[which]], axis=1)
    pack_of_seg = seg_lo // capacity
    pack_offsets = np.searchsorted(pack_of_seg, np.arange(pack_of_seg[-1] + 2 if total else 1), side="left")
    return segments.astype(np.int64), pack_offsets.astype(np.int64)


def write_pack_index(store: Store | str | os.PathLike, segments: np.ndarray, pack_offsets: np.ndarray, *, capacity: int,
                     name: str = "test", materialize: bool = False, algorithm: str = "greedy",
                     oversize: str = "split") -> PackIndex:
    """Store a hand-made pack index under ``packs/<name>`` (same files as ``build_pack_index``)."""
    from ..packindex import _materialize

    store = store if isinstance(store, Store) else open_dataset(store)
    segments = np.ascontiguousarray(segments, dtype=F.OFFSET_DTYPE).reshape(-1, 3)
    pack_offsets = np.ascontiguousarray(pack_offsets, dtype=F.OFFSET_DTYPE)
    target = store.path / F.PACKS_DIR / name
    target.parent.mkdir(exist_ok=True)
    tmp = temp_sibling(target)
    files = {}
    for fname, arr in ((F.PACK_OFFSETS, pack_offsets), (F.SEGMENTS, segments)):
        f = HashedFile(tmp / fname)
        f.write_array(arr, F.OFFSET_DTYPE)
        files[fname] = f.close()
    if materialize:
        files.update(_materialize(store, tmp, segments, pack_offsets))
    packed = int((segments[:, 2] - segments[:, 1]).sum())
    index = {
        "format": F.PACK_INDEX_FORMAT_NAME, "format_version": F.FORMAT_VERSION_STR,
        "producer": {"name": "packfmt", "version": __version__}, "name": name, "capacity": int(capacity),
        "algorithm": algorithm, "seed": None, "oversize": oversize, "params": {}, "stats": {},
        "counts": {"packs": int(pack_offsets.shape[0] - 1), "segments": int(segments.shape[0]), "packed_tokens": packed},
        "materialized": bool(materialize),
        "dataset": {F.TOKENS: store.manifest.files[F.TOKENS].checksum, F.DOC_OFFSETS: store.manifest.files[F.DOC_OFFSETS].checksum},
        "files": files,
    }
    (tmp / F.PACK_INDEX_JSON).write_bytes(F.canonical_json(index))
    publish_dir(tmp, target, overwrite=True)
    return PackIndex(store, name)


def write_flat_dataset(path: str | os.PathLike, tokens: np.ndarray, doc_offsets: np.ndarray, *, vocab_size: int,
                       loss_mask: np.ndarray | None = None) -> Store:
    """Write a text-only dataset from whole arrays at once (fast path for millions of documents)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_sibling(path)
    dtype_name = F.token_dtype_for_vocab(vocab_size)
    arrays = [(F.TOKENS, tokens, F.TOKEN_DTYPES[dtype_name]), (F.DOC_OFFSETS, doc_offsets, F.OFFSET_DTYPE)]
    if loss_mask is not None:
        arrays.append((F.LOSS_MASK, loss_mask, F.MASK_DTYPE))
    files = {}
    for fname, arr, dtype in arrays:
        f = HashedFile(tmp / fname)
        f.write_array(arr, dtype)
        files[fname] = f.close()
    manifest = {
        "format": F.FORMAT_NAME, "format_version": F.FORMAT_VERSION_STR,
        "producer": {"name": "packfmt", "version": __version__}, "tokenizer": {"name": "synthetic", "hash": None},
        "vocab_size": int(vocab_size), "token_dtype": dtype_name, "special_tokens": {k: None for k in F.SPECIAL_TOKEN_KEYS},
        "counts": {"documents": int(len(doc_offsets) - 1), "tokens": int(len(tokens)), "images": 0},
        "loss_mask": loss_mask is not None, "checksum_algorithm": F.CHECKSUM_ALGORITHM, "files": files,
    }
    (tmp / F.MANIFEST).write_bytes(F.canonical_json(manifest))
    publish_dir(tmp, path, overwrite=False)
    return open_dataset(path)
