"""Time limits for tests that talk to a server or a cluster (no pytest-timeout here), scaled by the machine's load.

A limit is a base number of seconds for an idle machine, multiplied by ``load_factor()``: the 1-minute load
average per core, at least 1. A fixture that waits a fixed 30 s for a server failed at a load of 28 on 2
cores, where everything runs about 14 times slower; a limit scaled so still catches a hang, later.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Callable


def load_factor() -> float:
    """``max(1, load average / cores)``: how many times slower than idle this machine runs now (1-minute load)."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average on this platform
        return 1.0
    return max(1.0, load / cores())


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def scaled(seconds: float) -> float:
    """``seconds`` (a limit on an idle machine) times ``load_factor()``."""
    return seconds * load_factor()


def describe(base_s: float, limit_s: float) -> str:
    """How a limit was reached, for failure messages: the base, the factor, the load and the cores."""
    try:
        load = f"{os.getloadavg()[0]:.1f}"
    except OSError:
        load = "unknown"
    return (f"{limit_s:.0f} s (base {base_s:g} s on an idle machine x load factor {limit_s / base_s:.1f}; "
            f"load average now {load} on {cores()} cores)")


def wait_until(ready: Callable[[], bool], what: str, base_s: float, *, alive: Callable[[], bool] | None = None,
               poll_s: float = 0.1) -> float:
    """Poll ``ready()`` until it is true; return the seconds waited.

    Raises ``RuntimeError`` naming ``what`` when the limit (``scaled(base_s)``, measured when the wait starts)
    passes, or at once when ``alive()`` turns false (the server process exited).
    """
    limit = scaled(base_s)
    start = time.monotonic()
    while not ready():
        waited = time.monotonic() - start
        if alive is not None and not alive():
            raise RuntimeError(f"{what}: the process exited after {waited:.1f} s before it was ready")
        if waited > limit:
            raise RuntimeError(f"{what}: not ready after {describe(base_s, limit)}")
        time.sleep(poll_s)
    return time.monotonic() - start


@contextlib.contextmanager
def time_limit(seconds: int, what: str):
    """Raise ``TimeoutError`` in the test when it runs past ``scaled(seconds)`` (SIGALRM; main thread only)."""
    limit = max(1, round(scaled(seconds)))

    def expired(signum, frame):
        raise TimeoutError(f"{what} ran past {describe(seconds, limit)}")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(limit)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
