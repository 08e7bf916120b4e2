"""Where a sampler tells the processes that read what they read next (``prefetch.prefetch(ds, sampler)``).

The sampler lives in the process that iterates it (the training loop's); the packs are read there or in DataLoader
workers, which only see the batches they are handed. So at every ``iter(sampler)`` (each epoch, and a resumed one
from the position it resumes at: ``load_state_dict``, also inside torchdata's ``StatefulDataLoader``) the sampler
writes the packs that iteration yields into one file, replaced whole (a temp file renamed over it), before the first
index leaves it; every reading process looks at that file's identity before each batch and plans from it when it
changed. Plain int64 values, nothing pickled: what a process reads from it is pack ids, which the plan bounds.
"""

from __future__ import annotations

import os
import tempfile
import uuid
import weakref

import numpy as np

__all__ = ["Channel", "publish", "read", "identity"]


class Channel:
    """A file for one sampler's pending packs, removed when this object goes (in the process that made it)."""

    def __init__(self) -> None:
        self.path = os.path.join(tempfile.gettempdir(), f"packfmt-plan-{os.getpid()}-{uuid.uuid4().hex[:12]}.i8")
        self._finalizer = weakref.finalize(self, _remove, self.path, os.getpid())


def _remove(path: str, pid: int) -> None:
    if os.getpid() == pid:  # (a forked child never removes its parent's file)
        try:
            os.unlink(path)
        except OSError:
            pass


def publish(path: str, packs: np.ndarray) -> None:
    """``packs`` (int64) at ``path``, replacing what was there in one rename."""
    tmp = f"{path}.{os.getpid()}-{uuid.uuid4().hex[:8]}"
    np.ascontiguousarray(packs, dtype="<i8").tofile(tmp)
    os.replace(tmp, path)


def identity(path: str) -> tuple | None:
    """What changes whenever ``publish`` replaces the file (None: no file)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def read(path: str) -> np.ndarray | None:
    """The packs last published at ``path`` (None: none yet)."""
    try:
        return np.fromfile(path, dtype="<i8").astype(np.int64, copy=False)
    except OSError:
        return None
