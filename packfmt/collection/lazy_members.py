"""A local collection with more members than one process may map at once: its members mapped as batches need them.

``vmap.concatenate_members`` maps every member's files into one span each (tokens, loss mask, doc offsets) when
a ``PackedDataset`` first reads: one kernel mapping per file, and Linux gives a process ``vm.max_map_count``
mappings (65,530 by default), shared with everything else it maps. Past ``MAP_BUDGET`` mappings (about 10,000
members with masks) that would fail with ENOMEM, so ``LocalMembers`` reserves the same spans with nothing mapped
(``vmap.Reserved``) and, as a streamed collection does (``collection.stream``), maps the members a batch touches
while the batch is read (``hold``): each opened and checked as ``Collection.member`` checks it (C2, C3, V13, and
its lengths against ``doc_lengths.bin``), the least recently used unpinned ones unmapped past ``max_mapped``.
The kernels read the same arrays and document table; nothing is fetched or copied. Opening is also lazy: a
first batch opens the members it touches, not all of them.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from contextlib import contextmanager, nullcontext

import numpy as np

from .vmap import Reserved, batch_segments

__all__ = ["LocalMembers", "MAP_BUDGET", "MAPS_PER_MEMBER", "MAX_MAPPED", "maps_needed"]

#: Kernel mappings one member takes when mapped: tokens, loss mask, doc offsets.
MAPS_PER_MEMBER = 3
#: Members mapped at once when they are mapped as batches need them: ``MAPS_PER_MEMBER`` times this is about half of
#: Linux's default ``vm.max_map_count`` (65,530); torch, numpy, shared libraries, DataLoader workers' shared memory,
#: pack indexes and the member stores a collection keeps open take the rest.
MAX_MAPPED = 10_000
#: Mappings a collection's members may take in one process: every member is mapped at once up to this (the usual
#: case, nothing to do per batch); past it, members are mapped as batches need them, ``MAX_MAPPED`` at most.
MAP_BUDGET = MAPS_PER_MEMBER * MAX_MAPPED


def maps_needed(coll) -> int:
    """Kernel mappings ``concatenate_members`` would take for every member of ``coll`` at once."""
    return MAPS_PER_MEMBER * int(coll.num_members)


class LocalMembers:
    """The members of a local collection mapped while batches hold them (thread-safe): ``source()`` for the kernels,
    ``hold(...)`` around each batch, ``images(m)`` for a member's images."""

    def __init__(self, coll, max_mapped: int | None = None) -> None:
        self.coll = coll
        self.pid = os.getpid()
        self.spans = Reserved(coll)
        self.max_mapped = max(1, int(max_mapped if max_mapped is not None else MAX_MAPPED))
        self.cond = threading.Condition()
        self.mapped: OrderedDict[int, None] = OrderedDict()  # least recently used first
        self.pinned: dict[int, int] = {}

    def source(self):
        return self.spans.source(self)

    @contextmanager
    def hold(self, packs: np.ndarray, pack_offsets: np.ndarray, segments: np.ndarray, label: str = "segments.bin"):
        """The members packs ``packs`` (valid ids) touch, mapped and not unmapped while the block runs (their
        segments were bounded by the real lengths when the index opened: V27 over ``doc_lengths``)."""
        _, seg = batch_segments(packs, pack_offsets, segments)
        members = [int(m) for m in np.unique(self.coll.member_of(seg[:, 0]))]
        with self.cond:
            for m in members:
                self.pinned[m] = self.pinned.get(m, 0) + 1
        try:
            for m in members:
                self.ensure(m)
            yield
        finally:
            with self.cond:
                for m in members:
                    self.pinned[m] -= 1
                    if not self.pinned[m]:
                        del self.pinned[m]

    def images(self, m: int):
        """Member ``m``'s ``ImageStore`` (its own mappings, opened and checked by the collection)."""
        return nullcontext(self.coll.member(m).images)

    def ensure(self, m: int) -> None:
        """Member ``m`` opened, checked and mapped; another unpinned one unmapped first when ``max_mapped`` are."""
        with self.cond:
            if m in self.mapped:
                self.mapped.move_to_end(m)
                return
            store = self.coll.member(m)  # opens and checks it (C2, C3, V13, its lengths); raises before any map
            while len(self.mapped) >= self.max_mapped:
                victim = next((v for v in self.mapped if v not in self.pinned), None)
                if victim is None:
                    raise RuntimeError(f"{self.coll.path}: a batch touches more than {self.max_mapped:,} members, "
                                       "the most one process maps at once: read smaller batches")
                del self.mapped[victim]
                self.spans.unmap_member(victim)
            try:
                self.spans.map_member(m, store.path)
            except BaseException:
                self.spans.unmap_member(m)  # nothing half-mapped stays (its spans back to PROT_NONE)
                raise
            self.mapped[m] = None
