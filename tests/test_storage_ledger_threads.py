"""One transaction of the node's ledger at a time, among the threads of a process too (``storage.budget``).

A process reading a streamed collection runs transactions from several threads (its batches, its prefetch threads).
They share the ledger's descriptor, so its ``flock`` alone let a second thread in while the first was inside, and the
first to leave let go of the lock under the other: another process of the node then changed the ledger (deleted a
member, punched its index rows) while that thread was pinning the member. Found by test_storage_nodes_proof.py: a
member's ``doc_offsets.bin`` gone under the process that had just pinned it, and batches whose packs read as empty.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time

from packfmt.storage.budget import Budget


def _locked_elsewhere(path) -> bool:
    """Whether another open of the ledger (as another process has) is refused its lock now."""
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def test_a_second_thread_waits_for_the_first_ones_transaction(tmp_path):
    b = Budget(tmp_path / "ledger", 4, 1000)
    inside, leave, second_in = threading.Event(), threading.Event(), threading.Event()

    def first():
        with b.transaction():
            inside.set()
            leave.wait(10)

    def second():
        inside.wait(10)
        with b.transaction():
            second_in.set()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    try:
        assert inside.wait(10)
        assert not second_in.wait(0.5)  # kept out while the first is inside (it used to enter at once)
        assert _locked_elsewhere(b.path)
    finally:
        leave.set()
        for t in threads:
            t.join(10)
    assert second_in.is_set() and not _locked_elsewhere(b.path)


def test_a_transaction_inside_another_of_its_thread_keeps_the_lock(tmp_path):
    b = Budget(tmp_path / "ledger", 4, 1000)
    with b.transaction() as tx:
        with b.transaction():
            tx.reserve(1, 10)
        assert _locked_elsewhere(b.path)  # the inner one's end does not let go of the outer one's lock
    assert not _locked_elsewhere(b.path)
    with b.transaction() as tx:
        assert tx.used() == 10


def test_threads_counting_in_transactions_lose_no_update(tmp_path):
    """Each transaction reads a count, lets other threads run, and writes it back one more: an update lost to another
    thread inside at the same time would show as a smaller total."""
    b = Budget(tmp_path / "ledger", 4, None)
    threads = 4

    def count():
        for _ in range(100):
            with b.transaction() as tx:
                n = tx.other
                time.sleep(0)
                tx.other = n + 1

    pool = [threading.Thread(target=count) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(30)
    with b.transaction() as tx:
        assert tx.other == 100 * threads
