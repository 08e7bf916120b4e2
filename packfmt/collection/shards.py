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

The index is read as a stream, in pack order, a chunk of rows of its memory-mapped ``segments.bin`` at a time
(at most ``CHUNK_SEGMENTS`` rows and ``CHUNK_TOKENS`` tokens; ``shard_source``): each chunk's documents go to
the shard being written, closed at the first pack end where it reaches ``shard_bytes``; OUT's
``segments.bin`` and ``doc_lengths.bin`` grow chunk by chunk. What is held is one chunk, the write buffers
and one entry per shard, whatever the number of segments (``benchmarks/bench_shards_memory.py``).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import xxhash

from .. import format as F
from .._io import HashedFile, checksum_file, publish_dir, temp_sibling, write_durably
from ..errors import WriteError
from ..opening import whole_dataset
from ..version import __version__
from ..writer import DatasetWriter
from . import shard_rows as R
from .layout import LAYOUT_KIND
from .lengths import LENGTHS_FILE
from .manifest import (
    Member,
    collection_reader,
    member_list_checksum,
    parse_collection_manifest,
)
from .reader import Collection
from .shard_source import Chunk, Source
from .unify import SHARED_KEYS
from .writer import collection_manifest, prepare_destination, write_own_files

__all__ = ["DEFAULT_SHARD_BYTES", "SHARDS_DIR", "parse_size", "write_shards"]

#: What a shard holds before the next pack starts another one (tokens + loss mask + image bytes).
DEFAULT_SHARD_BYTES = 256 << 20
#: Where the members of a pack-ordered layout live in the collection directory.
SHARDS_DIR = "shards"
#: Source segments read at a time, at most (their rows of ``segments.bin`` and about 150 bytes of arrays each).
CHUNK_SEGMENTS = 1 << 17
#: Tokens a chunk holds, at most (at least one segment): its tokens and mask are copied into one buffer (3 bytes
#: a token for uint16 tokens with a mask). With ``CHUNK_SEGMENTS``, what bounds the memory ``write_shards``
#: holds, whatever the size of the index; a member is opened once per chunk that reads it. Internal (the tests
#: force small values so chunks end inside packs and shards); OUT does not depend on either.
CHUNK_TOKENS = 1 << 23
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
    ds = whole_dataset(dataset, "written as shards", "write_shards(URL, ...), or `packfmt pack URL --capacity N "
                       "--shards OUT`", storage_options=storage_options)
    if is_url(str(out)):  # written where the cache mirrors ``out``, then uploaded: shards, index, manifest last
        from ..opening import open_dataset
        from ..storage.upload import remote_output

        with remote_output(str(out), storage_options, overwrite=overwrite) as local:
            write_shards(ds, index, local, shard_bytes=shard_bytes)
        return open_dataset(str(out), storage_options=storage_options)
    idx = ds.pack_index(index)
    segs, po = idx.segments, idx.pack_offsets  # memory maps, read a chunk at a time
    if po.shape[0] < 2:
        raise WriteError(f"{idx.path}: pack index {idx.name!r} has no pack; nothing to shard", file=str(idx.path),
                         field="counts.packs", expected=">= 1", found=0)
    out = Path(out)
    here, there = Path(ds.path).resolve(), out.resolve()
    if there == here or here in there.parents or there in here.parents:
        raise WriteError(f"{out}: the shards of {ds.path} must go beside it, not onto or inside it (or it inside them)",
                         field="out", expected="a path outside the source", found=str(out))
    prepare_destination(out, overwrite)
    tmp = temp_sibling(out)
    shards = files = None
    try:
        (tmp / SHARDS_DIR).mkdir()
        src, shards, files = Source(ds), _Shards(tmp / SHARDS_DIR, ds, int(shard_bytes)), _IndexFiles(tmp, idx.name)
        n, a = int(segs.shape[0]), 0
        while a < n:
            rows = segs[a:a + CHUNK_SEGMENTS]  # as many as hold CHUNK_TOKENS tokens (lookahead included), >= 1
            b = a + max(1, int(np.searchsorted(np.cumsum(rows[:, 2] - rows[:, 1] + 1), CHUNK_TOKENS, side="right")))
            chunk = src.chunk(rows[:b - a], a, f"{F.PACKS_DIR}/{idx.name}/{F.SEGMENTS}")
            p0, p1 = (int(p) for p in np.searchsorted(po, [a, b], side="right"))  # the packs ending in (a, b]
            closed = len(shards.members)
            shards.add(src, chunk, np.asarray(po[p0:p1], dtype=np.int64) - a, p0)
            files.add(a, chunk, shards.doc_ends[closed:])  # the shards that ended in it: their rows' digests
            a = b
        shards.close(int(po.shape[0]) - 1)
        manifest, own = collection_manifest(shards.members, tmp, files={LENGTHS_FILE: files.lengths.close()})
        write_own_files(tmp, own)  # a member table (§2.5) from 256 shards on; the manifest says 1.3 or 2.0
        _check_counts(manifest, {"documents": n, "tokens": files.tokens, "images": files.images})
        binding = member_list_checksum(parse_collection_manifest(manifest, read=collection_reader(tmp)).members)
        files.finish(idx.manifest, po, binding, time.perf_counter() - t0, shards.member_packs, idx.pack_lengths)
        manifest["layout"] = {
            "kind": LAYOUT_KIND, "index": idx.name, "shard_bytes": int(shard_bytes),
            "lookahead_tokens": files.tokens - files.packed,
            "member_packs": shards.member_packs,
            "source": {"name": _source_name(ds), "manifest": checksum_file(ds.path / F.MANIFEST),
                       "index": checksum_file(idx.path / F.PACK_INDEX_JSON), "mixture": idx.manifest.raw.get("mixture"),
                       **({"url": ds.url} if getattr(ds, "url", None) else {})},
        }
        parse_collection_manifest(json.loads(F.canonical_json(manifest)), read=collection_reader(tmp))  # C1 self-check
        write_durably(tmp / F.MANIFEST, F.canonical_json(manifest))  # last: the commit point
        publish_dir(tmp, out, overwrite=overwrite)
    except BaseException:
        for part in (shards, files):
            if part is not None:
                part.abort()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Collection(out)


