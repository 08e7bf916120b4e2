"""The sampler's numba kernels loaded in the background while a remote dataset opens (README "Remote data").

A process's first numba kernel pays numba's own start (its compiler and code generator set up, then the kernel's
machine code read from its cache): 0.3-0.7 s, spent by ``DistributedPackSampler`` (``_deal``) right after a streamed
``PackedDataset`` opened. That open is mostly round trips to the object store, so the kernels are loaded meanwhile,
in a thread (``start``: once a process, from ``PackedDataset`` given a URL); the sampler then finds them loaded
(numba's compiler lock makes a call wait for a load in flight, never load twice). The calls here take the same
argument types as the sampler's, so the same machine code is loaded; nothing they return is used.
"""

from __future__ import annotations

import threading

import numpy as np

__all__ = ["start"]

_started = threading.Lock()
_done = False


def start() -> None:
    """Load the kernels in a daemon thread, once a process."""
    global _done
    with _started:
        if _done:
            return
        _done = True
    threading.Thread(target=_load, daemon=True, name="packfmt-warm").start()


def _load() -> None:
    try:
        from . import _deal

        runs, _ = _deal.group_runs(np.zeros(2, dtype=np.int64))  # int64 groups, int32 runs
        _deal.window_order(runs, 0, 0, 1)  # int64 keys, int32 windows and pairs
        for w in (np.ones((1, 2), dtype=np.int32), np.ones((1, 2), dtype=np.int64)):  # balance="tokens" weights
            _deal.deal_balanced(np.zeros((1, 2), dtype=np.int64), w)
    except Exception:  # noqa: BLE001 - only a head start: the sampler loads (and reports) them itself
        pass
