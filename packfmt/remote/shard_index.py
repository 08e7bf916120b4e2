"""A pack-ordered layout's index read shard by shard from a bucket (spec/COLLECTION.md §9.4; README "Remote data").

A streamed collection (``streamed``) whose ``layout`` names an index of format 1.2 opens that index as a
``ShardedIndex``: it fetches ``index.json`` and ``shard_digests.bin`` (16 bytes a shard, verified whole as every
cached file is), not ``segments.bin`` (24 bytes a document) nor ``pack_offsets.bin``. Those two are mapped from
sparse files of their full size in the cache, and shard ``k``'s rows of both are filled when something first reads
a pack of shard ``k`` in this process (``ensure_rows``: before the reader plans a batch; and when the member cache
fetches member ``k``, so the prefetcher's fetches carry them): bytes already in the file (another process, an
earlier run) are used when they hash to row ``k`` of ``shard_digests.bin``, else the rows are fetched by two ranged
GETs, and either way checked as ``shard_rows.check_rows`` says (the digests, then V25 and V27 as far as the shard's
tokens bound them; the reader checks each segment against its document's length when the shard itself arrives).
Rows not checked by this process are never read: the kernels index ``pack_offsets`` and ``segments`` only for the
packs of a batch, whose shards were made ready first.

The rows are part of the member cache's bound: shard ``k``'s rows count with member ``k``'s files against
``cache_limit``, are checked only while this process holds member ``k`` (fetching or resident: its pin held, so no
other process removes them), and leave with it: when member ``k`` is evicted its rows are no longer ready here, and
when no other process holds it either (the rule by which its files are removed) the pages of its rows are
punched out of the sparse files (``FALLOC_FL_PUNCH_HOLE``; where the file system cannot, they stay, as before), a
page it shares with other shards' rows only when none of those is held either. On disk the rows of the shards held
thus exceed their count by at most two pages a file each.
Readers take the shards a batch touches with ``held(packs)``: pinned, fetched, rows ready, until the block ends.

``pack_tokens.bin`` (4 bytes a pack) is fetched only when asked for (``pack_lengths``: the token-balanced
sampler), and each shard's rows are compared with it when both are there.
"""

from __future__ import annotations

import os
import shutil
import threading
from contextlib import contextmanager

import numpy as np
import xxhash

from .. import format as F
from .. import index_format as IF
from ..collection import shard_rows as R
from ..collection.layout import layout_of
from ..errors import FormatError
from ..index import PackIndex
from ..mapped import map_file
from ..storage import verify as V
from ..storage.cache import log_download
from ..storage.errors import storage_errors
from ..storage.in_flight import together
from ..storage.ranges import read_range
from ..storage.transport import remote

__all__ = ["ShardedIndex", "sharded", "punch_hole"]

_FALLOC_FL_KEEP_SIZE, _FALLOC_FL_PUNCH_HOLE = 0x01, 0x02
_PAGE = 4096


