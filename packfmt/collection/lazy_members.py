"""A local collection with many members: its members mapped as batches need them.

Past ``EAGER_MOST`` members, opening them all at the first read costs more than a first batch should (about 0.5 ms a
member: 4-6 s for a pack-ordered layout of 10^4 small shards), and past ``MAP_BUDGET`` mappings it would fail:

``vmap.concatenate_members`` maps every member's files into one span each (tokens, loss mask, doc offsets) when
a ``PackedDataset`` first reads: one kernel mapping per file, and Linux gives a process ``vm.max_map_count``
mappings (65,530 by default), shared with everything else it maps. Past ``MAP_BUDGET`` mappings (about 10,000
members with masks) that would fail with ENOMEM, so ``LocalMembers`` reserves the same spans with nothing mapped
(``vmap.Reserved``) and, as a streamed collection does (``remote.members``), maps the members a batch touches
while the batch is read (``hold``): each opened and checked as ``Collection.member`` checks it (C2, C3, V13, and
its lengths against ``doc_lengths.bin``), the least recently used unpinned ones unmapped past ``max_mapped``.
The kernels read the same arrays and document table; nothing is fetched or copied. Opening is also lazy: a
first batch opens the members it touches, not all of them.
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager, nullcontext

import numpy as np

from .resident import ResidentMembers
from .vmap import Reserved, batch_segments

__all__ = ["LocalMembers", "EAGER_MOST", "MAP_BUDGET", "MAPS_PER_MEMBER", "MAX_MAPPED", "maps_needed", "lazy"]

#: Kernel mappings one member takes when mapped: tokens, loss mask, doc offsets.
MAPS_PER_MEMBER = 3
#: Members mapped at once when they are mapped as batches need them: ``MAPS_PER_MEMBER`` times this is about half of
#: Linux's default ``vm.max_map_count`` (65,530); torch, numpy, shared libraries, DataLoader workers' shared memory,
#: pack indexes and the member stores a collection keeps open take the rest.
MAX_MAPPED = 10_000
#: Mappings a collection's members may take in one process: every member is mapped at once up to this (the usual
#: case, nothing to do per batch); past it, members are mapped as batches need them, ``MAX_MAPPED`` at most.
MAP_BUDGET = MAPS_PER_MEMBER * MAX_MAPPED
#: Members a first batch opens at once, at most: opening one (its manifest parsed, its files mapped and checked) costs
#: about 0.5 ms, so a collection of 10^4 members (a pack-ordered layout of small shards) took 4-6 s to its first batch;
#: past this count members are opened as batches need them, and the first batch opens only its own.
EAGER_MOST = 512


def maps_needed(coll) -> int:
    """Kernel mappings ``concatenate_members`` would take for every member of ``coll`` at once."""
    return MAPS_PER_MEMBER * int(coll.num_members)


def lazy(coll) -> bool:
    """Whether ``coll``'s members are mapped as batches need them (``LocalMembers``) rather than all at the first
    read: more than ``EAGER_MOST`` of them (time to first batch), or more mappings than ``MAP_BUDGET``."""
    return coll.num_members > EAGER_MOST or maps_needed(coll) > MAP_BUDGET


class LocalMembers(ResidentMembers):
    """The members of a local collection mapped while batches hold them (thread-safe): ``source()`` for the kernels,
    ``hold(...)`` around each batch, ``images(m)`` for a member's images."""

    def __init__(self, coll, max_mapped: int | None = None) -> None:
        self.coll = coll
        self.pid = os.getpid()
        self.spans = Reserved(coll)
        self.max_mapped = max(1, int(max_mapped if max_mapped is not None else MAX_MAPPED))
        self.cond = threading.Condition()
        n = int(coll.num_members)  # per member, as arrays: a batch of packs may touch hundreds of members
        self.is_mapped = np.zeros(n, dtype=bool)
        self.pins = np.zeros(n, dtype=np.int64)  # batches in flight holding it
        self.last_use = np.zeros(n, dtype=np.int64)  # the clock of the last batch that held it
        self.count = 0
        self.clock = 0

    @property
    def mapped(self) -> list[int]:
        """The members mapped now."""
        with self.cond:
            return np.flatnonzero(self.is_mapped).tolist()

    def source(self):
        return self.spans.source(self)

    @contextmanager
    def hold(self, packs: np.ndarray, pack_offsets: np.ndarray, segments: np.ndarray, label: str = "segments.bin"):
        """The members packs ``packs`` (valid ids) touch, mapped and not unmapped while the block runs (their
        segments were bounded by the real lengths when the index opened: V27 over ``doc_lengths``)."""
        _, seg = batch_segments(packs, pack_offsets, segments)
        members = np.unique(self.coll.member_of(seg[:, 0]))
        with self.cond:
            self.pins[members] += 1  # (unique ids: no index twice)
            self.clock += 1
            self.last_use[members] = self.clock
            missing = members[~self.is_mapped[members]].tolist()
        try:
            for m in missing:
                self.ensure(m)
            yield
        finally:
            with self.cond:
                self.pins[members] -= 1

    def images(self, m: int):
        """Member ``m``'s ``ImageStore`` (its own mappings, opened and checked by the collection)."""
        return nullcontext(self.coll.member(m).images)

    def ensure(self, m: int) -> None:
        """Member ``m`` opened, checked and mapped; when ``max_mapped`` are, the least recently used eighth of the
        unpinned ones unmapped first (in one pass, not one scan per member)."""
        with self.cond:
            if self.is_mapped[m]:
                return
            store = self.coll.member(m)  # opens and checks it (C2, C3, V13, its lengths); raises before any map
            if self.count >= self.max_mapped:
                free = np.flatnonzero(self.is_mapped & (self.pins == 0))
                if not free.size:
                    raise RuntimeError(f"{self.coll.path}: a batch touches more than {self.max_mapped:,} members, "
                                       "the most one process maps at once: read smaller batches")
                k = min(free.size, max(1, self.max_mapped // 8))
                for victim in free[np.argpartition(self.last_use[free], k - 1)[:k]].tolist():
                    self.spans.unmap_member(victim)
                    self.is_mapped[victim] = False
                    self.count -= 1
            try:
                self.spans.map_member(m, store.path)
            except BaseException:
                self.spans.unmap_member(m)  # nothing half-mapped stays (its spans back to PROT_NONE)
                raise
            self.is_mapped[m] = True
            self.count += 1