def _source_name(ds) -> str:
    """The source's directory name (never a host path: FORMAT.md §2.2, §5.3), or the last part of its URL."""
    url = getattr(ds, "url", None)
    return url.rstrip("/").rsplit("/", 1)[-1] if url else Path(ds.path).resolve().name


class _Shards:
    """The shard being written and the shards done. Shard ``k`` holds packs ``c_k .. c_(k+1) - 1``:
    ``c_(k+1)`` is the first pack end at which its bytes reach ``limit`` (or the last pack; §9.1)."""

    def __init__(self, root: Path, ds, limit: int) -> None:
        self.root, self.ds, self.limit = root, ds, limit
        self.writer: DatasetWriter | None = None
        self.bytes = 0  # of the shard being written, so far
        self.first_pack = 0  # its first pack
        self.members: list = []  # (member, path, shared keys) of each shard done
        self.member_packs: list[int] = []
        self.doc_ends: list[int] = []  # the documents written when each shard was done (D_(k+1), §9.4)

    def add(self, src: Source, c: Chunk, ends: np.ndarray, p0: int) -> None:
        """The chunk's documents, in order. ``ends``: the positions in the chunk where packs end, increasing:
        ``ends[j]`` is the source's ``pack_offsets[p0 + j]``, so ``p0 + j`` packs are done there."""
        cum = np.concatenate([[0], np.cumsum(c.nbytes)])
        at_end, lo, j = cum[ends], 0, 0
        while True:  # the first pack end from ``lo`` at which the shard reaches the size
            j += int(np.searchsorted(at_end[j:], cum[lo] + self.limit - self.bytes, side="left"))
            if j == len(ends):
                break
            self._write(src, c, lo, int(ends[j]), int(cum[ends[j]] - cum[lo]))
            self.close(p0 + j)
            lo, j = int(ends[j]), j + 1
        self._write(src, c, lo, len(c), int(cum[-1] - cum[lo]))

    def _write(self, src: Source, c: Chunk, lo: int, hi: int, nbytes: int) -> None:
        if hi <= lo:
            return
        if self.writer is None:
            ds = self.ds
            special = {k: ds.special_tokens.get(k) for k in F.SPECIAL_TOKEN_KEYS}
            tokenizer = {k: v for k, v in ds.manifest.raw["tokenizer"].items() if k != "path"}  # never a host path
            self.writer = DatasetWriter(self.root / f"{len(self.members):05d}", vocab_size=ds.vocab_size,
                                        tokenizer=tokenizer, special_tokens=special, loss_mask=ds.has_loss_mask)
        _append(self.writer, src, c, lo, hi)
        self.bytes += nbytes

    def close(self, packs_done: int) -> None:
        """Finish the shard being written (none: nothing to do) after pack ``packs_done - 1``."""
        w = self.writer
        if w is None:
            return
        w.finalize()
        path, name = w.path, f"{len(self.members):05d}"
        shared = {key: w.manifest()[key] for key in SHARED_KEYS}
        self.members.append((Member(name, str(path), w.num_documents, w.num_tokens, w.num_images,
                                    checksum_file(path / F.MANIFEST)), path, shared))
        self.member_packs.append(packs_done - self.first_pack)
        self.doc_ends.append((self.doc_ends[-1] if self.doc_ends else 0) + w.num_documents)
        self.writer, self.bytes, self.first_pack = None, 0, packs_done

    def abort(self) -> None:
        if self.writer is not None:
            self.writer.abort()


