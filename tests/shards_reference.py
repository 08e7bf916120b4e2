"""The pre-streaming ``write_shards`` (packfmt/collection/shards.py before it read the index in bounded chunks),
frozen as the oracle of ``tests/test_shards.py``: the streamed writer must give the same bytes, file for file.

It holds every per-segment array of the index in memory (segments, starts, lengths, lookahead bits, image
ranges, bytes) and cuts the shards from their cumulative sums; spec/COLLECTION.md §9 is the rule both follow.
Only the local path (a URL ``out`` is the same bytes uploaded). Not a library module: nothing in packfmt imports it.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import xxhash

from packfmt import format as F
from packfmt._io import (
    HashedFile,
    checksum_file,
    publish_dir,
    temp_sibling,
    write_durably,
)
from packfmt.collection.arrays import image_token_spans, token_sources
from packfmt.collection.layout import LAYOUT_KIND
from packfmt.collection.manifest import (
    Member,
    collection_reader,
    member_list_checksum,
    parse_collection_manifest,
)
from packfmt.collection.reader import Collection
from packfmt.collection.unify import SHARED_KEYS
from packfmt.collection.writer import (
    collection_manifest,
    prepare_destination,
    write_lengths,
    write_own_files,
)
from packfmt.errors import WriteError
from packfmt.opening import as_dataset
from packfmt.version import __version__
from packfmt.writer import DatasetWriter, ImageRecord

SHARDS_DIR = "shards"
CHUNK_TOKENS = 1 << 24


def reference_write_shards(dataset, index: str | None, out: str | os.PathLike, *, shard_bytes: int,
                           overwrite: bool = False) -> Collection:
    """``write_shards`` as it was before it streamed (whole per-segment arrays in memory), local ``out`` only."""
    t0 = time.perf_counter()
    ds = as_dataset(dataset)
    idx = ds.pack_index(index)
    pm = idx.manifest
    segs, po = np.asarray(idx.segments, dtype=np.int64), np.asarray(idx.pack_offsets, dtype=np.int64)
    if po.shape[0] < 2:
        raise WriteError(f"{idx.path}: pack index {idx.name!r} has no pack; nothing to shard", file=str(idx.path),
                         field="counts.packs", expected=">= 1", found=0)
    off = np.asarray(ds.doc_offsets, dtype=np.int64)
    start = off[segs[:, 0]] + segs[:, 1]
    seg_len = segs[:, 2] - segs[:, 1]
    tokens, mask = token_sources(ds)
    ahead = lookahead(segs, off, mask)
    spans, image_bytes = _images(ds)
    first_image = last_image = None
    if spans is not None:  # the images of each segment: those whose run starts inside it (V28: never cut)
        first_image = np.searchsorted(spans[:, 0], start, side="left")
        last_image = np.searchsorted(spans[:, 0], start + seg_len, side="left")
    per_token = ds.np_token_dtype.itemsize + (1 if ds.has_loss_mask else 0)
    seg_bytes = (seg_len + ahead) * per_token
    if spans is not None:
        cum_img = np.concatenate([[0], np.cumsum(image_bytes)])
        seg_bytes = seg_bytes + cum_img[last_image] - cum_img[first_image]
    cuts = shard_cuts(np.concatenate([[0], np.cumsum(seg_bytes)])[po], int(shard_bytes))
    out = Path(out)
    here, there = Path(ds.path).resolve(), out.resolve()
    if there == here or here in there.parents or there in here.parents:
        raise WriteError(f"{out}: the shards of {ds.path} must go beside it, not onto or inside it (or it inside them)",
                         field="out", expected="a path outside the source", found=str(out))
    prepare_destination(out, overwrite)
    tmp = temp_sibling(out)
    try:
        (tmp / SHARDS_DIR).mkdir()
        src = _Source(ds, tokens, mask, start, seg_len, ahead, spans, first_image, last_image)
        members = []
        for k in range(len(cuts) - 1):
            path = tmp / SHARDS_DIR / f"{k:05d}"
            w = _write_shard(path, ds, src, int(po[cuts[k]]), int(po[cuts[k + 1]]))
            shared = {key: w.manifest()[key] for key in SHARED_KEYS}
            members.append((Member(f"{k:05d}", str(path), w.num_documents, w.num_tokens, w.num_images,
                                   checksum_file(path / F.MANIFEST)), path, shared))
        manifest, own = collection_manifest(members, tmp, files=write_lengths(tmp, seg_len + ahead))  # doc s: L_s
        write_own_files(tmp, own)  # the member table (COLLECTION §2.5, format 2.0) from 256 shards on
        _check_counts(manifest, segs, seg_len, ahead, 0 if spans is None else int((last_image - first_image).sum()))
        binding = member_list_checksum(parse_collection_manifest(manifest, read=collection_reader(tmp)).members)
        _write_index(tmp, pm, idx.name, seg_len, po, binding, time.perf_counter() - t0, cuts)
        manifest["layout"] = {
            "kind": LAYOUT_KIND, "index": idx.name, "shard_bytes": int(shard_bytes),
            "lookahead_tokens": int(ahead.sum()),
            "member_packs": np.diff(cuts).tolist(),
            "source": {"name": _source_name(ds), "manifest": checksum_file(ds.path / F.MANIFEST),
                       "index": checksum_file(idx.path / F.PACK_INDEX_JSON), "mixture": pm.raw.get("mixture"),
                       **({"url": ds.url} if getattr(ds, "url", None) else {})},
        }
        parse_collection_manifest(json.loads(F.canonical_json(manifest)), read=collection_reader(tmp))  # self-check (C1) before publishing
        write_durably(tmp / F.MANIFEST, F.canonical_json(manifest))  # last: the commit point
        publish_dir(tmp, out, overwrite=overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Collection(out)


def _source_name(ds) -> str:
    """The source's directory name (never a host path: FORMAT.md §2.2, §5.3), or the last part of its URL."""
    url = getattr(ds, "url", None)
    return url.rstrip("/").rsplit("/", 1)[-1] if url else Path(ds.path).resolve().name


