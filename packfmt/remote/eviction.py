"""Which members a process lets go of, and which the node deletes, to make room (README "Remote data", "The bound").

A process holds a member (its pin, a shared ``flock``) while it has it mapped; what it holds idle (no batch in
flight holds it) stays within its *share* of the node's budget, ``(limit - fixed) / processes`` (the processes that
read the collection on the node now), so that the idle members of all of them leave room for every batch: a
prefetch never takes another process's room, and a batch's fetch may pass its share only for the members the batch
itself needs. Room is made in this order, inside the node's ledger transaction (``node_cache``):

1. members on the node's disk that no process holds: the one this process's plan (``plan.Plan``) needs furthest
   ahead first, members it never needs before those (Belady); least recently used on the node without a plan;
2. this process's own idle members, furthest next use first (least recently used here without a plan): let go,
   then deleted when no other process holds them. A prefetch for plan position ``p`` takes only members next used
   after ``p``, and gives up when they do not make room (a member needed sooner is never evicted for one needed
   later).

``resident_bound()`` caps the members one process keeps mapped (kernel mappings, open pins).
"""

from __future__ import annotations

import os
import resource
import time

import numpy as np

from ..collection import lazy_members
from ..storage.budget import PRESENT, RESERVED

__all__ = ["Holdings", "resident_bound"]

_NEVER = np.iinfo(np.int64).max
#: A reader renews its want leases at most this often (after a batch, and once a second from its prefetch threads);
#: a lease lasts ``LEASE_S``, so a slow step keeps them and a dead reader's lapse.
ANNOUNCE_S, LEASE_S = 0.25, 30.0


