"""The node's cache budget (``packfmt.storage.budget``): one ledger shared by the processes of a node.

Real processes (fork) reserve, commit and drop items of one ledger at once; the count they keep never passes the
limit, every item is counted once however many processes use it, and a killed process's reservation comes back.
"""

from __future__ import annotations

import multiprocessing as mp
import os

import numpy as np
import pytest

from packfmt.storage.budget import ABSENT, PRESENT, RESERVED, Budget, disk_bytes

LIMIT = 10_000


def _worker(path, items, seed, rounds, out):
    """Take random items like a reader: present ones are used as they are; absent ones reserved (evicting the least
    recently used present ones first when the limit says so), then committed. Records every `used` it sees."""
    b = Budget(path, items, LIMIT)
    rng = np.random.default_rng(seed)
    seen = []
    for _ in range(rounds):
        item, size = int(rng.integers(items)), int(rng.integers(500, 3000))
        with b.transaction() as tx:
            if tx.state(item) == PRESENT:
                tx.touch([item])
                continue
            if tx.fetching_elsewhere(item):
                continue
            for victim in tx.present().tolist():
                if tx.room() >= size:
                    break
                tx.drop(victim)
            if tx.room() < size:
                continue
            tx.reserve(item, size)
            seen.append(tx.used())
        with b.transaction() as tx:  # (the download happens between the two)
            tx.commit(item, size)
            seen.append(tx.used())
    out.put(max(seen) if seen else 0)


def test_processes_sharing_a_ledger_stay_inside_the_limit(tmp_path):
    path = tmp_path / "ledger"
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(path, 40, s, 300, out)) for s in range(4)]
    for p in procs:
        p.start()
    peaks = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert 0 < max(peaks) <= LIMIT
    b = Budget(path, 40, LIMIT)
    with b.transaction() as tx:
        assert not tx.reclaim()  # every reservation was committed
        assert tx.used() == int(b.nbytes[b.state == PRESENT].sum()) <= LIMIT


def _reserve_and_die(path):
    b = Budget(path, 8, LIMIT)
    with b.transaction() as tx:
        tx.reserve(3, 4000)
    os._exit(0)  # killed mid-download: no commit, no cleanup


def test_a_dead_processs_reservation_comes_back(tmp_path):
    path = tmp_path / "ledger"
    b = Budget(path, 8, LIMIT)
    with b.transaction() as tx:
        tx.reserve(1, 1000)
        tx.commit(1, 1200)
    p = mp.get_context("fork").Process(target=_reserve_and_die, args=(path,))
    p.start()
    p.join(60)
    with b.transaction() as tx:
        assert tx.state(3) == RESERVED and tx.used() == 5200
        assert not tx.fetching_elsewhere(1)
        assert tx.reclaim() == [3]  # its slot's lock died with it
        assert tx.state(3) == ABSENT and tx.used() == 1200 and tx.state(1) == PRESENT  # what it left stays


def test_a_live_processs_reservation_is_its_own(tmp_path):
    path = tmp_path / "ledger"
    a, b = Budget(path, 4, LIMIT), Budget(path, 4, LIMIT)
    assert a.slot != b.slot
    with a.transaction() as tx:
        tx.reserve(2, 100)
    with b.transaction() as tx:
        assert tx.fetching_elsewhere(2) and not tx.reclaim()
    a.close()
    with b.transaction() as tx:
        assert not tx.fetching_elsewhere(2) and tx.reclaim() == [2]


def test_a_reused_slot_gives_back_what_its_last_holder_reserved(tmp_path):
    """Slots are reused: the next process takes the dead one's slot number, and the reservation it finds under it is
    not its own (before, it was taken for a live fetch by everyone: two DataLoader workers waited on it for ever)."""
    path = tmp_path / "ledger"
    b = Budget(path, 8, LIMIT)
    p = mp.get_context("fork").Process(target=_reserve_and_die, args=(path,))
    p.start()
    p.join(60)
    c = Budget(path, 8, LIMIT)  # the first free slot: the dead child's
    with b.transaction() as tx:
        assert int(b.slot_of[3]) == c.slot and tx.fetching_elsewhere(3)  # (a live slot: b cannot tell)
    with c.transaction() as tx:
        assert not tx.fetching_elsewhere(3)
        assert tx.reclaim() == [3] and tx.state(3) == ABSENT
        tx.reserve(5, 100)
        assert tx.reclaim() == []  # what it reserved itself stays its own
    with b.transaction() as tx:
        assert tx.fetching_elsewhere(5)


def _hold_until(ready, event):
    ready.set()  # (its fork hooks ran before this line: the copies of the parent's descriptors are closed)
    event.wait(60)
    os._exit(0)


