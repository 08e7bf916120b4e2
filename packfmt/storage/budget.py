"""A node's cache budget for one dataset read item by item, shared by every process of the node (README "Remote data").

The processes of a node that stream one dataset (its ranks, their DataLoader workers) share the node's cache folder,
so they share one budget: ``cache_limit`` bytes of the folder, for the dataset's fixed files (manifests, pack
indexes, logs: ``fixed``), whatever else the folder held when the ledger was made (``other``), and its items (the
members of a collection, each with its bookkeeping and its rows of a layout's index). The ledger is one small file
that every process maps (``Budget``); every change to it is made inside ``transaction()``, under an exclusive
``flock`` of that file, so the count is the node's, not a process's (and under a thread lock: the threads of a
process share its descriptor, and a ``flock`` one of them takes or lets go of is every one's):

- an item may carry a *want* lease: some process reads it soon (the members of its plan's lookahead, renewed
  while it reads), so that room is made from items no process wants before those another process needs next;
- an item is ``ABSENT``, ``RESERVED`` (a process is fetching it: its bytes counted before the first byte is
  written, so an in-flight download is inside the bound) or ``PRESENT`` (on disk, counted once however many
  processes read it);
- ``used`` = ``fixed + other + `` the bytes of every reserved or present item; a reservation that would pass
  ``limit`` must first make room (the caller evicts items no process holds, inside the same transaction);
- a reservation belongs to a process *slot*: a lock file the process holds for its lifetime. A slot whose lock is
  free belongs to a dead process, and its reservations are given back (``reclaim``), so a killed process never
  leaks budget; a slot is reused by the next process, which gives back the reservations it finds under its slot
  and did not make; the items a dead process left on disk stay ``PRESENT`` (adopted: any process may use them or
  evict them).

Nothing here knows what an item is: ``remote`` decides what to fetch and what to evict, and deletes the files.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from .inherited import close_in_child

__all__ = ["ABSENT", "RESERVED", "PRESENT", "Budget", "Transaction", "disk_bytes"]

ABSENT, RESERVED, PRESENT = 0, 1, 2
_MAGIC = b"PFBUDGT3"  # 2: each item's ``want`` lease; 3: and which processes hold it (``wanters``)
_HEADER = 64  # magic, items, fixed, other, clock (int64 each after the magic), padding
_SLOTS = 4096  # processes of one node reading one dataset at once, at most


#: The bit of ``wanters`` a slot's process sets when it leases an item: slot k < 63 its own (given back with
#: ``unwant``), every later slot the last one, shared (its leases only lapse: giving one back could end another's).
_SHARED_BIT = np.uint64(1 << 63)


def _bit(slot: int) -> np.uint64:
    return np.uint64(1 << slot) if slot < 63 else _SHARED_BIT


def disk_bytes(paths) -> int:
    """Bytes the file system allocated to ``paths`` (files or folders, not followed): ``st_blocks * 512`` each, what
    ``du`` counts and what the bound is about (a 100-byte marker takes a 4 KiB block)."""
    n = 0
    for p in paths:
        try:
            n += os.lstat(p).st_blocks * 512
        except OSError:
            pass
    return n


class Budget:
    """The ledger at ``path`` for ``items`` items under ``limit`` bytes (None: no bound, the counts still kept)."""

    def __init__(self, path: Path, items: int, limit: int | None) -> None:
        self.path, self.items, self.limit = Path(path), int(items), limit
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.pid = os.getpid()
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        size = _HEADER + self.items * (1 + 2 + 8 + 8 + 8 + 8)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        try:
            head = os.pread(self.fd, _HEADER, 0)
            self.fresh = (len(head) < 16 or head[:8] != _MAGIC
                          or int.from_bytes(head[8:16], "little") != self.items or os.fstat(self.fd).st_size != size)
            if self.fresh:  # new, or another dataset's: begin again (remote adopts what is on disk)
                os.ftruncate(self.fd, 0)
                os.ftruncate(self.fd, size)
                os.pwrite(self.fd, _MAGIC + self.items.to_bytes(8, "little"), 0)
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        mm = np.memmap(self.path, dtype=np.uint8, mode="r+", shape=(size,))
        n = self.items
        self._head = mm[:_HEADER].view(np.int64)  # [magic, items, fixed, other, clock, ...]
        at = _HEADER
        self.state = mm[at:at + n]
        at += n
        self.slot_of = mm[at:at + 2 * n].view(np.int16)
        at += 2 * n
        self.nbytes = mm[at:at + 8 * n].view(np.int64)
        at += 8 * n
        self.last = mm[at:at + 8 * n].view(np.int64)
        at += 8 * n
        self.want = mm[at:at + 8 * n].view(np.int64)  # CLOCK_MONOTONIC ns until which some process will read it
        at += 8 * n
        self.wanters = mm[at:at + 8 * n].view(np.uint64)  # the processes that leased it: one bit a slot (``_bit``)
        self._mm = mm
        self.slot, self._slot_fd = self._take_slot()
        self.mine: set[int] = set()  # items this object reserved and has not committed or dropped
        self._threads = threading.RLock()  # one transaction of this process at a time (``transaction``)
        self._depth = 0
        close_in_child(self)  # a forked child does not hold this process's slot
        self.bit = _bit(self.slot)
        if self.bit != _SHARED_BIT:  # a dead process's leases under this slot are not this one's
            with self.transaction():
                self.wanters &= ~self.bit

    # -- process slots
    def _slot_path(self, k: int) -> Path:
        return self.path.with_name(f"{self.path.name}.slots") / str(k)

    def _take_slot(self) -> tuple[int, int]:
        """The first slot no live process holds, held (exclusive ``flock``) for as long as this object lives."""
        folder = self._slot_path(0).parent
        folder.mkdir(exist_ok=True)
        for k in range(_SLOTS):
            fd = os.open(self._slot_path(k), os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return k, fd
        raise OSError(f"{folder}: {_SLOTS} processes already read this dataset from this cache folder")

    def alive(self, k: int) -> bool:
        """Whether some live process holds slot ``k`` (this one included)."""
        if k == self.slot:
            return True
        try:
            fd = os.open(self._slot_path(k), os.O_RDWR)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    def live(self) -> int:
        """Processes holding a slot of this ledger now (this one included; at least 1)."""
        folder = self._slot_path(0).parent
        try:
            names = os.listdir(folder)
        except OSError:
            return 1
        return max(1, sum(1 for n in names if n.isdigit() and self.alive(int(n))))

    # -- the one way in
    @contextmanager
    def transaction(self, wait: bool = True):
        """The ledger locked for this thread (other processes and this process's other threads wait): a
        ``Transaction`` to read and change it. The ``flock`` alone would not keep out a second thread (one descriptor:
        its lock is already this process's), and the first to leave would let go of it under the other, opening the
        ledger to every process of the node while that thread still reads and changes it. ``wait=False``: ``None``
        at once when another thread or process holds it (``try_transaction``)."""
        if not self._threads.acquire(blocking=wait):
            yield None
            return
        try:
            if not self._depth:  # (a transaction inside one of the same thread: the outer one holds the lock)
                try:
                    fcntl.flock(self.fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    yield None
                    return
            self._depth += 1
            try:
                yield Transaction(self)
            finally:
                self._depth -= 1
                if not self._depth:
                    fcntl.flock(self.fd, fcntl.LOCK_UN)
        finally:
            self._threads.release()

    def try_transaction(self):
        """``transaction()`` when the ledger is free now, else ``None`` at once (for work that may wait for the next
        chance, such as renewing leases after a batch: a batch never waits behind another thread's eviction)."""
        return self.transaction(wait=False)

    def close(self, _close=os.close) -> None:  # _close: still bound at interpreter shutdown
        fd, self._slot_fd = getattr(self, "_slot_fd", None), None
        if fd is not None:
            _close(fd)  # (lets go of the slot)
        fd, self.fd = getattr(self, "fd", None), None
        if fd is not None:
            _close(fd)

    def __del__(self) -> None:
        self.close()

    def drop_inherited(self) -> None:
        """In a forked child: close the copies of this process's descriptors (``storage.inherited``)."""
        self.close()


class Transaction:
    """What one process may read and change of the ledger while it holds its lock (``Budget.transaction``)."""

    def __init__(self, budget: Budget) -> None:
        self.b = budget

    @property
    def fixed(self) -> int:
        return int(self.b._head[2])

    @fixed.setter
    def fixed(self, n: int) -> None:
        self.b._head[2] = max(int(n), 0)

    @property
    def other(self) -> int:
        return int(self.b._head[3])

    @other.setter
    def other(self, n: int) -> None:
        self.b._head[3] = max(int(n), 0)

    def used(self) -> int:
        """Bytes the node's cache holds for this dataset, reserved downloads included, plus ``fixed`` and ``other``."""
        b = self.b
        return self.fixed + self.other + int(b.nbytes[b.state != ABSENT].sum())

    def room(self) -> int | None:
        """Bytes that may still be reserved (None: no limit)."""
        return None if self.b.limit is None else self.b.limit - self.used()

    def state(self, item: int) -> int:
        return int(self.b.state[item])

    def fetching_elsewhere(self, item: int) -> bool:
        """Item ``item`` is reserved by another live process (it is downloading it)."""
        b = self.b
        return b.state[item] == RESERVED and int(b.slot_of[item]) != b.slot and b.alive(int(b.slot_of[item]))

    def _dead(self, item: int) -> bool:
        """The reservation of ``item`` belongs to no live fetch: its slot is free, or it is this process's slot and
        this process never made it (a dead process held the slot before: slots are reused)."""
        b = self.b
        slot = int(b.slot_of[item])
        return item not in b.mine if slot == b.slot else not b.alive(slot)

    def reclaim(self) -> list[int]:
        """Give back the reservations of dead processes; the items they were fetching (now ``ABSENT``: their partial
        files are the caller's to remove)."""
        b = self.b
        out = []
        for item in np.flatnonzero(b.state == RESERVED).tolist():
            if self._dead(item):
                b.state[item], b.nbytes[item] = ABSENT, 0
                out.append(item)
        return out

    def reserve(self, item: int, nbytes: int) -> None:
        """Count ``nbytes`` for ``item`` (reserved by this process; more bytes for an item it reserved already)."""
        b = self.b
        b.state[item], b.slot_of[item], b.nbytes[item] = RESERVED, b.slot, int(nbytes)
        b.mine.add(int(item))

    def commit(self, item: int, nbytes: int) -> None:
        """``item`` is on disk, taking ``nbytes``."""
        b = self.b
        b.state[item], b.nbytes[item] = PRESENT, int(nbytes)
        b.mine.discard(int(item))
        self.touch([item])

    def drop(self, item: int) -> None:
        """``item`` is no longer on disk (evicted, or its fetch failed)."""
        b = self.b
        b.state[item], b.nbytes[item] = ABSENT, 0
        b.mine.discard(int(item))

    def touch(self, items) -> None:
        """``items`` were used now (the node's least recently used order)."""
        b = self.b
        b._head[4] += 1
        b.last[np.asarray(items, dtype=np.int64)] = b._head[4]

    def want(self, items, until_ns: int) -> None:
        """Some process of the node reads ``items`` soon: a lease until ``until_ns`` (``time.monotonic_ns``, one
        clock for the node's processes), which its reader renews while it reads; a dead reader's lapses."""
        b = self.b
        items = np.asarray(items, dtype=np.int64)
        b.want[items] = np.maximum(b.want[items], int(until_ns))
        b.wanters[items] |= b.bit

    def unwant(self, items) -> None:
        """This process no longer reads ``items``: its leases of them end now; an item another process leased too
        stays wanted (slots past the first 63 share one bit, which only lapses)."""
        b = self.b
        items = np.asarray(items, dtype=np.int64)
        if b.bit == _SHARED_BIT or not items.size:
            return
        b.wanters[items] &= ~b.bit
        b.want[items[b.wanters[items] == 0]] = 0

    def leased_here(self, items) -> np.ndarray:
        """bool: which of ``items`` this process leased (and has not given back)."""
        return (self.b.wanters[np.asarray(items, dtype=np.int64)] & self.b.bit) != 0

    def wanted(self, items) -> np.ndarray:
        """bool: which of ``items`` some process of the node reads soon (its lease not lapsed)."""
        items = np.asarray(items, dtype=np.int64)
        return (self.b.want[items] > time.monotonic_ns()) & (self.b.wanters[items] != 0)

    def present(self) -> np.ndarray:
        """int64: the items on disk, least recently used first."""
        b = self.b
        items = np.flatnonzero(b.state == PRESENT)
        return items[np.argsort(b.last[items], kind="stable")]
