"""Requests run at once: members of a remote collection fetched several at once (``remote.mirror.mirror_dataset``), in
member order (``in_order``); the few requests of one step, each a round trip, overlapped (``together``).

A whole fetch of a collection (``packfmt.open(url)`` without ``stream=True``, ``fetch_dataset``) costs each member a
few round trips to the object store (its manifest, then each file: one ranged GET for a small one). One after
another, 1,000 members at a 30 ms round trip wait two minutes for latency alone; ``members_in_flight()`` of them at
once overlap those waits (``benchmarks/bench_fetch.py --members``). Every file is still fetched, hashed and checked
as ``cache.Fetcher.file`` does; only the order in which members finish changes. An error is the one a fetch in
member order would raise first: the lowest member that fails among those started, after the ones in flight end.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

__all__ = ["MEMBERS_ENV", "MEMBERS_IN_FLIGHT", "members_in_flight", "env_count", "in_order", "together"]

#: Members of a collection fetched at once by a whole fetch. Memory: each may hold ``download.RANGES_IN_FLIGHT``
#: chunks of 8 MiB of the file it is fetching (8 x 4 x 8 MiB = 256 MiB at most; a small member holds its bytes).
MEMBERS_IN_FLIGHT = 8
MEMBERS_ENV = "PACKFMT_FETCH_MEMBERS"


def members_in_flight() -> int:
    """``$PACKFMT_FETCH_MEMBERS`` (1-64), else ``MEMBERS_IN_FLIGHT``."""
    return env_count(MEMBERS_ENV, MEMBERS_IN_FLIGHT, "members of a collection fetched at once; 1 fetches one member "
                     "after another")


def env_count(name: str, default: int, what: str, most: int = 64) -> int:
    """The integer in ``[1, most]`` that environment variable ``name`` holds, ``default`` when unset or blank; a
    ValueError naming it, the range, ``what`` it counts and the default otherwise."""
    raw = os.environ.get(name, "")
    if not raw.strip():
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if not 1 <= value <= most:
        raise ValueError(f"${name}: expected an integer in [1, {most}] ({what}), found {raw!r}; unset it for the "
                         f"default {default}")
    return value


def in_order(fn: Callable[[int], object], n: int, k: int) -> None:
    """``fn(0) .. fn(n - 1)``, up to ``k`` at once in threads (at most ``2 k`` started ahead of the oldest one
    unfinished), each one's result awaited in order; the first exception in that order is raised once the calls in
    flight end, and no call not yet started starts after it. ``k <= 1``: one after another in this thread."""
    if k <= 1 or n <= 1:
        for i in range(n):
            fn(i)
        return
    with ThreadPoolExecutor(k, thread_name_prefix="packfmt-members") as pool:
        pending: deque = deque()
        nxt = 0
        try:
            while nxt < n or pending:
                while nxt < n and len(pending) < 2 * k:
                    pending.append(pool.submit(fn, nxt))
                    nxt += 1
                pending.popleft().result()
        except BaseException:
            for f in pending:
                f.cancel()
            raise


#: Threads of the process-wide pool that ``together`` runs requests on (each mostly waits for a round trip).
TOGETHER_THREADS = 64
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()
_inside = threading.local()  # set in the pool's threads: a nested ``together`` runs its calls in its own thread


def together(calls: list) -> list:
    """The results of ``calls`` (callables without arguments), run at once: the first in this thread, the others on a
    process-wide pool (one request's round trip waits beside the others'; no thread started per call). Once every
    call ended, the first exception in ``calls``' order is raised. A call already running on the pool runs a nested
    ``together`` one call after another in its own thread (a pool whose threads all wait for calls queued behind
    them would never go on)."""
    if len(calls) <= 1 or getattr(_inside, "yes", False):
        return [c() for c in calls]
    pool = _shared_pool()
    futures = [pool.submit(_marked, c) for c in calls[1:]]
    out, first = [None] * len(calls), None
    try:
        out[0] = calls[0]()
    except BaseException as exc:  # noqa: BLE001 - raised below, once the others ended
        first = exc
    for i, f in enumerate(futures, 1):
        try:
            out[i] = f.result()
        except BaseException as exc:  # noqa: BLE001
            first = first or exc
    if first is not None:
        raise first
    return out


def _marked(call):
    _inside.yes = True
    return call()


def _shared_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(TOGETHER_THREADS, thread_name_prefix="packfmt-request")
        return _pool


def _forget_pool() -> None:  # a forked child has none of its parent's threads: it starts its own pool when it needs one
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_pool)
