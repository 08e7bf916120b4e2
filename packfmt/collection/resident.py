"""What a reader holds per batch of a dataset whose members are mapped as batches need them (spec/READER.md).

``PackedDataset`` reads a dataset's members mapped end to end (``vmap``). When they cannot all be mapped at once, a
``ResidentMembers`` maps those a batch touches while the batch is read: ``collection.lazy_members.LocalMembers`` (a
local collection past ``lazy_members.MAP_BUDGET`` mappings) and ``remote.members.StreamedMembers`` (a remote
collection opened with ``stream=True``: each member fetched and verified first). ``Dataset.resident_members()``
returns one, or None when every member is mapped at once; the reader knows no more of it than this contract.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Protocol

import numpy as np

__all__ = ["ResidentMembers"]


class ResidentMembers(Protocol):
    """The members of one dataset mapped while batches hold them (thread-safe)."""

    #: The process that made it: a forked child (a DataLoader worker) makes its own.
    pid: int

    def source(self):
        """What the kernels read: every member's tokens, loss mask and document table in one reserved span each
        (``vmap.Reserved.source``), only the members held mapped."""

    def hold(self, packs: np.ndarray, pack_offsets: np.ndarray, segments: np.ndarray,
             label: str = "segments.bin") -> AbstractContextManager:
        """The members packs ``packs`` (valid ids of the index whose ``pack_offsets`` and ``segments`` these are)
        touch, mapped and kept so while the block runs; ``label``: the index's segments file, named by an error."""

    def images(self, m: int) -> AbstractContextManager:
        """A context giving member ``m``'s ``ImageStore`` (a member with images), kept while the block runs."""

    def ensure(self, m: int) -> None:
        """Member ``m`` mapped now (opened, or fetched, and checked first)."""
