"""``packfmt pack COLL --shards OUT``: rewrite the packs of an index in pack order, as a collection of shards.

A streamed remote collection fetches whole members; a globally packed index mixes documents of
every member in every pack, so a shuffled order fetches members again and again. ``write_shards``
writes the packs of one index, in pack order, into member stores of about ``shard_bytes`` each
(``OUT/shards/00000``, ...), cut at pack boundaries, and an index ``OUT/packs/<name>`` whose pack
``p`` is the source's pack ``p``: a sampler that shuffles shards, then packs within a window of
shards, reads each shard once per epoch (spec/COLLECTION.md §9).

Each segment of each pack becomes one document of the shard: its tokens (loss mask, images), plus
one **lookahead** token when the source's label at the segment's cut needs it (the segment ends
before its document does and the next token is a training target: FORMAT.md §7). The shard's
index segment ``(g, 0, L_g - lookahead_g)`` then gives every reader the same ``input_ids``,
``labels`` and ``position_ids`` as the source index, with no reader change: the label at the cut
is the lookahead token, which is never an input.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import numpy as np

from .. import format as F
from .._io import HashedFile, checksum_file, publish_dir, temp_sibling, write_durably
from ..errors import WriteError
from ..opening import as_dataset
from ..version import __version__
from ..writer import DatasetWriter
from .arrays import token_sources
from .layout import LAYOUT_KIND, LAYOUT_VERSION_STR
from .manifest import Member, member_list_checksum, parse_collection_manifest
from .reader import Collection
from .shard_source import Source, images_of, lookahead
from .unify import SHARED_KEYS
from .writer import collection_manifest, prepare_destination, write_lengths

__all__ = ["DEFAULT_SHARD_BYTES", "SHARDS_DIR", "parse_size", "write_shards"]

#: What a shard holds before the next pack starts another one (tokens + loss mask + image bytes).
DEFAULT_SHARD_BYTES = 256 << 20
#: Where the members of a pack-ordered layout live in the collection directory.
SHARDS_DIR = "shards"
#: Tokens gathered per chunk while a shard is written (bounds the temporary arrays).
CHUNK_TOKENS = 1 << 24
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30,
          "kb": 10**3, "mb": 10**6, "gb": 10**9}


def parse_size(text: str) -> int:
    """``256MiB``, ``1GiB``, ``500MB``, ``1048576``: a byte count >= 1 (ValueError otherwise)."""
    s = str(text).strip().lower()
    num = s.rstrip("kmgib")
    unit = s[len(num):]
    if unit not in _UNITS or not num:
        raise ValueError(f"expected a size such as 256MiB, 1GiB, 500MB or 1048576, got {text!r}")
    try:
        value = float(num) * _UNITS[unit]
    except ValueError:
        raise ValueError(f"expected a size such as 256MiB, 1GiB, 500MB or 1048576, got {text!r}") from None
    if not 1 <= value < F.INT64_MAX:  # NaN and infinity included
        raise ValueError(f"expected a size of at least 1 byte and below 2^63, got {text!r}")
    return int(value)


def write_shards(dataset, index: str | None, out: str | os.PathLike, *, shard_bytes: int = DEFAULT_SHARD_BYTES,
                 overwrite: bool = False, storage_options: dict | None = None) -> Collection:
    """Write the packs of ``dataset``'s pack index ``index`` in pack order as the collection ``out``.

    ``dataset``: a store or a collection (or its path or URL); a store is a collection of one.
    ``index``: the name of its pack index (None: the only one). Shards are cut at the first pack
    boundary at or after ``shard_bytes`` bytes of tokens, loss mask and encoded images. ``out`` is
    published atomically (a temporary sibling, its ``manifest.json`` written last, one rename); a
    URL ``out`` is written where the cache mirrors it, then uploaded with ``manifest.json`` last
    (spec/FORMAT.md §5.4). Returns ``out`` opened; its index of the same name gives every pack
    exactly as the source's.
    """
    from ..storage import is_url

    if not isinstance(shard_bytes, (int, np.integer)) or isinstance(shard_bytes, bool) or shard_bytes < 1:
        raise WriteError(field="shard_bytes", expected="an integer >= 1", found=repr(shard_bytes))
    t0 = time.perf_counter()
    ds = as_dataset(dataset, storage_options=storage_options)
    if is_url(str(out)):  # written where the cache mirrors ``out``, then uploaded: shards, index, manifest last
        from ..opening import open_dataset
        from ..storage.upload import remote_output

        with remote_output(str(out), storage_options, overwrite=overwrite) as local:
            write_shards(ds, index, local, shard_bytes=shard_bytes)
        return open_dataset(str(out), storage_options=storage_options)
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
    spans, image_bytes = images_of(ds)
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
        src = Source(ds, tokens, mask, start, seg_len, ahead, spans, first_image, last_image)
        members = []
        for k in range(len(cuts) - 1):
            path = tmp / SHARDS_DIR / f"{k:05d}"
            w = _write_shard(path, ds, src, int(po[cuts[k]]), int(po[cuts[k + 1]]))
            shared = {key: w.manifest()[key] for key in SHARED_KEYS}
            members.append((Member(f"{k:05d}", str(path), w.num_documents, w.num_tokens, w.num_images,
                                   checksum_file(path / F.MANIFEST)), path, shared))
        manifest = collection_manifest(members, tmp, files=write_lengths(tmp, seg_len + ahead))  # OUT doc s: L_s
        _check_counts(manifest, segs, seg_len, ahead, 0 if spans is None else int((last_image - first_image).sum()))
        _write_index(tmp, pm, idx.name, seg_len, po, member_list_checksum(manifest["members"]), time.perf_counter() - t0)
        manifest["format_version"] = LAYOUT_VERSION_STR
        manifest["layout"] = {
            "kind": LAYOUT_KIND, "index": idx.name, "shard_bytes": int(shard_bytes),
            "lookahead_tokens": int(ahead.sum()),
            "member_packs": np.diff(cuts).tolist(),
            "source": {"name": _source_name(ds), "manifest": checksum_file(ds.path / F.MANIFEST),
                       "index": checksum_file(idx.path / F.PACK_INDEX_JSON), "mixture": pm.raw.get("mixture"),
                       **({"url": ds.url} if getattr(ds, "url", None) else {})},
        }
        parse_collection_manifest(json.loads(F.canonical_json(manifest)))  # self-check (C1) before publishing
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


def _write_shard(path: Path, ds, src: Source, s0: int, s1: int) -> DatasetWriter:
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


def _write_index(root: Path, pm, name: str, seg_len: np.ndarray, po: np.ndarray, binding: str, seconds: float) -> None:
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
    packs, packed = int(po.shape[0] - 1), int(seg_len.sum())
    stats = {"documents": n, "documents_packed": n, "segments": n, "packs": packs, "split_documents": 0,
             "dropped_documents": 0, "dropped_tokens": 0, "truncated_documents": 0, "truncated_tokens": 0,
             "fill_efficiency": packed / (packs * pm.capacity), "seconds": round(seconds, 6)}
    index = {
        "format": F.PACK_INDEX_FORMAT_NAME, "format_version": "1.1",
        "producer": {"name": "packfmt", "version": __version__},
        "name": name, "capacity": pm.capacity, "algorithm": pm.algorithm, "seed": pm.raw["seed"],
        "oversize": pm.oversize, "params": dict(pm.params),
        "counts": {"packs": packs, "segments": n, "packed_tokens": packed},
        "stats": stats, "materialized": False, "collection": binding, "files": files,
    }
    write_durably(tmp / F.PACK_INDEX_JSON, F.canonical_json(index))
    publish_dir(tmp, target, overwrite=False)
