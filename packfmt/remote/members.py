"""A remote collection's members fetched as reads need them: lazy, verified, bounded per node (README "Remote data").

``streamed.open_streamed`` opens the collection (its manifest and member table; each pack index is fetched,
verified, when ``pack_index`` first opens it: ``pack_mirror``) with a ``StreamedMembers`` (this module): which
members this process holds mapped. A member is brought onto the node's disk when a batch (or the prefetcher,
``plan``) first needs it (``member_fetch``: its manifest checked against the collection's record, then its files and
index rows requested together, each verified), checked as the collection's reader checks a member (C2, C3, the
store's offsets) and mapped into its span of three address-space reservations (tokens, loss mask, doc offsets) laid
out as ``collection.vmap`` lays out every member end to end: the torch kernels read the same arrays and document
table (``_kernels.doc_span``) as for a collection on disk, and only the members a batch touches are mapped. A member
with images keeps its ``Store`` open while held here (image arrays checked, V14, V15, V19): ``images(m)``.

Bound: every process of a node that reads the collection shares one budget, ``cache_limit`` bytes of the cache
folder (``node_cache``, ``storage.budget``): a member on the node's disk is counted once, however many ranks and
DataLoader workers read it, and bytes are reserved before its download starts. A process holds a member (its pin)
while it is mapped here; a member no process holds stays on disk until some process needs room. Making room, in
order: members on disk no process holds (the one this process's plan needs furthest ahead first: Belady, else least
recently used on the node), then this process's own members that no batch in flight holds, furthest next use first.
Each process keeps what it holds idle within its share of the budget, ``(limit - fixed) / processes``, so one
process's prefetch can never starve another's batch. A batch whose members alone do not fit waits for others to let
go, then fails with an error naming the limit to raise. Only one batch of the node at a time waits for room while it
holds part of its members (``ensure_all``): the readers never wait in a circle, each holding part of its batch.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager

import numpy as np

from ..collection.resident import ResidentMembers
from ..collection.vmap import Reserved, batch_segments
from ..errors import FormatError
from ..reader import Store
from ..storage import uri
from ..storage.cache import Fetcher
from ..storage.errors import storage_errors
from ..storage.inherited import close_in_child
from ..storage.transport import remote
from .eviction import Holdings, resident_bound
from .member_fetch import fetch_member, member_manifest
from .mirror import mirror_collection_files
from .node_cache import NodeCache
from .pack_mirror import mirror_pack, refuse_materialized
from .plan import grow
from .room import WAIT_ENV, WAIT_S, Room, _NoRoom

__all__ = ["StreamedMembers", "WAIT_ENV"]

#: Checked manifests a process keeps of members a prefetch found no room for (their next try requests nothing).
KEPT_MANIFESTS = 256
#: Seconds a batch waits for room while it holds the members it took already, before it asks for the node's turn to
#: go on waiting (``ensure_all``).
PATIENCE_S = 1.0


class StreamedMembers(Holdings, Room, ResidentMembers):
    """Which members of a collection this process holds mapped; fetches, pins and lets go of them (thread-safe)."""

    def __init__(self, coll, url: str, fetcher: Fetcher, limit: int | None, packs: dict[str, bytes]) -> None:
        self.coll, self.url, self.fetcher, self.limit = coll, url, fetcher, limit
        self.pid = os.getpid()  # a forked DataLoader worker opens its own (``PackedDataset._views``)
        self.most = resident_bound()
        self.spans = Reserved(coll)  # every member's spans, nothing mapped
        self.doc_offsets, self.doc_base = self.spans.doc_offsets, self.spans.doc_base
        self.digests = coll.members.digests  # C3, recorded: checked before a member's files are requested
        self.cond = threading.Condition(threading.RLock())  # batches wait on it (members fetched, pins freed)
        self.work = threading.Condition(self.cond._lock)  # prefetch threads wait on it (same lock): woken one at a time
        self.resident: dict[int, int] = {}  # member -> the descriptor of its pin (held while mapped here)
        self.stores: dict[int, object] = {}  # resident member with images -> its Store (image files mapped)
        self.fetching: set[int] = set()  # members this process is bringing in
        self.pinned: dict[int, int] = {}  # member -> batches in flight holding it
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
        self.waits = 0  # batches' members that were not here when needed (a demand fetch, or one in flight)
        self.moves = 0  # batches done here: a prefetch that found no room tries again after one (or after a second)
        self.manifests: OrderedDict[int, tuple] = OrderedDict()  # checked manifests (and rows read) of members absent
        self.wait_s = float(os.environ.get(WAIT_ENV) or WAIT_S)
        self.node = NodeCache(self)
        close_in_child(self)  # a forked worker holds none of this process's pins

    def member_url(self, m: int) -> str:
        return uri.member_url(self.url, self.coll.members[m].path, file=f"{self.url}/manifest.json",
                              field=f"members[{m}].path")

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
                fs, rpath = remote(self.url, f.so)
                mirror_collection_files(f, fs, rpath, self.url, self.coll.path, {name: entry})
        self.node.update_fixed()

    def mirror_pack(self, name: str) -> None:
        """Pack index ``name`` fetched into the mirror and verified (once per process; the cache's markers make a
        second process's pass a stat per file)."""
        with self.pack_lock:
            if name in self.mirrored:
                return
            f = self.fetcher
            refuse_materialized(self.url, name, self.packs[name])
            with storage_errors(self.url, f.so, f.root):
                fs, rpath = remote(self.url, f.so)
                mirror_pack(f, fs, rpath, self.url, self.coll.path, name, self.packs[name])
            self.mirrored.add(name)
        self.node.update_fixed()

    # -- what the kernels read
    def source(self):
        return self.spans.source(self)

    # -- in-flight batches
    @contextmanager
    def hold(self, packs: np.ndarray, pack_offsets: np.ndarray, segments: np.ndarray, label: str = "segments.bin"):
        """The members packs ``packs`` (valid ids) touch local, mapped and held while the block runs, and their
        segments checked against the real document lengths (V27; at open only their members' sizes bound them:
        ``StreamedCollection.segment_bounds``)."""
        rows, seg = batch_segments(packs, pack_offsets, segments)
        member = self.coll.member_of(seg[:, 0])
        members = [int(m) for m in np.unique(member)]
        self.pin(members)
        try:
            self.ensure_all(members)
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
        """The ``ImageStore`` of member ``m`` (one with images), local and held while the block runs. Inside ``hold``
        of a pack of ``m`` it is resident and pinned already; outside, this fetches it (the plan unmoved)."""
        self.pin([m])
        try:
            self.ensure(m)
            with self.cond:
                store = self.stores[m]
            yield store.images
        finally:
            self.unpin([m], None)

    def pin(self, members: list) -> None:
        """Hold ``members`` (not let go by this process) until ``unpin``."""
        with self.cond:
            for m in members:
                self.pinned[m] = self.pinned.get(m, 0) + 1

    def unpin(self, members: list, packs: np.ndarray | None) -> None:
        """Release ``members``; ``packs``: the batch just read, which moves the plan (None: a read outside the plan).
        A member the plan does not need again is let go at once: it stays on the node's disk for the other ranks and the
        next epoch (without a cache_limit, for good: the cache then keeps the dataset, as a whole read does)."""
        with self.cond:
            for m in members:
                self.pinned[m] -= 1
                if not self.pinned[m]:
                    del self.pinned[m]
            if self.plan is not None and packs is not None and not self.plan.advance(packs):
                self.plan = None  # least recently used from here
            done = []
            if self.plan is not None:
                idle = np.array([m for m in members if m not in self.pinned and m in self.resident], dtype=np.int64)
                done = idle[self.plan.next_use(idle) == np.iinfo(np.int64).max].tolist()
                for m in done:
                    self.let_go(m)
            self.trim()
            self.moves += 1
            self.cond.notify_all()
            self.work.notify()  # (one prefetch thread tries; if it fetches, the next is woken: ``_bring``)
        self.announce(wait=False)  # (outside cond: the ledger's lock comes first)

    def ensure(self, m: int) -> None:
        """Member ``m`` fetched (if absent) and mapped; waits for a fetch in flight in another thread."""
        self._ensure(m, None)

    def ensure_all(self, members: list) -> None:
        """``members`` (one batch's, pinned by the caller) fetched if absent and mapped, all of them.

        Taken one by one, a batch that waits for room holds those it took; if the readers of a node could all do so,
        each could hold part of its batch and wait for room that the others hold, none ever going on (4 DataLoader
        workers of a node with room for 8 shards did, each batch needing up to 4). So a batch waits so for
        ``PATIENCE_S`` only; then it takes the node's turn (``NodeCache.turn``) and waits on, holding them. When
        another batch has the turn, it lets go of the members only it holds here (they stay on the disk, where a
        process that needs room may delete them), waits for the turn holding none of them, and begins again. Until
        ``$PACKFMT_CACHE_WAIT``, then the ``StorageError`` naming the limit."""
        deadline = time.monotonic() + self.wait_s
        turn = None
        try:
            while True:
                try:
                    for m in members:
                        self._ensure(m, None if turn is not None else PATIENCE_S)
                    return
                except _NoRoom as no:
                    turn = self.node.turn(None)
                    if turn is not None:
                        continue  # (what the batch holds is kept: it waits on with the turn)
                    with self.cond:
                        for m in members:
                            if m in self.resident and self.pinned.get(m) == 1:  # (one an outer batch holds stays)
                                self.let_go(m)
                    turn = self.node.turn(deadline)
                    if turn is None:
                        raise self._no_room(no.member, no.need) from None
        finally:
            if turn is not None:
                os.close(turn)

    def _ensure(self, m: int, patience: float | None) -> None:
        with self.cond:
            if m not in self.resident:
                self.waits += 1
                grow(self)  # a batch waits: one more member in flight from now on (up to the plan's most)
            while m in self.fetching:
                self.cond.wait()
            self.clock += 1
            self.last_use[m] = self.clock
            if m in self.resident:
                return
            self.failed.pop(m, None)
        self.fetch(m, before=None, patience=patience)

    def fetch(self, m: int, before: int | None, patience: float | None = None) -> bool:
        """Member ``m`` onto the node's disk (if absent), checked and mapped here. ``before``: a prefetch for plan
        position ``before``, which makes room only from members next used later than that and gives up (False) when
        they do not make it. ``patience``: seconds a batch's fetch waits for room, then ``_NoRoom`` (None: until
        ``$PACKFMT_CACHE_WAIT``, then the ``StorageError``)."""
        with self.cond:
            while before is None and m in self.fetching:  # the prefetcher took it meanwhile: wait for its end
                self.cond.wait()
            if m in self.resident or m in self.fetching:
                return True
            self.fetching.add(m)
        try:
            done = self._bring(m, before, patience)
        except BaseException as exc:
            with self.cond:
                self.fetching.discard(m)
                if not isinstance(exc, _NoRoom):  # (not a failure of the member: the prefetch may still fetch it)
                    self.failed[m] = exc
                self.cond.notify_all()
            raise
        with self.cond:
            self.fetching.discard(m)
            self.cond.notify_all()
        return done

    def _bring(self, m: int, before: int | None, patience: float | None = None) -> bool:
        """``fetch``'s work: held (pinned, counted), on disk, checked, mapped; False when a prefetch gave up.

        Room is reserved first, for what the collection's record says the member takes (``NodeCache.estimate``), so
        that only the process that will fetch it requests its manifest (with its rows: ``member_manifest``); the
        reservation is then made exact from the checked manifest (more room for image files, which the record does
        not count: or begin again with the exact size)."""
        local = self.node.mirror_dir(m)
        known = None  # (raw, files, rows): the member's checked manifest, its files, its rows read with it
        deadline = time.monotonic() + self.wait_s
        give_up = None if patience is None else time.monotonic() + patience
        while True:
            got = self._hold_room(m, known, before, deadline, give_up)
            if before is not None and got is not None and (not got[1] or known is not None or not self.coll.num_images):
                self._settled(m)  # (with images the record's estimate is short: settled once made exact, below)
            if got is None:  # a prefetch never waits for room; it keeps what it read for its next try
                if known is not None:  # (``plan._run``: after a batch or a second)
                    self._keep_manifest(m, known)
                return False
            fd, reserved = got
            try:
                if known is None:
                    known = member_manifest(self, m, local)  # C3 first: nothing it lists is requested before
                if reserved and not self._resize(m, known, reserved):
                    self._unreserve(m, fd, reserved)  # (nothing of it fetched yet)
                    continue
                if before is not None:
                    self._settled(m)
                raw, files, rows = known
                fetch_member(self, m, local, raw, files, rows)  # (a member on disk: a stat per file)
                store = Store(local)  # its offsets checked (V13)
                self.coll._check_member(m, store)  # C2, C3: the member the collection recorded
                self.spans.map_member(m, local)
            except BaseException:
                self.spans.unmap_member(m)  # nothing half-mapped stays
                for index in self.sharded:  # its rows, readied by the fetch, leave with it: deleted below (their pages
                    index.release_shard(m)  # punched), they are checked (and fetched) again when it comes back
                self._unreserve(m, fd, reserved)
                raise
            break
        with self.node.budget.transaction() as tx:
            tx.commit(m, self.node.measured(m))
        with self.cond:
            self.resident[m] = fd
            if store.num_images:
                self.stores[m] = store
        return True

    def _settled(self, m: int) -> None:
        """A prefetch's room for member ``m`` is reserved for good: the next prefetch thread may claim past it
        (``plan._step``: members are given room in the plan's order, so a later one never takes an earlier one's)."""
        with self.cond:
            if m in self.claimed:
                self.claimed.discard(m)
                self.work.notify()

    def _keep_manifest(self, m: int, known: tuple) -> None:
        with self.cond:
            self.manifests[m] = known
            self.manifests.move_to_end(m)
            while len(self.manifests) > KEPT_MANIFESTS:
                self.manifests.popitem(last=False)

    def close(self, _close=os.close) -> None:  # _close: still bound at interpreter shutdown
        """Let go of every member held here (their pins) and of the node's ledger; the members stay on the disk."""
        for fd in list(getattr(self, "resident", {}).values()):
            try:
                _close(fd)
            except OSError:
                pass
        self.resident = {}
        node = getattr(self, "node", None)
        if node is not None:
            node.budget.close()

    def drop_inherited(self) -> None:
        """In a forked child: close the copies of this process's pins (``storage.inherited``); the child's reads open
        their own members object."""
        for fd in list(self.resident.values()):
            os.close(fd)
        self.resident = {}

    def __del__(self) -> None:
        if getattr(self, "pid", None) == os.getpid():  # (a forked child's copy closes nothing of its parent's)
            self.close()

    def resident_bytes(self) -> int:
        """Bytes on the node's disk of the members this process holds (as the node's ledger counts them)."""
        with self.cond:
            held = list(self.resident)
        return int(self.node.budget.nbytes[held].sum()) if held else 0
