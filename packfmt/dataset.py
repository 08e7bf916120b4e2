"""``Dataset``: what a store and a collection both are (spec FORMAT §2, COLLECTION §6).

A store is read as a collection of one: member 0 is the store itself, so ``doc_start``,
``token_start`` and ``image_start`` have two entries and ``member(0)`` returns it. Everything
above (packing, validating, describing, exporting, the PyTorch reader) takes a ``Dataset`` and
walks its members, never asking which of the two it holds.

A subclass sets ``path``, ``manifest`` (with ``num_documents``, ``num_tokens``, ``num_images``),
the three running sums and ``all_trained``, and gives ``_shared()``, ``member(m)`` and
``index_binding()``. A dataset opened from a URL holds its ``origin`` (``storage.cache.Origin``), given to
its constructor.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from . import format as F
from .index import PackIndex, list_pack_indexes, open_pack_index

if TYPE_CHECKING:  # (storage is imported only for a URL)
    from .storage.cache import Origin

__all__ = ["Dataset", "running_sum"]


class Dataset:
    """Documents over one tokenizer, held by one or more member stores.

    Attributes:
        path: the directory.
        doc_start, token_start, image_start: int64 ``(members + 1,)`` running sums: member ``m``
            holds documents ``doc_start[m]:doc_start[m + 1]``, and so on.
        all_trained: per member, True when it has no loss mask of its own and reads as all ones
            in a dataset with one (spec/COLLECTION.md §2.3, §6).
        origin: where a dataset opened from a URL came from (its URL, storage options, cache and pins);
            None for a local path.
        streamed: True for a remote collection opened with ``stream=True``: its members are fetched as reads
            need them, and each segment is checked against its document's length when its member arrives.
    """

    path: Path
    doc_start: np.ndarray
    token_start: np.ndarray
    image_start: np.ndarray
    all_trained: tuple[bool, ...]
    origin: Origin | None = None
    streamed: bool = False

    @property
    def url(self) -> str:
        """The URL this dataset was opened from (``origin.url``). A dataset opened from a local path has none: an
        AttributeError, so ``getattr(ds, "url", default)`` and ``hasattr(ds, "url")`` tell the two apart."""
        if self.origin is None:
            raise AttributeError("url: this dataset was opened from a local path, not a URL")
        return self.origin.url

    def resident_members(self):
        """A ``collection.resident.ResidentMembers`` that maps the members a batch touches while it is read, or None
        when every member is mapped at once (a store, a collection within the mappings one process may hold)."""
        return None

    @property
    def location(self) -> str:
        """Where this dataset is, in the words its user gave: the URL it was opened from (``url``; its files are a
        mirror in the cache, a path no user typed), else its path. What messages and reports print."""
        return getattr(self, "url", None) or str(self.path)

    def segment_bounds(self) -> tuple[np.ndarray, bool, np.ndarray | None]:
        """What bounds a pack index's segments (V27, ``checks.segments``): ``(doc_offsets, False, None)``;
        ``(doc_lengths, True, None)`` for a dataset that holds its lengths rather than offsets; ``(bounds, False,
        doc_start)``, one bound per member, for one whose documents' lengths are not known yet."""
        return self.doc_offsets, False, None

    def _shared(self) -> dict:
        """``vocab_size``, ``token_dtype``, ``special_tokens``, ``loss_mask``: what every member agrees on."""
        raise NotImplementedError

    def member(self, m: int):
        """Member store ``m``, opened and checked."""
        raise NotImplementedError

    def index_binding(self) -> dict:
        """What a pack index of this dataset records to bind to it (FORMAT §4.1, COLLECTION §4)."""
        raise NotImplementedError

    # -- counts and tokenizer identity
    @property
    def num_documents(self) -> int:
        return self.manifest.num_documents

    @property
    def num_tokens(self) -> int:
        return self.manifest.num_tokens

    @property
    def num_images(self) -> int:
        return self.manifest.num_images

    @property
    def vocab_size(self) -> int:
        return self._shared()["vocab_size"]

    @property
    def token_dtype(self) -> str:
        return self._shared()["token_dtype"]

    @property
    def np_token_dtype(self) -> np.dtype:
        return F.TOKEN_DTYPES[self.token_dtype]

    @property
    def has_loss_mask(self) -> bool:
        return self._shared()["loss_mask"]

    @property
    def special_tokens(self) -> dict:
        return self._shared()["special_tokens"]

    def __len__(self) -> int:
        return self.num_documents

    # -- members
    @property
    def num_members(self) -> int:
        return self.doc_start.shape[0] - 1

    def member_of(self, docs: np.ndarray | int) -> np.ndarray | int:
        """Member of each document id (vectorised; ids must be in range)."""
        return np.searchsorted(self.doc_start, docs, side="right") - 1

    def locate(self, g: int) -> tuple[int, int]:
        """``(member, local document)`` of document ``g``."""
        if not -self.num_documents <= g < self.num_documents:
            raise IndexError(f"document {g} out of range [0, {self.num_documents})")
        g = int(g) % self.num_documents
        m = int(self.member_of(g))
        return m, g - int(self.doc_start[m])

    # -- pack indexes
    def pack_index_names(self) -> list[str]:
        """Names of the pack indexes under ``packs/`` (sorted; temporaries of unfinished writes excluded)."""
        return list_pack_indexes(self.path)

    def pack_index(self, name: str | None = None) -> PackIndex:
        """Open pack index ``name`` (default: the only one there is); see ``open_pack_index``."""
        return open_pack_index(self, name)


def running_sum(values: list[int]) -> np.ndarray:
    """int64 ``(len(values) + 1,)``: 0 then the running totals."""
    out = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(np.asarray(values, dtype=np.int64), out=out[1:])
    return out