def _append(w: DatasetWriter, src: Source, c: Chunk, lo: int, hi: int) -> None:
    """The chunk's documents ``lo .. hi - 1`` appended to ``w``: runs without images in one vectorised call each."""
    i0, i1 = (int(i) for i in np.searchsorted(c.imaged, [lo, hi]))
    run = lo  # documents [run, k) not written yet
    for k in [*c.imaged[i0:i1].tolist(), hi]:
        if k > run:
            t0, t1 = int(c.first[run]), int(c.first[k])
            w.add_documents(c.tokens[t0:t1], c.length[run:k], None if c.mask is None else c.mask[t0:t1])
        if k < hi:
            t0, t1 = int(c.first[k]), int(c.first[k + 1])
            w.add_document(c.tokens[t0:t1], None if c.mask is None else c.mask[t0:t1], src.images(c, k))
        run = k + 1


def _check_counts(manifest: dict, want: dict) -> None:
    """Every segment became one document, every token and image arrived (nothing lost, nothing silent)."""
    counts = manifest["counts"]
    for key, value in want.items():
        if counts[key] != value:
            raise WriteError(f"shards: counts.{key}: expected {value} (from the source index's segments, their "
                             f"lookahead tokens and images), found {counts[key]}", field=f"counts.{key}", expected=value,
                             found=counts[key])