def lookahead(segs: np.ndarray, off: np.ndarray, mask) -> np.ndarray:
    """bool per segment: it ends before its document does and the next token is a training target
    (its mask bit is 1, or the dataset has no mask), so the label at its cut is that token (FORMAT.md §7)."""
    end = off[segs[:, 0]] + segs[:, 2]
    ahead = end < off[segs[:, 0] + 1]
    if mask is not None and ahead.any():
        at = np.flatnonzero(ahead)
        ahead[at] = np.asarray(mask[end[at]]) == 1
    return ahead


def shard_cuts(pack_end_bytes: np.ndarray, shard_bytes: int) -> np.ndarray:
    """Pack offsets of the shards: each shard ends at the first pack whose end reaches ``shard_bytes``
    bytes since the shard began (the last one holds what is left). ``pack_end_bytes``: ``(P + 1,)`` cumulative."""
    n = pack_end_bytes.shape[0] - 1
    cuts, p = [0], 0
    while p < n:
        q = int(np.searchsorted(pack_end_bytes, pack_end_bytes[p] + shard_bytes, side="left"))
        p = min(max(q, p + 1), n)
        cuts.append(p)
    return np.asarray(cuts, dtype=np.int64)


def _images(ds) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Every image's global token span (sorted) and encoded size, in dataset image order."""
    if ds.num_images == 0:
        return None, None
    sizes = [np.diff(np.asarray(ds.member(m).images.offsets, dtype=np.int64)) for m in range(ds.num_members)
             if ds.image_start[m + 1] > ds.image_start[m]]
    return image_token_spans(ds), np.concatenate(sizes)


class _Source:
    """What the shards are cut from, per source segment in index order."""

    def __init__(self, ds, tokens, mask, start, seg_len, ahead, spans, first_image, last_image) -> None:
        self.ds, self.tokens, self.mask = ds, tokens, mask
        self.start, self.length = start, seg_len + ahead  # the shard document: the segment and its lookahead
        self.spans, self.first_image, self.last_image = spans, first_image, last_image

    def images(self, s: int, doc_start: int) -> list[ImageRecord]:
        """The images of segment ``s`` as records of its shard document (spans relative to ``doc_start``)."""
        if self.spans is None:
            return []
        out = []
        for i in range(int(self.first_image[s]), int(self.last_image[s])):
            m = int(np.searchsorted(self.ds.image_start, i, side="right")) - 1
            store, j = self.ds.member(m), i - int(self.ds.image_start[m])
            (width, height), (b, e) = store.images.size(j), self.spans[i]
            out.append(ImageRecord(bytes(store.images.data(j)), width, height, store.images.codec(j),
                                   int(b) - doc_start, int(e) - doc_start))
        return out