def test_a_forked_child_does_not_hold_its_parents_slot(tmp_path):
    """A DataLoader worker is forked with its parent's descriptors; the parent's slot is not held by it (the lock
    belongs to the shared open file): once the parent lets go, its reservations come back while the child lives."""
    path = tmp_path / "ledger"
    a = Budget(path, 4, LIMIT)
    ctx = mp.get_context("fork")
    ready, event = ctx.Event(), ctx.Event()
    child = ctx.Process(target=_hold_until, args=(ready, event))
    child.start()
    try:
        assert ready.wait(60)
        with a.transaction() as tx:
            tx.reserve(2, 100)
        a.close()
        b = Budget(path, 4, LIMIT)
        with b.transaction() as tx:
            assert tx.reclaim() == [2]
        assert child.is_alive()
    finally:
        event.set()
        child.join(60)


def test_a_ledger_of_other_items_begins_again(tmp_path):
    path = tmp_path / "ledger"
    b = Budget(path, 4, LIMIT)
    with b.transaction() as tx:
        tx.fixed, tx.other = 300, 50
        tx.reserve(0, 10)
        tx.commit(0, 10)
    assert not Budget(path, 4, LIMIT).fresh
    again = Budget(path, 5, LIMIT)
    assert again.fresh
    with again.transaction() as tx:
        assert tx.used() == 0 and (tx.state(0), tx.fixed) == (ABSENT, 0)


def test_least_recently_used_first(tmp_path):
    b = Budget(tmp_path / "ledger", 6, None)
    with b.transaction() as tx:
        for i in (4, 1, 5):
            tx.reserve(i, 1)
            tx.commit(i, 1)
        tx.touch([4])
        assert tx.present().tolist() == [1, 5, 4] and tx.room() is None


@pytest.mark.parametrize("size", [0, 1, 4097])
def test_disk_bytes_counts_allocated_blocks(tmp_path, size):
    f = tmp_path / "f"
    f.write_bytes(b"x" * size)
    assert disk_bytes([f]) == os.stat(f).st_blocks * 512 and disk_bytes([tmp_path / "missing"]) == 0


def test_a_want_lease_is_seen_by_every_process_and_lapses(tmp_path):
    import time

    path = tmp_path / "ledger"
    a, b = Budget(path, 4, LIMIT), Budget(path, 4, LIMIT)
    with a.transaction() as tx:
        tx.want([1, 3], time.monotonic_ns() + 60 * 10**9)
        tx.want([2], time.monotonic_ns() - 1)  # lapsed already
    with b.transaction() as tx:
        assert tx.wanted([0, 1, 2, 3]).tolist() == [False, True, False, True]


def test_a_lease_given_back_ends_unless_another_process_holds_one_too(tmp_path):
    """``unwant``: this process's leases end now; an item another process leased too stays wanted (whichever leased
    last), so a reader done with a shard never takes back its sibling's claim on it. A process that takes a dead
    one's slot does not inherit its leases."""
    import time

    path = tmp_path / "ledger"
    a, b = Budget(path, 4, LIMIT), Budget(path, 4, LIMIT)
    mine = time.monotonic_ns() + 60 * 10**9
    with b.transaction() as tx:
        tx.want([2, 3], mine - 10**9)  # b reads members 2 and 3 too (its lease the earlier one)
    with a.transaction() as tx:
        tx.want([0, 1, 2], mine)
        assert tx.leased_here([0, 1, 2, 3]).tolist() == [True, True, True, False]
        tx.unwant([0, 1, 2])
    with b.transaction() as tx:
        assert tx.wanted([0, 1, 2, 3]).tolist() == [False, False, True, True]
    slot = b.slot
    b.close()
    c = Budget(path, 4, LIMIT)  # b's slot, reused
    assert c.slot == slot
    with c.transaction() as tx:
        assert tx.wanted([0, 1, 2, 3]).tolist() == [False, False, False, False]


def test_try_transaction_gives_none_while_another_thread_or_process_holds_the_ledger(tmp_path):
    import threading

    path = tmp_path / "ledger"
    a, b = Budget(path, 4, LIMIT), Budget(path, 4, LIMIT)
    with a.transaction():
        with b.try_transaction() as tx:
            assert tx is None  # another process (another description of the file) holds its flock
        held, done = [], threading.Event()

        def other_thread():
            with a.try_transaction() as tx:
                held.append(tx)
            done.set()

        threading.Thread(target=other_thread).start()
        assert done.wait(10) and held == [None]  # this process's other thread: not let in beside this one
        with a.try_transaction() as tx:  # the same thread, inside its own: as transaction() does
            assert tx is not None
    with b.try_transaction() as tx:
        assert tx is not None
        tx.reserve(1, 10)
    with a.transaction() as tx:
        assert tx.state(1) == RESERVED
