"""Room on the node's disk for one member of a streamed collection, reserved before its fetch (README "Remote data",
"The bound").

``members.StreamedMembers`` (whose base class ``Room`` is) brings a member in: first its room, inside the node's
ledger transaction (``storage.budget``), for what the collection's record says it takes (``NodeCache.estimate``),
so that one process of the node fetches it and the others wait for it; then, from its checked manifest, the room
made exact (``footprint``: image files are not in the record). Making room is ``eviction.Holdings.make_room``'s.
"""

from __future__ import annotations

import os
import time

from ..storage.budget import ABSENT, PRESENT, RESERVED
from ..storage.errors import StorageError

__all__ = ["Room", "WAIT_ENV", "WAIT_S"]

#: Seconds a batch waits for room other processes of the node hold before it fails (``$PACKFMT_CACHE_WAIT``).
WAIT_ENV, WAIT_S = "PACKFMT_CACHE_WAIT", 600.0


class _NoRoom(Exception):
    """No room for member ``member`` (``need`` bytes) within a batch's patience (``ensure_all``)."""

    def __init__(self, member: int, need: int | None) -> None:
        super().__init__(member, need)
        self.member, self.need = member, need


class Room:
    """The reserving half of ``members.StreamedMembers``, over its ``node``, ``url``, ``limit``, ``wait_s`` and
    ``make_room``."""

    def _hold_room(self, m: int, known, before: int | None, deadline: float, give_up: float | None):
        """``(pin, bytes reserved)``: member ``m`` pinned, and room reserved for it when it is not on the node's disk
        (0 when it is: present, or fetched meanwhile by another process); None when a prefetch found no room."""
        while True:
            need = None
            with self.node.budget.transaction() as tx:
                state = tx.state(m)
                if state == RESERVED and not tx.fetching_elsewhere(m):
                    self.node.reclaim(tx)  # its reserver died
                    state = tx.state(m)
                if state == PRESENT:
                    fd = self.node.take_pin(m)
                    tx.touch([m])
                    return fd, 0
                if state == ABSENT:
                    raw, files, _ = known or (None, None, None)
                    need = self.node.footprint(m, files, len(raw)) if known else self.node.estimate(m)
                    if self.make_room(tx, need, before, m):
                        tx.reserve(m, need)
                        return self.node.take_pin(m), need
                    if before is not None:
                        return None
            if time.monotonic() > deadline:
                raise self._no_room(m, need)
            if need is not None and give_up is not None and time.monotonic() > give_up:
                raise _NoRoom(m, need)  # (no room, rather than a fetch in flight elsewhere, which ends by itself)
            time.sleep(0.02)  # another process is fetching it, or holds the room: it lets go within its share

    def _resize(self, m: int, known, reserved: int) -> bool:
        """The reservation of member ``m`` made what its checked manifest says it takes, when that is not more than
        reserved; False when it is more (files the record does not count, image files): the caller begins again
        with the exact size, which ``make_room`` weighs whole (this process's share, the plan's order)."""
        raw, files, _ = known
        exact = self.node.footprint(m, files, len(raw))
        if exact > reserved:
            return False
        if exact < reserved:
            with self.node.budget.transaction() as tx:
                tx.reserve(m, exact)
        return True

    def _unreserve(self, m: int, fd: int, reserved: int) -> None:
        """Member ``m``'s pin let go, and what this process began of it deleted (unless another process holds it)."""
        os.close(fd)
        with self.node.budget.transaction() as tx:  # nothing half-fetched or refused stays (unless held elsewhere)
            if not self.node.delete(tx, m) and reserved and tx.state(m) == RESERVED:
                tx.drop(m)

    def _no_room(self, m: int, need: int | None) -> StorageError:
        with self.node.budget.transaction() as tx:
            used = tx.used()
        return StorageError(f"{self.url}: cache_limit={self.limit:,} bytes could not hold member {m} "
                            f"({need or 0:,} bytes) within {self.wait_s:.0f} s: the node's processes hold {used:,} "
                            "bytes for the batches they read. Raise cache_limit= / $PACKFMT_CACHE_LIMIT, use smaller "
                            f"batches, or wait longer (${WAIT_ENV})", file=self.url, field="cache_limit",
                            expected=f">= {used + (need or 0):,}", found=self.limit)
