"""Helpers for tests and benchmarks of the torch reader: write datasets and pack indexes directly.

``write_pack_index`` stores any segment layout you give it (independent of the packing
engine), so tests can exercise split documents, shuffled segment orders and odd packs.
"""

from __future__ import annotations

import os

import numpy as np

from .. import format as F
from .._io import HashedFile, publish_dir, temp_sibling
from ..errors import WriteError
from ..index import PackIndex
from ..opening import open_dataset
from ..reader import Store
from ..version import __version__
from ..writer import DatasetWriter

__all__ = ["next_fit_segments", "next_fit_members", "write_pack_index", "write_flat_dataset", "write_split_stores",
           "write_random_collection"]


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


def next_fit_members(lengths: np.ndarray, doc_start: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """``next_fit_segments`` of each member's documents in turn (member ``m``: documents
    ``doc_start[m]:doc_start[m + 1]``): packs in document order that never hold two members' documents,
    as pack-ordered shards lay them out. Same return as ``next_fit_segments``."""
    lengths, doc_start = np.asarray(lengths, dtype=np.int64), np.asarray(doc_start, dtype=np.int64)
    segs, offsets = [np.zeros((0, 3), dtype=np.int64)], [np.zeros(1, dtype=np.int64)]
    for lo, hi in zip(doc_start[:-1].tolist(), doc_start[1:].tolist()):
        if hi > lo:
            s, po = next_fit_segments(lengths[lo:hi], capacity)
            segs.append(s + np.array([lo, 0, 0]))
            offsets.append(po[1:] + offsets[-1][-1])
    return np.concatenate(segs), np.concatenate(offsets)


def write_pack_index(store: Store | str | os.PathLike, segments: np.ndarray, pack_offsets: np.ndarray, *, capacity: int,
                     name: str = "test", materialize: bool = False, algorithm: str = "greedy",
                     oversize: str = "split") -> PackIndex:
    """Store a hand-made pack index under ``packs/<name>`` (same files as ``build_pack_index``)."""
    from ..index_writer import write_packed_tokens
    from ..packing import Segmentation

    store = open_dataset(store) if isinstance(store, (str, os.PathLike)) else store  # a Store or a Collection
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
    if materialize:  # the rows as they are, in file order; the tokens of each pack summed as a reader would
        cum = np.concatenate([[0], np.cumsum(segments[:, 2] - segments[:, 1])])
        files.update(write_packed_tokens(store, tmp, Segmentation(segments, None), np.arange(segments.shape[0]),
                                  np.diff(cum[pack_offsets])))
    packed = int((segments[:, 2] - segments[:, 1]).sum())
    binding = store.index_binding()
    index = {
        "format": F.PACK_INDEX_FORMAT_NAME, "format_version": "1.1" if "collection" in binding else F.FORMAT_VERSION_STR,
        "producer": {"name": "packfmt", "version": __version__}, "name": name, "capacity": int(capacity),
        "algorithm": algorithm, "seed": None, "oversize": oversize, "params": {}, "stats": {},
        "counts": {"packs": int(pack_offsets.shape[0] - 1), "segments": int(segments.shape[0]), "packed_tokens": packed},
        "materialized": bool(materialize),
        **binding,
        "files": files,
    }
    (tmp / F.PACK_INDEX_JSON).write_bytes(F.canonical_json(index))
    publish_dir(tmp, target, overwrite=True)
    return PackIndex(store, name)


def write_flat_dataset(path: str | os.PathLike, tokens: np.ndarray, doc_offsets: np.ndarray, *, vocab_size: int,
                       loss_mask: np.ndarray | None = None) -> Store:
    """Write a text-only dataset from whole arrays at once (fast path for millions of documents).

    Goes through the public ``DatasetWriter.add_documents`` (vectorised range and length checks,
    atomic publish), with tokenizer ``{"name": "synthetic", "hash": None}``.

    Args:
        tokens: 1-D integer array, every document's tokens concatenated.
        doc_offsets: int ``(D + 1,)``, starting at 0 and ending at ``len(tokens)``; document d is
            ``tokens[doc_offsets[d]:doc_offsets[d + 1]]`` (non-empty).
        loss_mask: optional 0/1 array of ``len(tokens)``.
    """
    doc_offsets = np.asarray(doc_offsets, dtype=np.int64)
    if doc_offsets.ndim != 1 or doc_offsets.size == 0 or doc_offsets[0] != 0:
        raise WriteError(field="doc_offsets", expected="1-D, starting at 0", found=f"shape {doc_offsets.shape}, "
                         f"first {doc_offsets[:1].tolist()}")
    with DatasetWriter(path, vocab_size=vocab_size, tokenizer={"name": "synthetic", "hash": None},
                       loss_mask=loss_mask is not None) as writer:
        writer.add_documents(tokens, np.diff(doc_offsets), loss_mask)
    return open_dataset(path)


def write_split_stores(root: str | os.PathLike, tokens: np.ndarray, doc_offsets: np.ndarray, cuts: np.ndarray, *,
                       vocab_size: int) -> list:
    """Write documents ``cuts[m]:cuts[m + 1]`` as member store ``root/m<m>`` for each ``m``; return their paths.

    For 10^4-10^5 tiny members (benchmarks, tests): member 0 goes through ``write_flat_dataset``
    (the writer's checks); every other member reuses its manifest with that member's counts, file
    sizes and checksums, and writes its two files directly (no fsync, no atomic publish: test data
    only; ``packfmt validate`` checks every member as usual).
    """
    import copy

    import xxhash

    root = os.fspath(root)
    tokens, doc_offsets = np.asarray(tokens), np.asarray(doc_offsets, dtype=np.int64)
    cuts = np.asarray(cuts, dtype=np.int64)
    paths = [os.path.join(root, f"m{m:06d}") for m in range(len(cuts) - 1)]

    def part(m):
        a, b = int(cuts[m]), int(cuts[m + 1])
        return tokens[doc_offsets[a]:doc_offsets[b]], doc_offsets[a:b + 1] - doc_offsets[a]

    write_flat_dataset(paths[0], *part(0), vocab_size=vocab_size)
    template = F.read_json(os.path.join(paths[0], F.MANIFEST), file=F.MANIFEST)
    for m in range(1, len(paths)):
        toks, offs = part(m)
        os.mkdir(paths[m])
        man = copy.deepcopy(template)
        man["counts"].update(documents=len(offs) - 1, tokens=len(toks))
        for name, arr in ((F.TOKENS, np.ascontiguousarray(toks, dtype=F.TOKEN_DTYPES[man["token_dtype"]])),
                          (F.DOC_OFFSETS, offs)):
            data = arr.tobytes()
            with open(os.path.join(paths[m], name), "wb") as f:
                f.write(data)
            man["files"][name] = {"bytes": len(data), "checksum": "xxh3_64:" + xxhash.xxh3_64(data).hexdigest()}
        with open(os.path.join(paths[m], F.MANIFEST), "wb") as f:
            f.write(F.canonical_json(man))
    return paths


def write_random_collection(root: str | os.PathLike, counts, seed: int = 0) -> tuple:
    """A collection ``root/coll`` over members ``root/stores/m<m>`` of ``counts[m]`` random documents (1-39
    tokens, ids < 1000, uint16) each; returns ``(its path, the member paths, every document's length)``."""
    from pathlib import Path

    from ..collection.writer import write_collection

    root = Path(root)
    rng = np.random.default_rng(seed)
    cuts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    lengths = rng.integers(1, 40, int(cuts[-1])).astype(np.int64)
    offsets = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tokens = rng.integers(0, 1000, int(offsets[-1]), dtype=np.uint16)
    paths = [Path(p) for p in write_split_stores(root / "stores", tokens, offsets, cuts, vocab_size=1000)]
    return write_collection(root / "coll", [(None, p) for p in paths]).path, paths, lengths
