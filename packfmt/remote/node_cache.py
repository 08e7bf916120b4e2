"""The node's copy of a streamed collection: which members are on the node's disk, counted once against
``cache_limit`` for every process of the node (``storage.budget``), and what coming onto and leaving the disk does
to a member's files (README "Remote data", "The bound"; spec/SECURITY.md A16).

What the bound covers, in allocated blocks (``storage.budget.disk_bytes``: a 100-byte marker takes a 4 KiB block):

- ``fixed``: the collection's own files in the mirror (its manifest, member table, pack indexes fetched whole, a
  layout's digests and pack lengths), their bookkeeping, the ledger, the folders above the members, and room for
  ``downloads.log`` and its one rotated copy (``storage.cache.LOG_CAP`` each);
- every member on disk or being fetched: its files and manifest, a marker per file, its two folders (mirror and
  bookkeeping), and its rows of each layout index read shard by shard (pages, with the two it may share);
- reserved before the first byte of a member is written (``reserve``), so downloads in flight are inside the bound.

One batch of the node at a time may wait for room while it holds part of its members: the one with the node's *turn*
(``turn``, a lock on a file beside the ledger); another that must wait lets go of what it took first and waits for
the turn (``members.StreamedMembers.ensure_all``), so the readers never wait for each other in a circle.

A member on disk that no process holds (its pin free) may be deleted by any process that needs room, whole: files,
manifest, markers, lock files, pin and folders, and its rows punched out of the sparse index files. Deleting happens
inside a ledger transaction, and pins are only taken inside one, so no process can pin a member while another
deletes it. A member left on disk by an earlier process is adopted when the ledger is made (``adopt``), counted and
deleted first when room is needed (no process holds it).
"""

from __future__ import annotations

import fcntl
import os
import posixpath
import time
from pathlib import Path

import numpy as np
import xxhash

from ..storage import verify as V
from ..storage.budget import PRESENT, Budget, disk_bytes
from ..storage.cache import LOG_CAP
from ..storage.errors import StorageError, evicting

__all__ = ["NodeCache", "PAGE"]

PAGE = 4096
_ROWS_FILES = ("pack_offsets.bin", "segments.bin")  # a layout index's sparse rows: counted with their members