class Holdings:
    """The making-room half of ``members.StreamedMembers`` (its base class), over the state that class keeps:
    ``resident``, ``fetching``, ``pinned``, ``stores``, ``plan``, ``last_use``, ``sharded``, ``spans``, ``node``,
    ``most``, ``cond``."""

    _live: tuple[float, int] = (0.0, 1)
    _announced: float = 0.0
    _leased: np.ndarray | None = None  # the members this process leased last (``announce``)

    def make_room(self, tx, need: int, before: int | None, member: int) -> bool:
        """Room for ``need`` more bytes (member ``member``) in the node's budget and in this process's share, and one
        more mapped member under ``most``; ``before``: a prefetch for that plan position. Called inside ``tx``."""
        budget = self.node.budget
        with self.cond:
            idle = self._idle_order(before)
            while idle and len(self.resident) + len(self.fetching) > self.most:
                self._let_go_and_delete(tx, idle.pop(0))
            if len(self.resident) + len(self.fetching) > self.most:
                return False
            if budget.limit is None:
                return True
            share = (budget.limit - tx.fixed) // self._processes()
            held = self._held_bytes(tx)
            while idle and held + need > share:  # what this process holds idle stays within its share
                held -= int(budget.nbytes[idle[0]])
                self._let_go_and_delete(tx, idle.pop(0))
            if before is not None and held + need > share:
                return False
        if self.node.make_room(tx, need, self._unheld_order(tx, before)):
            return True
        with self.cond:
            for m in self._idle_order(before):
                self._let_go_and_delete(tx, m)
                if tx.room() >= need:
                    return True
        return False

    def trim(self) -> None:
        """Let go of the idle members past this process's share (the caller holds ``cond``): its share shrinks when
        other processes start reading (a rank's workers after it prefetched alone), and what it let go of stays on
        the disk for them to use or delete. Called after each batch and by each prefetch thread once a second."""
        b = self.node.budget
        if b.limit is None or not self.resident:
            return
        share = (b.limit - int(b._head[2])) // self._processes()  # (the header's ``fixed``, read without the lock)
        held = sum(int(b.nbytes[m]) for m in self.resident)
        for m in self._idle_order(None):
            if held <= share:
                break
            held -= int(b.nbytes[m])
            self.let_go(m)

    def let_go(self, m: int) -> None:
        """This process no longer holds member ``m`` (the caller holds ``cond``): unmapped, its rows no longer ready
        here, its pin let go. It stays on the node's disk for the other processes until room is needed."""
        fd = self.resident.pop(m)
        self.stores.pop(m, None)  # its image files unmapped with it (torch._sources keeps copies of its tables only)
        self.spans.unmap_member(m)
        for index in self.sharded:  # its rows are not read here again before it returns (and is checked again)
            index.release_shard(m)
        os.close(fd)

    def _let_go_and_delete(self, tx, m: int) -> None:
        self.let_go(m)
        self.node.delete(tx, m)  # (when no other process holds it)

    def _idle_order(self, before: int | None) -> list:
        """This process's members no batch holds, the one to let go first first: furthest next use (Belady), else
        least recently used here; for a prefetch at plan position ``before`` only those next used after it."""
        idle = [m for m in self.resident if m not in self.pinned]
        if not idle:
            return []
        if self.plan is not None:
            nxt = self.plan.next_use(np.array(idle, dtype=np.int64))
            order = np.argsort(-nxt, kind="stable")
            return [idle[j] for j in order.tolist() if before is None or nxt[j] > before]
        if before is not None:
            return []
        return sorted(idle, key=lambda m: self.last_use.get(m, 0))

    def _unheld_order(self, tx, before: int | None) -> list:
        """Members on the node's disk this process does not hold, the one to delete first first (``node_cache``
        deletes only those no other process holds either); for a prefetch at plan position ``before`` only those
        next used after it (a member this process let go of, ``trim``, is on the disk until its next use: deleting
        it for a member needed later fetched it twice)."""
        present = tx.present()  # least recently used on the node first
        mine = np.fromiter(self.resident, dtype=np.int64, count=len(self.resident)) if self.resident else None
        if mine is not None:
            present = present[~np.isin(present, mine)]
        if not present.size:
            return []
        wanted = tx.wanted(present)  # another process (or this one) reads it soon: deleted last, and by no prefetch
        if self.plan is not None:
            nxt = self.plan.next_use(present)
            done = wanted & (nxt == _NEVER)  # this process's own leases of what it no longer reads go now, not
            if done.any():  # at its next renewal (a second later: a fast reader's whole cache stayed wanted meanwhile)
                tx.unwant(present[done])
                wanted = tx.wanted(present)  # (another process's lease stays)
            order = np.lexsort((-nxt, wanted))  # not wanted first; furthest next use here first within each
            if before is not None:
                order = order[(nxt[order] > before) & ~wanted[order]]
            present = present[order]
        elif before is not None:
            return []  # without a plan no prefetch runs; nothing to judge by
        else:
            present = present[np.argsort(wanted, kind="stable")]  # least recently used on the node within each
        return present.tolist()

    def announce(self, force: bool = False, wait: bool = True) -> None:
        """Lease the members of this process's plan lookahead in the node's ledger (``Budget``'s ``want``): the other
        processes of the node then make room from members no process reads soon before these (without it, a shard a
        DataLoader worker was done with was deleted first even when its sibling read it next: fetched 3-5 times by
        one node). Members this process leased and no longer reads (read for the last time, or its plan dropped) are
        given back at once (``unwant``; one another process leased too stays wanted): a lease that outlived its reads
        kept every member read in the last ``LEASE_S`` wanted, and with small members that was the whole cache, so
        no prefetch found room (100 KiB shards: a third of the batches waited for a demand fetch). At most every
        ``ANNOUNCE_S``; ``wait=False`` (after a batch) only if the ledger is free now (a prefetch thread renews them
        within a second otherwise: a batch waited behind evictions). The caller does not hold ``cond`` (the ledger's
        lock is taken before ``cond`` everywhere: ``make_room`` runs inside a transaction)."""
        with self.cond:
            if (self.plan is None and self._leased is None) or (
                    not force and time.monotonic() - self._announced < ANNOUNCE_S):
                return
            lookahead = getattr(self, "prefetch_lookahead", 4096)
            members = (self.plan.upcoming_members(lookahead) if self.plan is not None
                       else np.empty(0, dtype=np.int64))
        until = time.monotonic_ns() + int(LEASE_S * 1e9)
        budget = self.node.budget
        with (budget.transaction() if wait else budget.try_transaction()) as tx:
            if tx is None:
                return
            self._announced = time.monotonic()  # (thread-exclusive inside a transaction, as is ``_leased``)
            if self._leased is not None:
                gone = np.setdiff1d(self._leased, members, assume_unique=True)
                if gone.size:
                    tx.unwant(gone)
            if members.size:
                tx.want(members, until)
            self._leased = members if members.size else None

    def _held_bytes(self, tx) -> int:
        """Bytes of what this process holds: its members on disk, and those it is fetching (their reservations), as
        the ledger counts them. (Without the ones in flight, 16 prefetch threads a process each reserved past its
        share, and the batches of the node's other processes then deleted members still wanted: fetched again.)"""
        b = self.node.budget
        held = [m for m in self.resident if b.state[m] == PRESENT]
        held += [m for m in b.mine if b.state[m] == RESERVED]
        return int(b.nbytes[held].sum()) if held else 0

    def _processes(self) -> int:
        """Processes of the node reading the collection now (their ledger slots held), looked at once a second."""
        stamp, n = self._live
        now = time.monotonic()
        if now - stamp > 1.0:
            n = self.node.budget.live()
            self._live = (now, n)
        return n


def resident_bound() -> int:
    """Members one process keeps resident at most: ``lazy_members.MAX_MAPPED``, and a quarter of its soft limit on
    open files (each resident member holds its pin, a descriptor, so that other processes leave its files alone;
    the rest is left to sockets, pipes and the caller's own files)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    most = lazy_members.MAX_MAPPED
    return most if soft == resource.RLIM_INFINITY else max(2, min(most, soft // 4))
