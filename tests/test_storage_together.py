"""``storage.in_flight.together``: a step's few requests at once, the first failure raised after all ended."""

from __future__ import annotations

import os
import threading

import pytest

from packfmt.storage.in_flight import together


def test_calls_run_at_once_and_results_keep_their_order():
    barrier = threading.Barrier(4, timeout=10)  # would break unless the four run at the same time

    def call(i):
        return lambda: (barrier.wait(), i)[1]

    assert together([call(i) for i in range(4)]) == [0, 1, 2, 3]


def test_the_first_failure_in_order_is_raised_once_every_call_ended():
    ended = []

    def ok(i):
        return lambda: ended.append(i)

    def bad(msg):
        def f():
            ended.append(msg)
            raise ValueError(msg)
        return f

    with pytest.raises(ValueError, match="first"):
        together([ok(0), bad("first"), bad("second"), ok(3)])
    assert sorted(map(str, ended)) == ["0", "3", "first", "second"]


def test_a_nested_call_on_the_pool_runs_in_its_own_thread():
    threads = []

    def inner():
        threads.append(threading.current_thread().name)

    def outer():
        together([inner, inner])  # on a pool thread: no request queued behind the pool's own waiting threads
        return threading.current_thread().name

    names = together([lambda: None] + [outer] * 70)  # more than the pool's threads, each nesting
    assert len(names) == 71 and len(threads) == 140


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_starts_its_own_pool():
    together([lambda: 1, lambda: 2])  # the parent's pool exists
    pid = os.fork()
    if pid == 0:
        ok = False
        try:
            ok = together([lambda: 1, lambda: 2]) == [1, 2]
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
