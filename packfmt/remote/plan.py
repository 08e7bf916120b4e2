"""Exact prefetch of a streamed collection's members from the sampler's order (README "Remote data").

The order a process reads packs in is known ahead (``DistributedPackSampler.epoch_indices()``), so a ``Plan``
holds, for every member, the positions of the order whose packs touch it. The member cache (``members``,
``eviction``) then evicts the resident member whose next use is furthest ahead (Belady), and background threads
(``start``) fetch the members of the coming packs in order, as far ahead as the cache limit allows without evicting
a member needed sooner than the one they fetch. ``threads`` such threads fetch the next members at once, each
claiming the first coming member no other fetches: a member's requests (its manifest, then its files) are round
trips, and with several in flight their latency overlaps the transfer of the others (one thread spent ~60 ms of
round trips per member on moto: ``benchmarks/bench_stream.py --packs shards``). They still fetch in the plan's
order, so the members in flight are the earliest ones missing, which the coming batches need first. Reads never
depend on the plan: a batch that is not the plan's next packs drops the plan (a warning) and the cache falls back
to fetching on demand. ``packfmt.torch.prefetch`` gives a ``PackedDataset`` its plan (no torch here).
"""

from __future__ import annotations

import threading
import time
import warnings
import weakref

import numpy as np

__all__ = ["Plan", "start", "grow", "FIRST_THREADS", "MOST_THREADS"]

_NEVER = np.iinfo(np.int64).max
FIRST_THREADS, MOST_THREADS = 2, 16  # prefetch threads of a process: at first, and at most (``grow``)
_NO_ROOM = "no room"  # a prefetch that found no room: tried again after a batch is done here, or after a second
_BLOCKED = "blocked"  # the plan's next member is being given room by another thread: tried again once it has


class Plan:
    """The packs one process reads, in order, and the members each one touches."""

    def __init__(self, stream, order: np.ndarray, pack_offsets: np.ndarray, segments: np.ndarray,
                 shard_of=None) -> None:
        """``shard_of``: for an index read shard by shard (``shard_index``), each pack's one member from
        the layout record (no segment read: the rows of most shards are not fetched yet)."""
        order = np.asarray(order, dtype=np.int64).reshape(-1)
        self.order, self.cursor = order, 0
        if shard_of is not None:
            member = np.asarray(shard_of(order), dtype=np.int64)
            if member.size and (member.min() < 0 or member.max() >= len(stream.coll.members)):
                bad = int(order[(member < 0) | (member >= len(stream.coll.members))][0])
                raise IndexError(f"prefetch: order: expected pack ids of the index (0 .. packs - 1), found {bad}: "
                                 "pass the sampler's order (sampler.epoch_indices())")
            by_member = np.argsort(member, kind="stable")  # one member a position: no pair to merge, positions sorted
            self.member, self.pos = member[by_member], by_member.astype(np.int64, copy=False)
            self.starts = np.searchsorted(self.member, np.arange(len(stream.coll.members) + 1))
            self.pos_sorted, self.member_by_pos = np.arange(order.shape[0], dtype=np.int64), member
            return
        # (position, member) of every member each pack touches, grouped by member, positions ascending
        lo, hi = pack_offsets[order], pack_offsets[order + 1]
        n = hi - lo
        total = int(n.sum())
        first = np.repeat(lo - np.concatenate([[0], np.cumsum(n)[:-1]]), n) + np.arange(total)
        member = np.asarray(stream.coll.member_of(np.asarray(segments[first, 0], dtype=np.int64)), dtype=np.int64)
        pos = np.repeat(np.arange(order.shape[0], dtype=np.int64), n)
        pairs = np.unique(np.stack([member, pos], axis=1), axis=0)  # sorted by member, then position
        self._pairs(pairs[:, 0], pairs[:, 1], stream)

    def _pairs(self, member: np.ndarray, pos: np.ndarray, stream) -> None:
        """The (member, position) pairs, distinct, indexed both ways."""
        by_member = np.lexsort((pos, member))
        self.member, self.pos = member[by_member], pos[by_member]
        self.starts = np.searchsorted(self.member, np.arange(len(stream.coll.members) + 1))
        by_pos = np.lexsort((self.member, self.pos))
        self.pos_sorted, self.member_by_pos = self.pos[by_pos], self.member[by_pos]

    def next_use(self, members: np.ndarray) -> np.ndarray:
        """int64: the first position at or after the cursor whose pack touches each member (never: int64 max)."""
        out = np.full(members.shape[0], _NEVER, dtype=np.int64)
        for i, m in enumerate(members):
            p = self.pos[self.starts[m]:self.starts[m + 1]]
            j = np.searchsorted(p, self.cursor)
            if j < p.shape[0]:
                out[i] = p[j]
        return out

    def upcoming(self, limit: int, chunk: int = 64):
        """``(position, member)`` pairs from the cursor on, at most ``limit`` of them, in read order (made ``chunk``
        at a time: a prefetch thread mostly stops at one of the first few, and 16 of them look after every batch)."""
        j = int(np.searchsorted(self.pos_sorted, self.cursor))
        end = min(j + limit, self.pos_sorted.shape[0])
        while j < end:
            k = min(j + chunk, end)
            yield from zip(self.pos_sorted[j:k].tolist(), self.member_by_pos[j:k].tolist())
            j = k

    def upcoming_members(self, limit: int) -> np.ndarray:
        """int64: the members of the next ``limit`` pairs (``upcoming``), distinct, sorted."""
        j = int(np.searchsorted(self.pos_sorted, self.cursor))
        return np.unique(self.member_by_pos[j:j + limit])

    def advance(self, packs: np.ndarray) -> bool:
        """A batch read ``packs``: True when they were the plan's next packs (the cursor moves past them), else
        False (a warning: the caller drops the plan)."""
        packs = np.asarray(packs, dtype=np.int64).reshape(-1)
        c = self.cursor
        if np.array_equal(self.order[c:c + packs.shape[0]], packs):
            self.cursor = c + packs.shape[0]
            return True
        warnings.warn("prefetch: the packs read are not the planned order's next ones (another sampler, or "
                      "prefetch() not called again after set_epoch): fetching members on demand from here",
                      stacklevel=4)
        return False


