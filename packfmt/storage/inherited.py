"""Lock descriptors a forked child lets go of at once (README "Remote data").

A node's cache is shared through ``flock`` locks: a process slot of the ledger (``budget``), a pin per member a
process reads (``remote.node_cache``). A lock belongs to an open file description, and ``fork`` (a DataLoader worker)
shares the parent's descriptions with the child: a slot or a pin the parent lets go of would stay held for as long
as any child lives, so a member it read could never be evicted and a dead fetch never reclaimed. Every object that
holds such descriptors registers here; in a forked child each one closes its copies (``drop_inherited``) before any
code of the child runs. The child opens its own (``PackedDataset._views``: a worker opens its own members)."""

from __future__ import annotations

import os
import weakref

__all__ = ["close_in_child"]

_owners: weakref.WeakSet = weakref.WeakSet()


def close_in_child(owner) -> None:
    """``owner.drop_inherited()`` runs in every child this process forks from now on (while ``owner`` lives)."""
    _owners.add(owner)


def _after_fork_in_child() -> None:
    owners = list(_owners)
    _owners.clear()
    for owner in owners:
        try:
            owner.drop_inherited()
        except OSError:
            pass


os.register_at_fork(after_in_child=_after_fork_in_child)
