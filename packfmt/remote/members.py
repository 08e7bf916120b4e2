"""A remote collection's members fetched as reads need them: lazy, verified, bounded (README "Remote data").

``streamed.open_streamed`` opens the collection (its manifest and member table; each pack index is fetched,
verified, when ``pack_index`` first opens it: ``pack_mirror``) with a ``StreamedMembers`` (this module). A member's
files are fetched when a batch first needs them, through the cache's own path (``mirror.mirror_dataset``, then
``storage.cache.Fetcher.file``: hashed while they stream, checked against the member's manifest, stat-bound markers,
a file lock per file, one line of ``downloads.log`` each), then the member is checked as the collection's reader
checks it (C2, C3, the store's offsets) and mapped into its span of three address-space reservations (tokens, loss
mask, doc offsets) laid out as ``collection.vmap`` lays out every member end to end: the torch kernels read the same
arrays and document table (``_kernels.doc_span``) as for a collection on disk, and only the members a batch touches
are mapped (the rest is ``PROT_NONE``). A member with images is fetched the same way, its image files with the rest;
while it is resident its ``Store`` stays open (image arrays checked, V14, V15, V19), and ``images(m)`` hands out its
``ImageStore``, which ``packfmt.torch._sources._ImageIndex`` reads while the batch holds the member.

Bound: ``cache_limit`` bytes hold this process's resident member files, and each one's rows of a layout's index
read shard by shard (``shard_index``: they are checked, kept and punched out with it); the collection manifest
and pack indexes fetched whole are not counted. Which member leaves to make room is ``eviction``'s (Belady from the
``plan``, least recently used without one), never one pinned by a batch in flight. A batch whose members alone
exceed the limit is an error naming the limit to raise.
"""

from __future__ import annotations

import json
import os
import threading
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from .. import format as F
from ..collection.resident import ResidentMembers
from ..collection.vmap import Reserved, batch_segments
from ..errors import FormatError
from ..reader import Store
from ..storage import uri
from ..storage.cache import Fetcher
from ..storage.errors import StorageError, storage_errors
from .eviction import Eviction, forget_unless_held, resident_bound
from .mirror import mirror_collection_files, mirror_dataset
from .pack_mirror import mirror_pack, refuse_materialized

__all__ = ["StreamedMembers"]