def start(stream, order: np.ndarray, pack_offsets: np.ndarray, segments: np.ndarray, shard_of, lookahead: int,
          threads: int, most: int | None = None) -> None:
    """``stream`` (a ``members.StreamedMembers``) reads ``order`` from now on: its plan (see ``Plan``), and ``threads``
    background threads fetching ahead over ``lookahead`` (position, member) pairs (started once; more when asked),
    and up to ``most`` (default ``threads``) as batches wait for members (``grow``). The threads hold ``stream``
    weakly: a dataset dropped lets go of its members, and its threads end."""
    with stream.cond:
        stream.plan = Plan(stream, order, pack_offsets, segments, shard_of)
        stream.prefetch_lookahead = lookahead
        stream.prefetch_most = max(threads, most or threads, len(stream.prefetchers))
        stream.moves += 1  # (threads waiting for a batch look at the new plan now)
        for _ in range(threads - len(stream.prefetchers)):
            _add_thread(stream)
        stream.cond.notify_all()
        stream.work.notify_all()
    stream.announce(force=True)


def grow(stream) -> None:
    """A batch waits for a member the plan has: twice the prefetch threads, up to ``stream.prefetch_most`` (the caller
    holds ``stream.cond``). Members whose requests are round trips more than bytes (small ones, a link with latency)
    need many in flight to fill the link, large ones few; each wait doubles the count, so it reaches the one where
    batches stop waiting within a few batches (one more a wait took a hundred: 100 KiB shards at 75 ms a round
    trip). The cache limit bounds the bytes in flight whatever the count (a thread without room waits)."""
    if stream.plan is None:
        return
    for _ in range(min(len(stream.prefetchers), getattr(stream, "prefetch_most", 0) - len(stream.prefetchers))):
        _add_thread(stream)


def _add_thread(stream) -> None:
    t = threading.Thread(target=_run, args=(weakref.ref(stream), stream.prefetch_lookahead), daemon=True,
                         name="packfmt-prefetch")
    stream.prefetchers.append(t)
    t.start()


def _run(ref, lookahead: int) -> None:
    """Fetch the plan's coming members in order while the limit allows (see the module doc), as long as the members
    object lives; once a second, let go of what this process holds idle past its share (``eviction.trim``)."""
    while True:
        stream = ref()
        if stream is None:
            return
        moves = stream.moves
        step = _step(stream, lookahead)
        if step is not True:
            stream.announce()  # (before cond: the ledger's lock comes first)
            with stream.cond:
                now = time.monotonic()
                if now - getattr(stream, "trimmed", 0.0) >= 1.0:  # (once a second, not once a wake of each thread)
                    stream.trimmed = now
                    stream.trim()
                if step is _BLOCKED:  # another thread is reserving the member before: until it has (or a second)
                    stream.work.wait(timeout=1.0)
                else:  # no room, or nothing to fetch: only a batch done here (or a new plan) changes that, or another
                    stream.work.wait_for(lambda: stream.moves != moves, timeout=1.0)  # process (a second stands for it)
        del stream


def _step(stream, lookahead: int):
    """Fetch the plan's next member missing here, if any and if it fits: True when it did, ``_NO_ROOM`` when it did
    not fit, ``_BLOCKED`` when another thread is giving the one before room, False when there was nothing to do."""
    todo = None
    with stream.cond:
        moves, gate = stream.moves, getattr(stream, "no_room", None)
        if gate is not None and gate[0] == moves and time.monotonic() - gate[1] < 1.0:
            return _NO_ROOM  # another thread found none since the last batch: the plan's next member fits no better
        plan = stream.plan
        for p, m in (plan.upcoming(lookahead) if plan is not None else ()):
            if m in stream.claimed:  # another thread has not reserved its room yet (``members._bring``): nothing
                return _BLOCKED  # past it before (a later member would take room the earlier one needs: fetched twice)
            if m in stream.resident or m in stream.fetching or m in stream.failed:
                continue
            todo = (p, m)
            stream.claimed.add(m)
            break
    if todo is None:
        return False
    p, m = todo
    done = True
    try:
        done = stream.fetch(m, before=p)
    except Exception:  # noqa: BLE001 - the batch that needs it fetches it again and reports the error
        done = True
    finally:
        with stream.cond:
            if m in stream.claimed:  # (not released after a reservation: the thread blocked behind it goes on)
                stream.claimed.discard(m)
                stream.work.notify()
            if not done:  # (16 threads each trying again after every batch kept the node's ledger busy)
                stream.no_room = (moves, time.monotonic())
            stream.cond.notify_all()
    return True if done else _NO_ROOM