class _IndexFiles:
    """OUT's ``doc_lengths.bin`` (``L_s``) and ``packs/<name>`` (pack ``p`` is the source's pack ``p``, its
    segments ``(s, 0, L_s - a(s))``), appended to chunk by chunk; the totals they record."""

    def __init__(self, root: Path, name: str) -> None:
        self.name, self.target = name, root / F.PACKS_DIR / name
        self.target.parent.mkdir()
        self.tmp = temp_sibling(self.target)
        self.lengths = HashedFile(root / LENGTHS_FILE)
        self.segments = HashedFile(self.tmp / F.SEGMENTS)
        self.rows_hash, self.seg_digests = xxhash.xxh3_64(), []  # the shard being written, the shards done
        self.tokens = self.packed = self.images = 0

    def add(self, a: int, c: Chunk, cuts: list) -> None:
        """The chunk of source segments ``a, a + 1, ...``: OUT's documents of the same numbers. ``cuts``: the
        documents at which shards ended in it (``D_(k+1)``): the digest of a shard's rows of ``segments.bin`` is
        taken as they are written (§9.4)."""
        n = len(c)
        self.lengths.write_array(c.length, F.OFFSET_DTYPE)
        rows = np.stack([np.arange(a, a + n, dtype=np.int64), np.zeros(n, dtype=np.int64), c.seg_len], 1)
        self.segments.write_array(rows, F.OFFSET_DTYPE)
        start = 0
        for cut in cuts:
            self.rows_hash.update(np.ascontiguousarray(rows[start:cut - a], dtype=F.OFFSET_DTYPE).data)
            self.seg_digests.append(self.rows_hash.intdigest())
            self.rows_hash.reset()
            start = cut - a
        self.rows_hash.update(np.ascontiguousarray(rows[start:], dtype=F.OFFSET_DTYPE).data)
        self.tokens += int(c.length.sum())
        self.packed += int(c.seg_len.sum())
        self.images += 0 if c.image0 is None else int((c.image1 - c.image0).sum())

    def finish(self, pm, po, binding: str, seconds: float, member_packs: list, pack_lengths: np.ndarray) -> None:
        """``pack_offsets.bin`` (the source's, copied a chunk at a time), the shards' rows digests and the packs'
        lengths (§9.4, below capacity 2^32: the source's packs' lengths, which are OUT's) and ``index.json``; the
        index published."""
        files = {}
        f = HashedFile(self.tmp / F.PACK_OFFSETS)
        for a in range(0, int(po.shape[0]), CHUNK_SEGMENTS):
            f.write_array(po[a:a + CHUNK_SEGMENTS], F.OFFSET_DTYPE)
        files[F.PACK_OFFSETS] = f.close()
        files[F.SEGMENTS] = self.segments.close()
        if len(self.seg_digests) < len(member_packs):  # the last shard, closed after the last chunk
            self.seg_digests.append(self.rows_hash.intdigest())
        if pm.capacity < R.PACK_TOKENS_LIMIT:
            files.update(self._shard_rows(po, member_packs, pack_lengths))
        n, packs, packed = self.lengths.nbytes // F.OFFSET_DTYPE.itemsize, int(po.shape[0] - 1), self.packed
        stats = {"documents": n, "documents_packed": n, "segments": n, "packs": packs, "split_documents": 0,
                 "dropped_documents": 0, "dropped_tokens": 0, "truncated_documents": 0, "truncated_tokens": 0,
                 "fill_efficiency": packed / (packs * pm.capacity), "seconds": round(seconds, 6)}
        index = {
            "format": F.PACK_INDEX_FORMAT_NAME, "format_version": R.ROWS_VERSION_STR if R.listed(files) else "1.1",
            "producer": {"name": "packfmt", "version": __version__},
            "name": self.name, "capacity": pm.capacity, "algorithm": pm.algorithm, "seed": pm.raw["seed"],
            "oversize": pm.oversize, "params": dict(pm.params),
            "counts": {"packs": packs, "segments": n, "packed_tokens": packed},
            "stats": stats, "materialized": False, "collection": binding, "files": files,
        }
        write_durably(self.tmp / F.PACK_INDEX_JSON, F.canonical_json(index))
        publish_dir(self.tmp, self.target, overwrite=False)

    def _shard_rows(self, po, member_packs: list, pack_lengths: np.ndarray) -> dict:
        """``shard_digests.bin`` (each shard's rows of ``pack_offsets.bin``, hashed from the source's, which OUT's
        copies, and the digests of its rows of ``segments.bin`` taken while they were written) and
        ``pack_tokens.bin`` (each pack's length, <= capacity < 2^32)."""
        c = np.concatenate([[0], np.cumsum(member_packs, dtype=np.int64)])
        h_po = [xxhash.xxh3_64_intdigest(np.ascontiguousarray(po[c[k]:c[k + 1] + 1], dtype=F.OFFSET_DTYPE).data)
                for k in range(len(member_packs))]
        digests = np.stack([np.array(h_po, dtype=np.uint64), np.array(self.seg_digests, dtype=np.uint64)], 1)
        out = {}
        for fname, arr, dtype in ((R.SHARD_DIGESTS, digests, R.DIGEST_DTYPE),
                                  (R.PACK_TOKENS, pack_lengths, R.PACK_TOKENS_DTYPE)):
            f = HashedFile(self.tmp / fname)
            for a in range(0, arr.shape[0], CHUNK_SEGMENTS):
                f.write_array(arr[a:a + CHUNK_SEGMENTS], dtype)
            out[fname] = f.close()
        return out

    def abort(self) -> None:
        self.lengths.abort()
        self.segments.abort()
