"""Members of a remote collection fetched several at once (``remote.mirror.mirror_dataset``), in member order.

A whole fetch of a collection (``packfmt.open(url)`` without ``stream=True``, ``fetch_dataset``) costs each member a
few round trips to the object store (its manifest, then each file: one ranged GET for a small one). One after
another, 1,000 members at a 30 ms round trip wait two minutes for latency alone; ``members_in_flight()`` of them at
once overlap those waits (``benchmarks/bench_fetch.py --members``). Every file is still fetched, hashed and checked
as ``cache.Fetcher.file`` does; only the order in which members finish changes. An error is the one a fetch in
member order would raise first: the lowest member that fails among those started, after the ones in flight end.
"""

from __future__ import annotations

import os
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

__all__ = ["MEMBERS_ENV", "MEMBERS_IN_FLIGHT", "members_in_flight", "env_count", "in_order"]

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
