"""``Collection``: many stores read as one (spec/COLLECTION.md §6).

A collection is cheap to open (its manifest only) and to pickle (its path). Member stores are
opened when first needed, checked then (C2, C3: the member's manifest has the recorded checksum,
its counts and tokenizer identity are the collection's, and ``Store`` checks its own offsets),
and kept in a small LRU, so thousands of members never hold thousands of memory maps. The
documents' lengths (all that packing needs) are read without opening any member as a store:
each member is checked the same way first, from one read of its manifest and one of its
``doc_offsets.bin`` (``member_checks``). Collection-wide document ``g`` is local document ``g - doc_start[m]`` of member ``m``.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path

import numpy as np

from .. import format as F
from ..dataset import Dataset, running_sum
from ..errors import FormatError
from ..reader import Store
from .manifest import (
    CollectionManifest,
    Member,
    member_list_checksum,
    parse_collection_manifest,
)
from .member_checks import manifest_checksum, member_doc_lengths, member_problems
from .unify import ones_needed

__all__ = ["Collection", "DEFAULT_OPEN_MEMBERS"]

#: Member stores kept open at once (each holds 2-8 memory maps).
DEFAULT_OPEN_MEMBERS = 64


class Collection(Dataset):
    """A packfmt collection directory opened for reading.

    Attributes:
        path: the collection directory.
        manifest: the parsed ``CollectionManifest``.
        doc_start, token_start, image_start: int64 ``(members + 1,)`` running sums: member ``m``
            holds collection documents ``doc_start[m]:doc_start[m + 1]``, and so on.
    """

    def __init__(self, path: str | os.PathLike, *, max_open_members: int = DEFAULT_OPEN_MEMBERS) -> None:
        path = Path(path)
        self._init(path, parse_collection_manifest(F.read_json(path / F.MANIFEST, file=F.MANIFEST), file=F.MANIFEST),
                   max_open_members)

    @classmethod
    def _of_manifest(cls, path: Path, manifest: CollectionManifest) -> "Collection":
        """The collection at ``path`` whose manifest the caller has just parsed (``validate``: one parse per command)."""
        self = cls.__new__(cls)
        self._init(Path(path), manifest, DEFAULT_OPEN_MEMBERS)
        return self

    def _init(self, path: Path, manifest: CollectionManifest, max_open_members: int) -> None:
        self.path, self.manifest = path, manifest
        m = self.manifest.members
        self.doc_start = running_sum([x.documents for x in m])
        self.token_start = running_sum([x.tokens for x in m])
        self.image_start = running_sum([x.images for x in m])
        self.max_open_members = max(1, int(max_open_members))
        self._open: OrderedDict[int, Store] = OrderedDict()
        #: Per member: True when it has no loss mask of its own and reads as all ones (§2.3, §6).
        self.all_trained = tuple(ones_needed(self.manifest.shared, self.manifest.unified, [x.name for x in m]))
        self._ones = np.ones(0, dtype=F.MASK_DTYPE)
        self._binding: str | None = None

    def __getstate__(self) -> dict:
        return {"path": str(self.path), "max_open_members": self.max_open_members}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path"], max_open_members=state["max_open_members"])

    def __repr__(self) -> str:
        return (f"Collection({str(self.path)!r}, members={len(self.members)}, documents={self.num_documents}, "
                f"tokens={self.num_tokens}, dtype={self.token_dtype})")

    @property
    def members(self) -> tuple[Member, ...]:
        return self.manifest.members

    def _shared(self) -> dict:
        return self.manifest.shared

    def index_binding(self) -> dict:
        """What a pack index of this collection records to bind to it (spec/COLLECTION.md §4)."""
        if self._binding is None:  # the canonical JSON of every member entry: computed once per open collection
            self._binding = member_list_checksum(self.members)
        return {"collection": self._binding}

    # -- members
    def member_path(self, m: int) -> Path:
        return self.path / self.members[m].path

    def member(self, m: int) -> Store:
        """Member ``m`` opened (and checked on first open); least recently used ones are closed."""
        store = self._open.get(m)
        if store is not None:
            self._open.move_to_end(m)
            return store
        try:
            opened = Store(self.member_path(m))
        except FormatError:  # a collection listed as a member says so, and names a cycle
            nested = nested_collection_error(self.path, m, self.members[m])
            if nested is None:
                raise
            raise nested from None
        store = self._check_member(m, opened)
        self._open[m] = store
        while len(self._open) > self.max_open_members:
            self._open.popitem(last=False)
        return store

    def _check_member(self, m: int, store: Store) -> Store:
        problems = member_problems(self.manifest, m, manifest_checksum(store.manifest_bytes), store.manifest,
                                   store.path / F.MANIFEST)
        if problems:
            raise problems[0]
        return store

    # -- documents
    def document(self, g: int) -> np.ndarray:
        """Tokens of collection document ``g`` (a zero-copy view into its member)."""
        m, d = self.locate(g)
        return self.member(m).document(d)

    def document_loss_mask(self, g: int) -> np.ndarray | None:
        """The loss mask of collection document ``g``: a view of its member's, or read-only ones for a member
        without a mask in a collection with one (spec/COLLECTION.md §6); None when the collection has none."""
        m, d = self.locate(g)
        if self.all_trained[m]:
            return self.ones(len(self.member(m).document(d)))
        return self.member(m).document_loss_mask(d)

    def ones(self, n: int) -> np.ndarray:
        """A read-only uint8 array of ``n`` ones (a view of one buffer grown by doubling, never copied per call)."""
        if self._ones.shape[0] < n:
            self._ones = np.ones(max(n, 2 * self._ones.shape[0]), dtype=F.MASK_DTYPE)
            self._ones.flags.writeable = False
        return self._ones[:n]

    @property
    def doc_lengths(self) -> np.ndarray:
        """int64 ``(num_documents,)``: every member's lengths in order (8 bytes per document), each member
        checked as when it opens (C2, C3, its manifest, file sizes and V13) but not mapped
        (``member_checks.member_doc_lengths``)."""
        return member_doc_lengths(self.path, self.manifest, self.doc_start, lambda m: np.diff(self.member(m).doc_offsets))

    @property
    def doc_offsets(self) -> np.ndarray:
        """int64 ``(num_documents + 1,)``: the ``doc_offsets`` a physical merge would have (computed)."""
        out = np.zeros(self.num_documents + 1, dtype=np.int64)
        np.cumsum(self.doc_lengths, out=out[1:])
        return out


def nested_collection_error(root: Path, m: int, entry: Member) -> FormatError | None:
    """The error of member ``m`` of the collection at ``root`` when it is a collection (C2: a member is a
    store), naming the cycle when it is ``root`` itself or lists ``root``; None when it is not a collection.

    Nothing ever opens or validates such a member as a collection, so no cycle is followed.
    """
    from ..errors import PackfmtError
    from .manifest import is_collection

    path = root / entry.path
    try:
        obj = F.read_json(path / F.MANIFEST, file=F.MANIFEST)
    except (PackfmtError, OSError):
        return None
    if not is_collection(obj):
        return None
    listed = obj.get("members") if isinstance(obj.get("members"), list) else []
    listed = [x["path"] for x in listed if isinstance(x, dict) and isinstance(x.get("path"), str)]
    try:
        here = root.resolve()
        cycle = (" (this collection itself: a cycle)" if path.resolve() == here else
                 " (it lists this collection as a member: a cycle)" if any((path / p).resolve() == here for p in listed)
                 else "")
    except (OSError, RuntimeError, ValueError):  # a symlink loop, a NUL byte: no cycle can be named
        cycle = ""
    return FormatError(f"{F.MANIFEST}: members[{m}] ({entry.name}): path {entry.path!r} is a collection{cycle}, not a "
                       "store; a member must be a store (spec/COLLECTION.md C2): to combine collections, "
                       "`packfmt merge` their paths (it lists their stores)", file=F.MANIFEST,
                       field=f"members[{m}].path", expected="a store (C2)", found=f"a collection{cycle}")