class StreamedMembers(Eviction, ResidentMembers):
    """Which members of a collection are local and mapped; fetches, pins and evicts them (thread-safe)."""

    def __init__(self, coll, url: str, fetcher: Fetcher, limit: int | None, packs: dict[str, bytes]) -> None:
        self.coll, self.url, self.fetcher, self.limit = coll, url, fetcher, limit
        self.pid = os.getpid()  # a forked DataLoader worker opens its own (``PackedDataset._views``)
        self.most = resident_bound()
        self.spans = Reserved(coll)  # every member's spans, nothing mapped
        self.doc_offsets, self.doc_base = self.spans.doc_offsets, self.spans.doc_base
        self.cond = threading.Condition()
        self.resident: dict[int, tuple[int, list, object]] = {}  # member -> (bytes, files, pin)
        self.stores: dict[int, object] = {}  # resident member with images -> its Store (image files mapped)
        self.fetching: dict[int, int] = {}  # member -> bytes reserved
        self.pinned: dict[int, int] = {}  # member -> batches in flight holding it
        self.used = 0  # bytes resident or reserved
        self.last_use: dict[int, int] = {}
        self.clock = 0
        self.plan = None  # plan.Plan: next use of each member
        self.failed: dict[int, BaseException] = {}
        self.packs = packs  # pack index name -> its index.json in the bucket (listed by open_streamed)
        self.mirrored: set[str] = set()  # those fetched and verified by this process
        self.pack_lock = threading.Lock()  # not ``cond``: batches go on while an index is fetched
        self.sharded: list = []  # indexes read shard by shard (``shard_index``): member k's fetch readies shard k
        self.prefetchers: list = []  # the threads fetching ahead of the plan (``plan.start``)
        self.claimed: set[int] = set()  # members a prefetch thread is fetching (from before their manifest is read)

    def fetch_own(self, name: str) -> None:
        """The collection's own file ``name`` (listed in its ``files``) fetched into the mirror and verified, as the
        open fetches the member table (``mirror.mirror_collection_files``: a ``doc_lengths.bin`` missing from the
        bucket is left out, and the lengths then come from the members)."""
        entry = self.coll.manifest.files.get(name)
        if entry is None:
            return
        with self.pack_lock:
            f = self.fetcher
            with storage_errors(self.url, f.so, f.root):
                fs, rpath = uri.filesystem(self.url, f.so)
                mirror_collection_files(f, fs, rpath, self.url, self.coll.path, {name: entry})

    def mirror_pack(self, name: str) -> None:
        """Pack index ``name`` fetched into the mirror and verified (once per process; the cache's markers make a
        second process's pass a stat per file)."""
        with self.pack_lock:
            if name in self.mirrored:
                return
            f = self.fetcher
            refuse_materialized(self.url, name, self.packs[name])
            with storage_errors(self.url, f.so, f.root):
                fs, rpath = uri.filesystem(self.url, f.so)
                mirror_pack(f, fs, rpath, self.url, self.coll.path, name, self.packs[name])
            self.mirrored.add(name)

    # -- what the kernels read
    def source(self):
        return self.spans.source(self)

    # -- in-flight batches
    @contextmanager
    def hold(self, packs: np.ndarray, pack_offsets: np.ndarray, segments: np.ndarray, label: str = "segments.bin"):
        """The members packs ``packs`` (valid ids) touch local, mapped and not evicted while the block runs, and
        their segments checked against the real document lengths (V27; at open only their members' sizes bound
        them: ``StreamedCollection.segment_bounds``)."""
        rows, seg = batch_segments(packs, pack_offsets, segments)
        member = self.coll.member_of(seg[:, 0])
        members = [int(m) for m in np.unique(member)]
        self.pin(members)
        try:
            for m in members:
                self.ensure(m)
            if seg.shape[0]:
                i = self.doc_base[member] + seg[:, 0] - np.asarray(self.coll.doc_start)[member]
                length = self.doc_offsets[i + 1] - self.doc_offsets[i]
                bad = np.flatnonzero(seg[:, 2] > length)
                if bad.size:
                    k = int(rows[bad[0]])
                    raise FormatError(f"{label}: [{k}]: expected 0 <= begin < end <= length of document "
                                      f"{int(seg[bad[0], 0])} ({int(length[bad[0]])}), found [{int(seg[bad[0], 1])}, "
                                      f"{int(seg[bad[0], 2])}) (V27: segment beyond its document)", file=label,
                                      field=f"[{k}]", expected=f"end <= {int(length[bad[0]])}",
                                      found=int(seg[bad[0], 2]))
            yield
        finally:
            self.unpin(members, packs)

    @contextmanager
    def images(self, m: int):
        """The ``ImageStore`` of member ``m`` (one with images), local and not evicted while the block runs. Inside
        ``hold`` of a pack of ``m`` it is resident and pinned already; outside, this fetches it (the plan unmoved)."""
        self.pin([m])
        try:
            self.ensure(m)
            with self.cond:
                store = self.stores[m]
            yield store.images
        finally:
            self.unpin([m], None)

    def pin(self, members: list) -> None:
        """Hold ``members`` (not evicted) until ``unpin``."""
        with self.cond:
            for m in members:
                self.pinned[m] = self.pinned.get(m, 0) + 1

    def unpin(self, members: list, packs: np.ndarray | None) -> None:
        """Release ``members``; ``packs``: the batch just read, which moves the plan (None: a read outside the plan)."""
        with self.cond:
            for m in members:
                self.pinned[m] -= 1
                if not self.pinned[m]:
                    del self.pinned[m]
            if self.plan is not None and packs is not None and not self.plan.advance(packs):
                self.plan = None  # least recently used from here
            self.cond.notify_all()

    def ensure(self, m: int) -> None:
        """Member ``m`` fetched (if absent) and mapped; waits for a fetch in flight in another thread."""
        with self.cond:
            while m in self.fetching:
                self.cond.wait()
            self.clock += 1
            self.last_use[m] = self.clock
            if m in self.resident:
                return
            self.failed.pop(m, None)
        self.fetch(m, before=None)

    def fetch(self, m: int, before: int | None) -> bool:
        """Fetch, check and map member ``m``. ``before``: a prefetch for plan position ``before``, which evicts only
        members next used later than that and gives up (False) when they do not make room."""
        murl = self._member_url(m)
        f = self.fetcher
        with storage_errors(murl, f.so, f.root):
            fs, rpath = uri.filesystem(murl, f.so)
            raw = f.manifest(fs, f"{rpath}/{F.MANIFEST}", murl)  # read once: what is reserved is what is fetched
            files = F.parse_manifest(json.loads(raw), file=f"{murl}/{F.MANIFEST}").files
        # its files, and its rows of each index read shard by shard (``shard_index``: they leave with it)
        size = sum(e.bytes for e in files.values()) + sum(index.rows_bytes(m) for index in self.sharded)
        with self.cond:
            while before is None and m in self.fetching:  # the prefetcher took it meanwhile: wait for its end
                self.cond.wait()
            if m in self.resident or m in self.fetching:
                return True
            if not self._make_room(size, before):
                if before is not None:
                    return False
                if len(self.resident) + len(self.fetching) >= self.most:
                    raise StorageError(f"{self.url}: a batch touches more than {self.most:,} members, the most one "
                                       "process holds at once (lazy_members.MAX_MAPPED, and a quarter of its limit on "
                                       "open files, `ulimit -n`: each resident member holds its pin open): read "
                                       "smaller batches, or raise `ulimit -n`")
                raise StorageError(f"{self.url}: cache_limit={self.limit:,} bytes cannot hold the members one batch "
                                   f"needs (member {m} of {size:,} bytes, {self.used:,} bytes held by the batches in "
                                   "flight): raise cache_limit= / $PACKFMT_CACHE_LIMIT, or use smaller batches")
            self.fetching[m] = size
            self.used += size
            self.cond.notify_all()  # (a prefetch thread waits for another's reservation before fetching past it)
        try:
            local, pin, store = self._fetch_files(m, murl, raw)
            self._map(m, local)
            for index in self.sharded:  # its rows too, while it is held here (a prefetch: ahead of the batch)
                index.ensure_shard(m)
        except BaseException as exc:
            try:  # nothing half-fetched stays mapped or on disk (outside the bound)
                self._unmap(m)
                forget_unless_held(f.root, f.mirror(murl), [f.mirror(murl) / name for name in files])
            except OSError:
                pass  # the original error is the one to report
            with self.cond:
                del self.fetching[m]
                self.used -= size
                self.failed[m] = exc
                self.cond.notify_all()
            raise
        with self.cond:
            del self.fetching[m]
            self.resident[m] = (size, [local / name for name in files], pin)
            if store.num_images:
                self.stores[m] = store
            self.cond.notify_all()
        return True

    def _fetch_files(self, m: int, murl: str, raw: bytes):
        """``(mirror folder, its pin, the member's Store)`` of member ``m``, every file verified and the member checked
        (a member with images: its image arrays too, V14, V15, V19)."""
        f = Fetcher(self.fetcher.so, self.fetcher.root, None, self.fetcher.mode)  # one per fetch: threads share none
        try:
            with storage_errors(murl, f.so, f.root):
                local = mirror_dataset(f, murl, packs=False, raw=raw)  # every file hashed while it streams, then the manifest
            store = Store(local)  # its offsets checked (V13)
            self.coll._check_member(m, store)  # C2, C3: the member the collection recorded
        except BaseException:
            for pin in f.result.pins:
                pin.close()
            raise
        return local, f.result.pins[0], store  # the member's own pin: other processes' eviction skips it while held

    def _map(self, m: int, local: Path) -> None:
        self.spans.map_member(m, local)

    def _unmap(self, m: int) -> None:
        self.spans.unmap_member(m)

    def _member_url(self, m: int) -> str:
        return uri.member_url(self.url, self.coll.members[m].path, file=f"{self.url}/{F.MANIFEST}",
                              field=f"members[{m}].path")

    def resident_bytes(self) -> int:
        with self.cond:
            return sum(v[0] for v in self.resident.values())