def _up(n: int) -> int:
    return -(-int(n) // PAGE) * PAGE


class NodeCache:
    """The node's ledger for the streamed collection ``members.coll`` and the member files it counts."""

    def __init__(self, members) -> None:
        self.members = members
        coll, f = members.coll, members.fetcher
        self.root = f.root
        rest = members.url.partition("://")[2].rstrip("/")
        key = f.mirror(members.url).relative_to(self.root).parts[0]
        # every member's mirror folder, as the bucket lays it out (uri.member_url's rule, without a URL a member)
        self.dirs = [str(self.root / key / posixpath.normpath(posixpath.join(rest, p))) for p in coll.members.paths]
        digest = xxhash.xxh3_64_hexdigest(coll.manifest_bytes)
        self.budget = Budget(V.state_dir(self.root, coll.path) / f".packfmt-budget-{digest}", len(self.dirs),
                             members.limit)
        self.turn_path = self.budget.path.with_name(self.budget.path.name + ".turn")
        self.turn_path.touch()  # (before ``update_fixed``: counted with the ledger)
        with self.budget.transaction() as tx:
            if self.budget.fresh:
                self.adopt(tx)
            else:
                self.reclaim(tx)  # what dead processes were fetching (one may have held the slot this one took)
        self.update_fixed()

    # -- where a member lives
    def mirror_dir(self, m: int) -> Path:
        return Path(self.dirs[m])

    def state_dir(self, m: int) -> Path:
        return V.state_dir(self.root, Path(self.dirs[m]))

    # -- sizes
    def footprint(self, m: int, files: dict, manifest_bytes: int) -> int:
        """Bytes member ``m`` will take on disk with ``files`` (name -> ``FileEntry``): rounded up to pages, a marker
        and a lock file a file, its two folders, and its rows of each index read shard by shard."""
        return (sum(_up(e.bytes) for e in files.values()) + _up(manifest_bytes) + PAGE * (len(files) + 2)
                + self.rows(m))

    def estimate(self, m: int) -> int:
        """Bytes member ``m`` would take on disk, from the collection's record alone (no request): its tokens, loss
        mask (when the collection has one) and document offsets, one page for its manifest, and the pages
        ``footprint`` counts beside (the same sum for a member without images: a fetch reserves this before its
        manifest is read, and makes it exact after), and its rows. Image files are not in the record: not counted."""
        coll = self.members.coll
        tokens, docs = int(coll.members.tokens[m]), int(coll.members.documents[m])
        files = [tokens * np.dtype(coll.np_token_dtype).itemsize, 8 * (docs + 1)]
        if coll.has_loss_mask:
            files.append(tokens)
        return sum(_up(n) for n in files) + PAGE + PAGE * (len(files) + 2) + self.rows(m)

    def rows(self, m: int) -> int:
        """Pages of member ``m``'s rows of each open layout index (two files each; two pages more for the pages its
        rows share with its neighbours')."""
        return sum(_up(index.rows_bytes(m)) + 4 * PAGE for index in self.members.sharded)

    def measured(self, m: int) -> int:
        """Bytes member ``m`` takes on disk now (its folders and what they hold), with its rows."""
        return self._folder_bytes(self.mirror_dir(m)) + self._folder_bytes(self.state_dir(m)) + self.rows(m)

    @staticmethod
    def _folder_bytes(d: Path) -> int:
        try:
            names = os.listdir(d)
        except OSError:
            return 0
        return disk_bytes([d, *(d / n for n in names)])

    def update_fixed(self) -> None:
        """Count the collection's own files now on disk (after its open, and after a pack index is opened); refuse a
        limit that cannot hold them."""
        fixed = self._fixed_bytes()
        with self.budget.transaction() as tx:
            tx.fixed = max(tx.fixed, fixed)
            limit = self.budget.limit
            if limit is not None and tx.fixed > limit:
                raise StorageError(f"{self.members.url}: cache_limit={limit:,} bytes cannot hold the collection's own "
                                   f"files ({tx.fixed:,} bytes: manifests, member table, pack index, logs), let alone "
                                   "a member: raise cache_limit= / $PACKFMT_CACHE_LIMIT", field="cache_limit",
                                   expected=f">= {tx.fixed:,}", found=limit)

    def _fixed_bytes(self) -> int:
        """The blocks of the collection's folders (mirror and bookkeeping) but the members' own folders and the
        sparse rows (counted with the members), of the folders above them up to the cache's root, and room for the
        download log."""
        coll = self.members.coll.path
        skip = set(self.dirs)
        skip.update(str(V.state_dir(self.root, Path(d))) for d in self.dirs)
        total, seen = 2 * LOG_CAP + disk_bytes([self.root]), set()
        for top in (coll, V.state_dir(self.root, coll)):
            for dirpath, dirnames, filenames in os.walk(top):
                dirnames[:] = [d for d in dirnames if os.path.join(dirpath, d) not in skip]
                rows = os.path.basename(dirpath).startswith(".rows-")
                total += disk_bytes([dirpath, *(os.path.join(dirpath, n) for n in filenames
                                                if not (rows and n in _ROWS_FILES))])
                seen.add(dirpath)
        for d in {str(Path(d).parent) for d in self.dirs} | {str(coll)}:  # the folders above, mirror and state side
            for side in (Path(d), V.state_dir(self.root, Path(d))):
                for a in (side, *side.parents):
                    if str(a) in seen or not str(a).startswith(str(self.root)) or a == self.root:
                        continue
                    seen.add(str(a))
                    total += disk_bytes([a])
        return total

    # -- the node's turn to wait for room holding part of a batch
    def turn(self, until: float | None) -> int | None:
        """The node's turn (an exclusive ``flock``, its descriptor: close it to give the turn back), or None when
        another process or thread has it: at once (``until`` None), or still at ``time.monotonic()`` ``until``."""
        fd = os.open(self.turn_path, os.O_RDWR | os.O_CREAT, 0o644)  # (one a call: threads exclude each other too)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                if until is None or time.monotonic() > until:
                    os.close(fd)
                    return None
                time.sleep(0.02)

    # -- pins (taken and let go inside a transaction only)
    def take_pin(self, m: int) -> int:
        """A shared lock on member ``m``'s pin (its descriptor): no process deletes it while this is held. Called
        inside a ledger transaction (deletions happen inside one too, so the pin file is never deleted under it)."""
        state = V.ensure_dir(self.state_dir(m))
        fd = os.open(state / V.PIN, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_SH)
        return fd

    def _lock_free(self, m: int) -> int | None:
        """An exclusive lock on member ``m``'s pin when no process holds it (this one included): its descriptor, or
        -1 when it has no pin (no process ever pinned it since it last left the disk: nothing to lock); else None."""
        try:
            fd = os.open(self.state_dir(m) / V.PIN, os.O_RDWR)
        except FileNotFoundError:
            return -1
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return fd

    def exclusive(self, members: list):
        """For ``shard_index.punch_shard``: exclusive locks on the pins of ``members`` no process holds (a context
        yielding the set of those locked)."""
        return _Exclusive(self, members)

    # -- leaving the disk
    def delete(self, tx, m: int) -> bool:
        """Member ``m`` deleted from the disk when no process holds it (True), its count dropped; else False."""
        fd = self._lock_free(m)
        if fd is None:
            return False
        try:
            with evicting(self.root):  # a cache turned read-only: one StorageError naming it
                for index in self.members.sharded:
                    index.punch_shard(m, self.exclusive)
                for d in (self.mirror_dir(m), self.state_dir(m)):
                    _remove_files(d)
        finally:
            if fd >= 0:
                os.close(fd)
        try:
            os.rmdir(self.state_dir(m))  # (after the pin's lock is let go; a non-empty folder stays)
        except OSError:
            pass
        tx.drop(m)
        return True

    def make_room(self, tx, need: int, order) -> bool:
        """Delete members no process holds, in ``order`` (ids, first deleted first), until ``need`` bytes fit."""
        room = tx.room()
        if room is None or room >= need:
            return True
        for m in order:
            if tx.state(m) == PRESENT and self.delete(tx, int(m)):
                room = tx.room()
                if room >= need:
                    return True
        return False

    def reclaim(self, tx) -> None:
        """Give back the reservations of dead processes, and delete what they left half-fetched."""
        for m in tx.reclaim():
            fd = self._lock_free(m)
            if fd is not None:
                try:
                    for d in (self.mirror_dir(m), self.state_dir(m)):
                        _remove_files(d)
                finally:
                    if fd >= 0:
                        os.close(fd)

    def adopt(self, tx) -> None:
        """A new ledger: every member some earlier process left on the disk counted as it is (no process holds it,
        so it is deleted first when room is needed)."""
        for m, d in enumerate(self.dirs):
            if os.path.isdir(d) or os.path.isdir(self.state_dir(m)):
                tx.reserve(m, 0)
                tx.commit(m, self.measured(m))


class _Exclusive:
    def __init__(self, cache: NodeCache, members: list) -> None:
        self.cache, self.members, self.fds = cache, members, []

    def __enter__(self) -> set:
        got = set()
        for j in self.members:
            fd = self.cache._lock_free(j)
            if fd is not None:
                if fd >= 0:
                    self.fds.append(fd)
                got.add(j)
        return got

    def __exit__(self, *exc) -> None:
        for fd in self.fds:
            os.close(fd)


def _remove_files(d: Path) -> None:
    """Every file directly in folder ``d`` removed (a member's; a folder inside, another member's, stays), then the
    folder if empty. Markers first: a file without its marker is never served."""
    try:
        names = os.listdir(d)
    except OSError:
        return
    for n in sorted(names, key=lambda n: not n.endswith(".verified")):
        p = d / n
        if n != V.PIN and not p.is_dir():
            p.unlink(missing_ok=True)
    if V.PIN in names:
        (d / V.PIN).unlink(missing_ok=True)
    try:
        os.rmdir(d)
    except OSError:
        pass
