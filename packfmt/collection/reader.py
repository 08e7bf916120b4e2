"""``Collection``: many stores read as one (spec/COLLECTION.md §6).

A collection is cheap to open (its manifest only) and to pickle (its path). Member stores are
opened when first needed, checked then (C2, C3: the member's manifest has the recorded checksum,
its counts and tokenizer identity are the collection's, and ``Store`` checks its own offsets),
and kept in a small LRU, so thousands of members never hold thousands of memory maps. The
documents' lengths (all that packing needs) come from the collection's own ``doc_lengths.bin``
(``collection.lengths``: one read, its checksum and C7 checked; no member touched); once they are
read, every member opened is also checked to have exactly its slice of them (before any offset of it
is used). A collection without the file (written before 1.3, or a mirror that lacks it) reads them
from its members instead, each checked the same way first, from one read of its manifest and one of
its ``doc_offsets.bin`` (``member_checks``). Collection-wide document ``g`` is local document
``g - doc_start[m]`` of member ``m``.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from functools import cached_property
from pathlib import Path

import numpy as np

from .. import format as F
from ..dataset import Dataset, running_sum
from ..errors import FormatError
from ..reader import Store
from .arrays import whole_array
from .images import CollectionImages
from . import lazy_members
from .lengths import member_lengths_problem, read_lengths
from .manifest import (
    CollectionManifest,
    Member,
    collection_reader,
    member_list_checksum,
    parse_collection_manifest,
)
from .member_table import NAMES_FILE, listed_paths
from .member_checks import (changed_member, first_changed_member, manifest_checksum, member_doc_lengths, member_error,
                            member_problems)
from .unify import ones_needed

__all__ = ["Collection", "DEFAULT_OPEN_MEMBERS"]

#: Member stores kept open at once (each holds 2-8 memory maps).
DEFAULT_OPEN_MEMBERS = 64


class Collection(Dataset):
    """A packfmt collection directory opened for reading: the store a physical merge of its members would be
    (spec/COLLECTION.md §6), with every public attribute of ``Store`` (``tests/test_collection_as_store.py``).

    Attributes:
        path: the collection directory.
        manifest: the parsed ``CollectionManifest``; ``manifest_bytes`` its ``manifest.json`` as read.
        doc_start, token_start, image_start: int64 ``(members + 1,)`` running sums: member ``m``
            holds collection documents ``doc_start[m]:doc_start[m + 1]``, and so on.
        tokens, loss_mask: every token and mask bit in collection order (``arrays.MemberArray``: read member by
            member as indexed, a slice inside one member a view of its memmap; loss_mask None without one).
        images: a ``CollectionImages`` (``ImageStore``'s interface, collection-wide ids), or None without images.
    """

    def __init__(self, path: str | os.PathLike, *, max_open_members: int = DEFAULT_OPEN_MEMBERS, origin=None) -> None:
        """``origin``: where a collection opened from a URL came from (``storage.cache.Origin``; ``packfmt.open``)."""
        path = Path(path)
        raw = F.read_json_bytes(path / F.MANIFEST, file=F.MANIFEST)
        self._init(path, parse_collection_manifest(F.parse_json(raw, file=F.MANIFEST), file=F.MANIFEST,
                                                   read=collection_reader(path)), max_open_members)
        self._manifest_bytes = raw
        self.origin = origin

    @classmethod
    def _of_manifest(cls, path: Path, manifest: CollectionManifest) -> "Collection":
        """The collection at ``path`` whose manifest the caller has just parsed (``validate``: one parse per command)."""
        self = cls.__new__(cls)
        self._init(Path(path), manifest, DEFAULT_OPEN_MEMBERS)
        return self

    def _init(self, path: Path, manifest: CollectionManifest, max_open_members: int) -> None:
        self.path, self.manifest = path, manifest
        m = self.manifest.members
        self.doc_start = running_sum(m.documents)
        self.token_start = running_sum(m.tokens)
        self.image_start = running_sum(m.images)
        self.max_open_members = max(1, int(max_open_members))
        self._open: OrderedDict[int, Store] = OrderedDict()
        #: Per member: True when it has no loss mask of its own and reads as all ones (§2.3, §6).
        self.all_trained = all_trained(self.manifest)
        self._ones = np.ones(0, dtype=F.MASK_DTYPE)
        self._binding: str | None = None
        #: ``doc_lengths.bin``, once read and checked (``doc_lengths``); every member opened since is compared with it.
        self._lengths: np.ndarray | None = None
        self._manifest_bytes: bytes | None = None  # read at open by __init__, else on first use

    def __getstate__(self) -> dict:
        return {"path": str(self.path), "max_open_members": self.max_open_members}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path"], max_open_members=state["max_open_members"])

    def __repr__(self) -> str:
        return (f"Collection({str(self.path)!r}, members={len(self.members)}, documents={self.num_documents}, "
                f"tokens={self.num_tokens}, dtype={self.token_dtype})")

    @property
    def members(self):
        """The member entries (``Sequence[Member]``, with int64 columns ``documents``, ``tokens``, ``images``)."""
        return self.manifest.members

    def _shared(self) -> dict:
        return self.manifest.shared

    def resident_members(self):
        """A new ``lazy_members.LocalMembers`` (each reader maps its own) when ``lazy_members.lazy`` says so (many
        members); else None (``vmap.concatenate_members`` maps them all at the first read)."""
        if self.num_members > 1 and lazy_members.lazy(self):
            return lazy_members.LocalMembers(self)
        return None

    def index_binding(self) -> dict:
        """What a pack index of this collection records to bind to it (spec/COLLECTION.md §4)."""
        if self._binding is None:  # the canonical JSON of every member entry: computed once per open collection
            self._binding = member_list_checksum(self.members)
        return {"collection": self._binding}

    @property
    def manifest_bytes(self) -> bytes:
        """The bytes of the collection's ``manifest.json`` (as read at open; read now for one opened from a parsed
        manifest, ``_of_manifest``)."""
        if self._manifest_bytes is None:
            self._manifest_bytes = F.read_json_bytes(self.path / F.MANIFEST, file=F.MANIFEST)
        return self._manifest_bytes

    # -- collection-wide arrays: the physical merge's, read from the members (COLLECTION §6)
    @cached_property
    def tokens(self):
        """Every token in collection order, indexable by collection-wide token offset (``arrays.whole_array``)."""
        return whole_array(self, "tokens")

    @cached_property
    def loss_mask(self):
        """Every mask bit in collection order (ones for a member without a mask, §6), or None without a loss mask."""
        return whole_array(self, "loss_mask")

    @cached_property
    def images(self):
        """The images, collection-wide (``CollectionImages``), or None when the collection has none."""
        return CollectionImages(self) if self.num_images > 0 else None

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
        except FormatError as exc:  # a collection listed as a member says so, and names a cycle
            nested = nested_collection_error(self.path, m, self.members[m])
            raise (member_error(exc, self.members[m]) if nested is None else nested) from None
        store = self._check_member(m, opened)
        self._open[m] = store
        while len(self._open) > self.max_open_members:
            self._open.popitem(last=False)
        return store

    def check_members_unchanged(self) -> None:
        """C3 of every member (its ``manifest.json`` has the recorded checksum), one read each and no member opened:
        what a command that reads the collection's own lengths, but binds its output to the members, checks first
        (``packfmt pack``). Raises the first changed member's ``FormatError``, naming the fix."""
        changed = first_changed_member(self.path, self.manifest)
        if changed is not None:
            m, found, where = changed
            nested = nested_collection_error(self.path, m, self.members[m])  # a cycle is named as such, as at open
            raise nested if nested is not None else changed_member(self.manifest, m, found, where)

    def _check_member(self, m: int, store: Store) -> Store:
        """C2, C3 of member ``m`` opened as ``store``; and, once this collection's lengths were read from
        ``doc_lengths.bin``, C7: its own lengths are its slice of them (SECURITY.md A20)."""
        problems = member_problems(self.manifest, m, manifest_checksum(store.manifest_bytes), store.manifest,
                                   store.path / F.MANIFEST)
        if problems:
            raise problems[0]
        if self._lengths is not None:
            self._check_member_lengths(m, store)
        return store

    def _check_member_lengths(self, m: int, store: Store) -> None:
        a, b = int(self.doc_start[m]), int(self.doc_start[m + 1])
        problem = member_lengths_problem(self.manifest, m, a, np.diff(store.doc_offsets), self._lengths[a:b],
                                         store.path / F.DOC_OFFSETS)
        if problem is not None:
            raise problem

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
        """int64 ``(num_documents,)``: every document's length in order (8 bytes per document), read-only.

        From ``doc_lengths.bin`` when the collection has it (read once, checksum and C7 checked; the members
        opened so far, and every one opened later, compared with their slices), else from every member,
        each checked as when it opens (C2, C3, its manifest, file sizes and V13) but not mapped
        (``member_checks.member_doc_lengths``)."""
        if self._lengths is None:
            lengths = read_lengths(self.path, self.manifest)
            if lengths is None:  # no record (or none in this mirror): the members themselves
                return member_doc_lengths(self.path, self.manifest, self.doc_start,
                                          lambda m: np.diff(self.member(m).doc_offsets))
            self._lengths = lengths
            for m, store in list(self._open.items()):  # opened before the record was read: compared now
                try:
                    self._check_member_lengths(m, store)
                except FormatError:
                    self._lengths = None
                    raise
        return self._lengths

    def segment_bounds(self) -> tuple[np.ndarray, bool, None]:
        """Its lengths (``doc_lengths``, held anyway): an index is checked without an offsets array (V27)."""
        return self.doc_lengths, True, None

    @property
    def doc_offsets(self) -> np.ndarray:
        """int64 ``(num_documents + 1,)``: the ``doc_offsets`` a physical merge would have (computed)."""
        out = np.zeros(self.num_documents + 1, dtype=np.int64)
        np.cumsum(self.doc_lengths, out=out[1:])
        return out


def all_trained(manifest: CollectionManifest) -> tuple[bool, ...]:
    """Per member: True for a member without a loss mask of its own, read as all ones (§2.3, §6). Member
    names are looked at only when ``unified`` lists some (never at 10^5 members of one kind)."""
    if manifest.shared["loss_mask"] and manifest.unified.get("loss_mask"):
        return tuple(ones_needed(manifest.shared, manifest.unified, manifest.members.names))
    return (False,) * len(manifest.members)


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
    def names() -> bytes | None:  # §2.5: a table's paths are in member_names.txt
        try:
            with open(path / NAMES_FILE, "rb") as fh:
                return fh.read(64 << 20)  # a bound, as for a manifest: naming a cycle needs no more
        except OSError:
            return None

    listed = listed_paths(obj.get("members"), names)
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