def punch_hole(fd: int, start: int, end: int) -> int:
    """Deallocate the whole 4 KiB pages inside bytes ``[start, end)`` of the file open as ``fd`` (they read as zeros
    after; the size is kept): Linux ``fallocate(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE)``. Bytes punched; 0 where
    the system or the file system has no such call (the bytes then stay)."""
    a, b = -(-start // _PAGE) * _PAGE, end // _PAGE * _PAGE
    if b <= a:
        return 0
    fallocate = _fallocate()
    if fallocate is None or fallocate(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, a, b - a) != 0:
        return 0
    return b - a


_FALLOCATE: list = []


def _fallocate():
    """libc's ``fallocate`` through ctypes (None off Linux): looked up once."""
    if not _FALLOCATE:
        fn = None
        try:
            import ctypes

            fn = ctypes.CDLL(None, use_errno=True).fallocate
            fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
            fn.restype = ctypes.c_int
        except (OSError, AttributeError):
            fn = None
        _FALLOCATE.append(fn)
    return _FALLOCATE[0]


def sharded(coll, name: str, raw: bytes) -> bool:
    """Whether index ``name`` of streamed collection ``coll`` (its ``index.json`` bytes ``raw``) is read shard by
    shard: the one its ``layout`` names, listing the two files of §9.4 (else it is fetched whole)."""
    layout = layout_of(coll.manifest)
    if layout is None or layout["index"] != name:
        return False
    try:
        return R.listed(F.parse_json(raw, file=name).get("files", {}))
    except (FormatError, AttributeError):
        return False  # the whole-index path reports it


class ShardedIndex(PackIndex):
    """``PackIndex`` of a layout in a bucket, its rows fetched and checked a shard at a time (see the module doc)."""

    def __init__(self, coll, members, name: str, raw: bytes) -> None:
        """Index ``name`` (its ``index.json`` bytes ``raw``) of streamed collection ``coll``, whose ``members``
        (a ``members.StreamedMembers``) fetch shard ``k``'s rows with member ``k``."""
        self.store, self.name, self._members = coll, IF.check_index_name(name), members
        self._label = f"{F.PACKS_DIR}/{name}/"
        self.url = f"{members.url}/{F.PACKS_DIR}/{name}/"
        self.manifest = IF.parse_pack_index_manifest(F.parse_json(raw, file=self.url + F.PACK_INDEX_JSON),
                                                     file=self.url + F.PACK_INDEX_JSON)
        self._check_binding(coll.index_binding())
        if self.manifest.name != name:
            raise FormatError(file=self.url + F.PACK_INDEX_JSON, field="name", expected=repr(name) + " (the directory "
                              "name)", found=repr(self.manifest.name))
        if self.manifest.materialized:
            raise FormatError(file=self.url + F.PACK_INDEX_JSON, field="materialized", expected="false (a layout's "
                              "index, spec/COLLECTION.md §9.2)", found="true")
        layout = layout_of(coll.manifest)
        self.c, self.d = R.bounds(layout["member_packs"], np.asarray(coll.members.documents, dtype=np.int64))
        P, S, K = self.manifest.num_packs, self.manifest.num_segments, len(layout["member_packs"])
        if self.c[-1] != P or self.d[-1] != S:
            raise FormatError(f"{self.url}{F.PACK_INDEX_JSON}: counts: expected {int(self.c[-1])} packs (the sum of "
                              f"manifest.json layout.member_packs) and {int(self.d[-1])} segments (the collection's "
                              f"documents, one segment each: spec/COLLECTION.md §9.2), found {P} and {S}",
                              file=self.url + F.PACK_INDEX_JSON, field="counts", expected=(int(self.c[-1]), int(self.d[-1])),
                              found=(P, S))
        self._shapes = {F.PACK_OFFSETS: (F.OFFSET_DTYPE, (P + 1,)), F.SEGMENTS: (F.OFFSET_DTYPE, (S, F.SEGMENT_COLUMNS)),
                        R.SHARD_DIGESTS: (R.DIGEST_DTYPE, (K, 2)), R.PACK_TOKENS: (R.PACK_TOKENS_DTYPE, (P,))}
        for fname, (dtype, shape) in self._shapes.items():
            entry = self.manifest.files[fname]
            if entry.bytes != F.nbytes_of(dtype, shape):
                raise FormatError(f"{self.url}{fname}: size: expected {F.nbytes_of(dtype, shape)} bytes "
                                  f"({np.dtype(dtype).str} x {shape} from the counts), found {entry.bytes} recorded",
                                  file=self.url + fname, field="bytes", expected=F.nbytes_of(dtype, shape),
                                  found=entry.bytes)
        self.path = coll.path / F.PACKS_DIR / f".rows-{name}-{xxhash.xxh3_64_hexdigest(raw)}"
        self._drop_older()
        self.path.mkdir(parents=True, exist_ok=True)
        # the shards' digests, and each pack's tokens (read by the default sampler, balance="tokens": fetched now, at
        # once with them, not one round trip later; mapped on first use, ``pack_lengths``)
        together([lambda: self._fetch(R.SHARD_DIGESTS), lambda: self._fetch(R.PACK_TOKENS)])
        self.digests = map_file(self.path / R.SHARD_DIGESTS, *self._shapes[R.SHARD_DIGESTS], file=self.url + R.SHARD_DIGESTS)
        self._fds = {}
        for fname in (F.PACK_OFFSETS, F.SEGMENTS):  # sparse: only the rows of shards read hold blocks
            fd = self._fds[fname] = os.open(self.path / fname, os.O_RDWR | os.O_CREAT, 0o644)
            if os.fstat(fd).st_size != self.manifest.files[fname].bytes:
                os.ftruncate(fd, self.manifest.files[fname].bytes)
        self.pack_offsets = map_file(self.path / F.PACK_OFFSETS, *self._shapes[F.PACK_OFFSETS], file=self.url + F.PACK_OFFSETS)
        self.segments = map_file(self.path / F.SEGMENTS, *self._shapes[F.SEGMENTS], file=self.url + F.SEGMENTS)
        self.pack_token_offsets = self.packed_tokens = self.packed_loss_mask = None
        self._tokens_bound = np.asarray(coll.members.tokens, dtype=np.int64)
        self._ready = np.zeros(K, dtype=bool)
        self._lock = threading.Lock()  # pack_tokens.bin
        self._locks = [threading.Lock() for _ in range(16)]  # shard k: _locks[k % 16] (threads fill others meanwhile)
        self._pack_tokens = None
        self.fetched_rows = 0  # bytes of rows this process fetched (the rest were in the file already)
        members.sharded.append(self)  # member k's fetch readies shard k's rows (the prefetcher's too)

    # -- the two files fetched whole
    def _fetch(self, fname: str) -> None:
        f = self._members.fetcher
        with storage_errors(self.url + fname, f.so, f.root):
            fs, rpath = remote(self._members.url, f.so)
            f.file(fs, f"{rpath}/{F.PACKS_DIR}/{self.name}/{fname}", self.url + fname, self.path / fname,
                   self.manifest.files[fname], self.url + F.PACK_INDEX_JSON)

    def _drop_older(self) -> None:
        """Rows of an index of this name the bucket no longer has (another ``index.json``): removed."""
        root = self._members.fetcher.root
        for p in self.path.parent.glob(f".rows-{self.name}-*"):
            if p != self.path:
                shutil.rmtree(V.state_dir(root, p), ignore_errors=True)
                shutil.rmtree(p, ignore_errors=True)

    @property
    def pack_lengths(self) -> np.ndarray:
        """uint32 ``(P,)``: every pack's length, from ``pack_tokens.bin`` (fetched, verified, on first use); the rows
        of each shard are compared with it as they are read (and those read before, now)."""
        if self._pack_tokens is None:
            with self._lock:
                if self._pack_tokens is None:
                    self._fetch(R.PACK_TOKENS)
                    self._members.node.update_fixed()
                    pt = map_file(self.path / R.PACK_TOKENS, *self._shapes[R.PACK_TOKENS], file=self.url + R.PACK_TOKENS)
                    self._pack_tokens = pt  # first: a shard checked from now on is checked against it (ensure_shard)
                    for k in np.flatnonzero(self._ready).tolist():
                        self._check_ready(k, pt)
        return self._pack_tokens

    def pack_members(self) -> np.ndarray:
        """int64 ``(P,)``: the shard holding every pack, from ``layout.member_packs`` (§9.4: checked with the rows)."""
        return np.repeat(np.arange(self.c.shape[0] - 1, dtype=np.int64), np.diff(self.c))

    def shard_of(self, packs: np.ndarray) -> np.ndarray:
        """int64: the shard of each pack id in ``[0, P)``."""
        return np.searchsorted(self.c, np.asarray(packs, dtype=np.int64), side="right") - 1

    # -- rows
    @contextmanager
    def held(self, packs):
        """The shards holding ``packs`` (ids outside ``[0, P)`` are left to the caller's range check) pinned, fetched
        and their rows checked while the block runs: what a reader plans a batch and reads it inside."""
        packs = np.asarray(packs, dtype=np.int64).reshape(-1)
        packs = packs[(packs >= 0) & (packs < self.manifest.num_packs)]
        shards = np.unique(self.shard_of(packs)).tolist()
        members = self._members
        members.pin(shards)
        try:
            members.ensure_all(shards)  # all resident (waiting for room holding none): their fetches readied their rows
            for k in shards:
                self.ensure_shard(k)
            yield
        finally:
            members.unpin(shards, None)

    def rows_bytes(self, k: int) -> int:
        """Bytes of shard ``k``'s rows of ``pack_offsets.bin`` and ``segments.bin`` (counted with member ``k``)."""
        p0, p1, d0, d1 = R.rows_of(k, self.c, self.d)
        return 8 * (p1 + 1 - p0) + 24 * (d1 - d0)

    def release_shard(self, k: int) -> None:
        """Member ``k`` leaves this process: its rows are not ready here any more (checked again when it returns)."""
        with self._locks[k % len(self._locks)]:
            self._ready[k] = False

    def punch_shard(self, k: int, exclusive) -> int:
        """The pages holding shard ``k``'s rows punched out of the sparse files; called only where no process holds
        member ``k`` (its pin locked exclusively by the caller). A page shared with other shards' rows (a shard's
        last pack offset is the next one's first; small shards share pages) goes only when none of them is held
        either: ``exclusive(shards)``, a context giving the set of those whose pins it could lock (none is fetched
        while they are locked). Bytes punched (0 where the file system cannot)."""
        done = 0
        for fname, starts, ends in ((F.PACK_OFFSETS, 8 * self.c[:-1], 8 * (self.c[1:] + 1)),
                                    (F.SEGMENTS, 24 * self.d[:-1], 24 * self.d[1:])):
            fd = self._fds.get(fname)
            a, b = int(starts[k]), int(ends[k])
            if fd is None or b <= a:
                continue
            lo, hi = a // _PAGE * _PAGE, -(-b // _PAGE) * _PAGE  # the pages shard k's rows touch

            def sharing(x: int) -> list:  # the shards other than k with rows on the page at byte x
                first = int(np.searchsorted(ends, x, side="right"))
                last = int(np.searchsorted(starts, x + _PAGE, side="left"))
                return [j for j in range(first, last) if j != k]

            edges = sorted(set(sharing(lo) + sharing(hi - _PAGE)))
            with exclusive(edges) as locked:
                start = lo if set(sharing(lo)) <= locked else lo + _PAGE
                end = hi if set(sharing(hi - _PAGE)) <= locked else hi - _PAGE
                done += punch_hole(fd, start, end)
        return done

    def ensure_shard(self, k: int, rows=None) -> None:
        """Shard ``k``'s rows checked in this process (see the module doc); called while member ``k`` is fetched or
        resident in this process (``StreamedMembers.fetch``, ``held``). ``rows``: ``read_rows(k)``'s, read by the
        caller beside the member's manifest (used when the file does not hold them). No lock is held while the
        rows are requested: a release of another shard of the same lock waits for no round trip."""
        if self._ready[k]:
            return
        p0, p1, d0, d1 = R.rows_of(k, self.c, self.d)
        lock = self._locks[k % len(self._locks)]
        with lock:
            if self._ready[k]:
                return
            if R.matches(k, self.pack_offsets[p0:p1 + 1], self.segments[d0:d1], self.digests):
                self._ready_now(k, self.pack_offsets[p0:p1 + 1], self.segments[d0:d1])
                return
        po, segs = rows if rows is not None else self.read_rows(k)  # (not in the file yet, or damaged there)
        with lock:
            if self._ready[k]:
                return
            self._ready_now(k, po, segs, write_at=(p0, d0))  # checked before it reaches the file

    def _ready_now(self, k: int, po: np.ndarray, segs: np.ndarray, write_at=None) -> None:
        """Shard ``k``'s rows ``po`` and ``segs`` checked, then (``write_at``: their first rows ``(p0, d0)``; else they
        are in the file) written into the sparse files, and ready (the caller holds its lock)."""
        pt = self._pack_tokens
        self._check(k, po, segs, pt)
        if write_at is not None:
            self._write_rows(k, po, segs, *write_at)
        self._ready[k] = True
        if pt is None and self._pack_tokens is not None:  # loaded meanwhile, maybe after it went over the ready ones
            self._check(k, po, segs, self._pack_tokens)

    def _check_ready(self, k: int, pack_tokens) -> None:
        """Shard ``k``'s rows, in the file and checked already, against ``pack_tokens`` (unless member ``k`` left
        meanwhile: its rows are checked again when it returns)."""
        with self._locks[k % len(self._locks)]:
            if not self._ready[k]:
                return
            p0, p1, d0, d1 = R.rows_of(k, self.c, self.d)
            self._check(k, self.pack_offsets[p0:p1 + 1], self.segments[d0:d1], pack_tokens)

    def _check(self, k: int, po: np.ndarray, segs: np.ndarray, pack_tokens) -> None:
        """``shard_rows.check_rows`` of shard ``k``'s rows ``po`` and ``segs`` (FormatError naming the bucket's file)."""
        R.check_rows(k, po, segs, self.c, self.d, self.digests, self.capacity, int(self._tokens_bound[k]), pack_tokens,
                     self.url)

    def rows_missing(self, k: int) -> bool:
        """Whether shard ``k``'s rows are neither ready here nor in the file (a fetch of member ``k`` requests them)."""
        if self._ready[k]:
            return False
        p0, p1, d0, d1 = R.rows_of(k, self.c, self.d)
        return not R.matches(k, self.pack_offsets[p0:p1 + 1], self.segments[d0:d1], self.digests)

    def read_rows(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Shard ``k``'s rows of ``pack_offsets.bin`` and ``segments.bin`` from the bucket (two ranged GETs at once),
        not checked yet (``ensure_shard`` checks them before they reach the file)."""
        p0, p1, d0, d1 = R.rows_of(k, self.c, self.d)
        so = self._members.fetcher.so
        po, segs = together([lambda: read_range(self.url + F.PACK_OFFSETS, 8 * p0, 8 * (p1 + 1), so),
                             lambda: read_range(self.url + F.SEGMENTS, 24 * d0, 24 * d1, so)])
        return (np.frombuffer(po, dtype=F.OFFSET_DTYPE),
                np.frombuffer(segs, dtype=F.OFFSET_DTYPE).reshape(-1, F.SEGMENT_COLUMNS))

    def _write_rows(self, k: int, po: np.ndarray, segs: np.ndarray, p0: int, d0: int) -> None:
        """Shard ``k``'s checked rows into the sparse files (counted in ``fetched_rows`` and ``downloads.log``)."""
        n = 0
        for fname, rows, at in ((F.PACK_OFFSETS, po, 8 * p0), (F.SEGMENTS, segs, 24 * d0)):
            data = memoryview(np.ascontiguousarray(rows)).cast("B")
            done = 0
            while done < len(data):
                done += os.pwrite(self._fds[fname], data[done:], at + done)
            n += len(data)
        with self._lock:
            self.fetched_rows += n
        f = self._members.fetcher
        log_download(f.root, {"url": self.url, "bytes": n, "pid": os.getpid(), "why": f"rows of shard {k}"})

    def pack_segments(self, p: int) -> np.ndarray:
        """A copy of pack ``p``'s segment rows (a view could outlive the shard's rows in the cache)."""
        with self.held([p]):
            return np.array(super().pack_segments(p))

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def __getstate__(self) -> dict:
        raise TypeError(f"{self.url}: a streamed index is not pickled; PackedDataset(url, stream=True) re-opens it in "
                        "each DataLoader worker")
