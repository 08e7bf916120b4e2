"""A hard time limit for tests that talk to a server or a cluster (no pytest-timeout here)."""

from __future__ import annotations

import contextlib
import signal


@contextlib.contextmanager
def time_limit(seconds: int, what: str):
    """Raise ``TimeoutError`` in the test when it runs past ``seconds`` (SIGALRM; main thread only)."""
    def expired(signum, frame):
        raise TimeoutError(f"{what} ran past {seconds} s")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
