"""What the tests of a streamed read measure of the node's cache: its disk use as ``du`` counts it (allocated blocks
of every file and folder under the cache folder), and a ``cache_limit`` sized in members (the node's fixed files,
then room for ``k`` members as the node's ledger counts them: ``packfmt.remote.node_cache``)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from packfmt.storage.budget import PRESENT


def disk_use(root: Path) -> int:
    """Allocated bytes of everything under ``root`` (files and folders; what is deleted meanwhile counts 0)."""
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [dirpath, *(os.path.join(dirpath, n) for n in filenames)]:  # (a folder: once, as a dirpath)
            try:
                total += os.lstat(name).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


def ledger(ds):
    """The node's ledger of a ``PackedDataset`` opened with ``stream=True`` (``storage.budget.Budget``)."""
    return ds.store.resident_members().node.budget


def limit_in_members(ds, members: int) -> int:
    """A ``cache_limit`` for the collection ``ds`` (a ``PackedDataset`` with ``stream=True``, in a cache folder of its
    own) streams: its fixed files, and room for ``members`` of its largest member (by tokens: fetched here to be
    counted)."""
    store = ds.store
    store.resident_members().ensure(int(np.argmax(np.asarray(store.members.tokens))))
    b = ledger(ds)
    with b.transaction() as tx:
        fixed = tx.fixed
    return fixed + members * int(b.nbytes[b.state == PRESENT].max())


def limit_for(url: str, index: str, members: int, probe_dir: Path, **options) -> int:
    """``limit_in_members`` of a fresh reader of ``url``'s index ``index`` in the cache folder ``probe_dir``."""
    from packfmt.torch import PackedDataset

    return limit_in_members(PackedDataset(url, index, stream=True, cache_dir=probe_dir, **options), members)