def _write_shard(path: Path, ds, src: _Source, s0: int, s1: int) -> DatasetWriter:
    """One shard: source segments ``s0 .. s1 - 1`` as documents, in order."""
    special = {k: ds.special_tokens.get(k) for k in F.SPECIAL_TOKEN_KEYS}
    tokenizer = {k: v for k, v in ds.manifest.raw["tokenizer"].items() if k != "path"}  # a host path: never (§2.2)
    w = DatasetWriter(path, vocab_size=ds.vocab_size, tokenizer=tokenizer, special_tokens=special,
                      loss_mask=ds.has_loss_mask)
    try:
        a = s0
        while a < s1:
            cum = np.cumsum(src.length[a:s1])
            b = a + max(1, int(np.searchsorted(cum, CHUNK_TOKENS, side="right")))
            lens = src.length[a:b]
            total = int(lens.sum())
            first = np.concatenate([[0], np.cumsum(lens)[:-1]])
            at = np.repeat(src.start[a:b] - first, lens) + np.arange(total, dtype=np.int64)
            toks = np.asarray(src.tokens[at])
            mask = None if src.mask is None else np.asarray(src.mask[at])
            with_images = np.flatnonzero(src.last_image[a:b] > src.first_image[a:b]) if src.spans is not None else []
            run = 0  # documents [run, k) of the chunk not written yet (image-free: one vectorised append)
            for k in [*with_images, b - a]:
                if k > run:
                    t0, t1 = int(first[run]), int(first[k - 1] + lens[k - 1])
                    w.add_documents(toks[t0:t1], lens[run:k], None if mask is None else mask[t0:t1])
                if k < b - a:
                    t0, t1 = int(first[k]), int(first[k] + lens[k])
                    w.add_document(toks[t0:t1], None if mask is None else mask[t0:t1],
                                   src.images(a + k, int(src.start[a + k])))
                run = k + 1
            a = b
        w.finalize()
    except BaseException:
        w.abort()
        raise
    return w


def _check_counts(manifest: dict, segs, seg_len, ahead, images: int) -> None:
    """Every segment became one document, every token and image arrived (nothing lost, nothing silent)."""
    counts = manifest["counts"]
    want = {"documents": int(segs.shape[0]), "tokens": int(seg_len.sum() + ahead.sum()), "images": images}
    for key, value in want.items():
        if counts[key] != value:
            raise WriteError(f"shards: counts.{key}: expected {value} (from the source index's segments, their "
                             f"lookahead tokens and images), found {counts[key]}", field=f"counts.{key}", expected=value, found=counts[key])


def _write_index(root: Path, pm, name: str, seg_len: np.ndarray, po: np.ndarray, binding: str, seconds: float,
                 cuts: np.ndarray) -> None:
    """``packs/<name>``: pack ``p`` is the source's pack ``p``, its segments ``(g, 0, L_g - lookahead_g)``."""
    n = seg_len.shape[0]
    target = root / F.PACKS_DIR / name
    target.parent.mkdir()
    tmp = temp_sibling(target)
    files = {}
    f = HashedFile(tmp / F.PACK_OFFSETS)
    f.write_array(po, F.OFFSET_DTYPE)
    files[F.PACK_OFFSETS] = f.close()
    f = HashedFile(tmp / F.SEGMENTS)
    for a in range(0, n, 1 << 20):
        b = min(n, a + (1 << 20))
        f.write_array(np.stack([np.arange(a, b, dtype=np.int64), np.zeros(b - a, dtype=np.int64), seg_len[a:b]], 1),
                      F.OFFSET_DTYPE)
    files[F.SEGMENTS] = f.close()
    if pm.capacity < 2**32:  # COLLECTION §9.4 from whole arrays: shard k = packs cuts[k] .. cuts[k+1] - 1
        segs = np.fromfile(tmp / F.SEGMENTS, dtype="<i8")  # flat: 3 per row
        raw_po, raw_segs = po.astype("<i8").tobytes(), segs.tobytes()
        rows = [(xxhash.xxh3_64_intdigest(raw_po[8 * int(cuts[k]):8 * (int(cuts[k + 1]) + 1)]),
                 xxhash.xxh3_64_intdigest(raw_segs[24 * int(po[cuts[k]]):24 * int(po[cuts[k + 1]])]))
                for k in range(len(cuts) - 1)]
        for fname, arr in (("shard_digests.bin", np.array(rows, dtype="<u8")),
                           ("pack_tokens.bin", np.add.reduceat(seg_len, po[:-1]).astype("<u4"))):
            f = HashedFile(tmp / fname)
            f.write_array(arr, arr.dtype)
            files[fname] = f.close()
    packs, packed = int(po.shape[0] - 1), int(seg_len.sum())
    stats = {"documents": n, "documents_packed": n, "segments": n, "packs": packs, "split_documents": 0,
             "dropped_documents": 0, "dropped_tokens": 0, "truncated_documents": 0, "truncated_tokens": 0,
             "fill_efficiency": packed / (packs * pm.capacity), "seconds": round(seconds, 6)}
    index = {
        "format": F.PACK_INDEX_FORMAT_NAME, "format_version": "1.2" if "pack_tokens.bin" in files else "1.1",
        "producer": {"name": "packfmt", "version": __version__},
        "name": name, "capacity": pm.capacity, "algorithm": pm.algorithm, "seed": pm.raw["seed"],
        "oversize": pm.oversize, "params": dict(pm.params),
        "counts": {"packs": packs, "segments": n, "packed_tokens": packed},
        "stats": stats, "materialized": False, "collection": binding, "files": files,
    }
    write_durably(tmp / F.PACK_INDEX_JSON, F.canonical_json(index))
    publish_dir(tmp, target, overwrite=False)
