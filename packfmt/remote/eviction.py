"""Which resident member of a streamed collection leaves to make room, and what leaving does (README "Remote data").

``cache_limit`` bytes hold one process's resident member files (and their rows of a layout's index read shard by
shard: ``shard_index``), and ``resident_bound()`` members at most. Before a member is fetched, resident members are
evicted until it fits: the one whose next use is furthest in the future first (Belady, from the ``plan.Plan`` the
sampler's order gives; least recently used without one), never one pinned by a batch in flight. A member leaves
unmapped; its files and markers are removed, and its rows punched out of the sparse index files, unless another
process holds its pin (that process removes them when it evicts it: ``storage.cache.evict``'s rule).
"""

from __future__ import annotations

import fcntl
import os
import resource
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from ..collection import lazy_members
from ..storage import verify as V

__all__ = ["Eviction", "resident_bound", "forget_unless_held", "lock_pin"]


class Eviction:
    """The eviction half of ``members.StreamedMembers`` (its base class). It reads the state that class keeps, with
    ``cond`` held by the caller: ``resident``, ``fetching``, ``pinned``, ``stores``, ``used``, ``limit``, ``most``,
    ``plan``, ``last_use``, ``sharded``, ``fetcher``; and calls its ``_unmap(m)`` and ``_member_url(m)``."""

    def _make_room(self, size: int, before: int | None) -> bool:
        """Evict until ``size`` more bytes fit ``cache_limit`` and one more member fits ``self.most``: each resident
        member is 3 kernel mappings and an open pin, so without a count bound 10^5 tiny members under a large limit
        would pass ``vm.max_map_count``, and a few thousand the usual limit on open files (1,024)."""
        while ((self.limit is not None and self.used + size > self.limit)
               or len(self.resident) + len(self.fetching) >= self.most):
            victims = [m for m in self.resident if m not in self.pinned]
            if not victims:
                return False
            if self.plan is not None:
                nxt = self.plan.next_use(np.array(victims, dtype=np.int64))
                j = int(np.argmax(nxt))
                if before is not None and nxt[j] <= before:
                    return False  # every candidate is needed before the member we would prefetch
            else:
                if before is not None:
                    return False
                j = int(np.argmin([self.last_use.get(m, 0) for m in victims]))
            self._evict(victims[j])
        return True

    def _evict(self, m: int) -> None:
        size, files, pin = self.resident.pop(m)
        self.stores.pop(m, None)  # its image files unmapped with it (torch._sources keeps copies of its tables only)
        self._unmap(m)
        for index in self.sharded:  # its rows are not read here again before it returns (and is checked again)
            index.release_shard(m)
        pin.close()
        if files:
            forget_unless_held(self.fetcher.root, files[0].parent, files, then=lambda: self._punch(m))
        self.used -= size

    def _punch(self, m: int) -> None:
        """Member ``m``'s rows of each index read shard by shard punched out of the cache (no process holds it)."""
        for index in self.sharded:
            index.punch_shard(m, self._exclusive)

    @contextmanager
    def _exclusive(self, members: list):
        """Exclusive locks on the pins of ``members`` that no process holds (this one included: its own pins are other
        open files), while the block runs; yields the set of those locked (a member being fetched waits for its pin
        meanwhile)."""
        fds, got = [], set()
        try:
            for j in members:
                fd = lock_pin(self.fetcher.root, self.fetcher.mirror(self._member_url(j)))
                if fd is not None:
                    fds.append(fd)
                    got.add(j)
            yield got
        finally:
            for fd in fds:
                os.close(fd)


def resident_bound() -> int:
    """Members one process keeps resident at most: ``lazy_members.MAX_MAPPED``, and a quarter of its soft limit on
    open files (each resident member holds its pin, a descriptor, so that other processes leave its files alone;
    the rest is left to sockets, pipes and the caller's own files)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    most = lazy_members.MAX_MAPPED
    return most if soft == resource.RLIM_INFINITY else max(2, min(most, soft // 4))


def forget_unless_held(root: Path, local: Path, files: list, then=None) -> None:
    """Remove a member's files unless another process (a DataLoader worker, another job) holds its pin: that process
    counts them against its own limit and removes them when it evicts the member (``cache.evict``'s rule). ``then``:
    called too, under the same lock, when they are removed (the member's rows of a sharded index punched out)."""
    fd = lock_pin(root, local)
    if fd is None:
        return
    try:
        for path in files:
            V.forget(root, path)
        if then is not None:
            then()
    finally:
        os.close(fd)  # (closing releases the lock)


def lock_pin(root: Path, local: Path) -> int | None:
    """An exclusive lock on the pin of the mirrored member ``local``, when no process holds it (this one included: a
    pin it holds is another open file): the descriptor holding it (closing it releases the lock); else None."""
    state = V.state_dir(root, local)
    state.mkdir(parents=True, exist_ok=True)
    fd = os.open(state / V.PIN, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd
