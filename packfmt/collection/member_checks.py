"""A collection's members checked without opening them as stores (spec/COLLECTION.md C2, C3; FORMAT.md §6).

``member_problems`` is C2 and C3 of one member, as ``FormatError`` objects (what ``Collection.member``
raises and ``validate`` reports). ``member_doc_lengths`` is what a command that needs only the
documents' lengths (packing, describing, the mixture planners) asks of every member of a collection
without ``doc_lengths.bin`` (written before format 1.3, or a mirror without it: ``collection.lengths``),
and what ``validate`` compares that record with: its manifest has
the recorded checksum (C3, hashed from the very bytes that are then parsed), it is a store with the
recorded counts and the collection's shared keys (C2; V1-V11 of its manifest and files table), and
its ``doc_offsets.bin`` holds valid offsets (V13), all checked before a length is computed from
them. These are the checks ``Store`` and ``Collection.member`` make when a member opens; here they
cost one read of the manifest and one of ``doc_offsets.bin`` per member, with no memory map and no
``Store`` object, and V13 runs once over the offsets of many members at a time. A manifest whose bytes
match those of one already checked but for its counts, sizes and checksums (every member by one writer:
``member_template``) is checked by that match instead of a parse. A member with images
(V14, V15, V19), one larger than a group, and any member a check here refuses take the long way:
opened as a ``Store`` (which checks it as always and raises the error with the same words), or, for
``validate``, that member's own full checks (which report everything).
"""

from __future__ import annotations

import os
from typing import Callable

import numpy as np
import xxhash
from xxhash import xxh3_64_intdigest

from .. import format as F
from ..errors import FormatError, PackfmtError
from ..mapped import check_files_table
from .manifest import CollectionManifest, is_collection
from .member_template import MAX_TEMPLATES, Template, listed_in
from .unify import member_differences

__all__ = ["member_error", "member_problems", "member_doc_lengths", "first_changed_member", "changed_member", "GROUP_OFFSETS"]

#: Offsets of consecutive members read end to end and checked (V13) in one vectorised pass: 8 MiB.
GROUP_OFFSETS = 1 << 20


def member_problems(coll: CollectionManifest, m: int, found_checksum: str, sm: F.Manifest, where) -> list:
    """C2 (counts and shared keys) and C3 (manifest checksum) of member ``m``, as ``FormatError`` objects.

    ``sm`` is the member's parsed manifest and ``found_checksum`` that of its bytes at ``where``.
    """
    entry, label = coll.members[m], f"{F.MANIFEST}: members[{m}] ({coll.members[m].name})"
    out = []
    if found_checksum != entry.manifest:
        out.append(changed_member(coll, m, found_checksum, where))
    for key, value in (("documents", sm.num_documents), ("tokens", sm.num_tokens), ("images", sm.num_images)):
        if getattr(entry, key) != value:  # expected: what the collection recorded; found: what the member holds
            out.append(FormatError(f"{label}: {key}: expected {getattr(entry, key)} (recorded in the collection), "
                                   f"found {value} in {where}", file=F.MANIFEST, field=f"members[{m}].{key}",
                                   expected=getattr(entry, key), found=value))
    for field, expected, found, why in member_differences(coll.shared, coll.unified, entry.name, sm.raw):
        name = field if field.startswith("unified.") else f"members[{m}].{field}"
        out.append(FormatError(f"{label}: {name}: expected {expected}, found {found} in {where}"
                               + (f" ({why})" if why else ""), file=F.MANIFEST, field=name, expected=expected,
                               found=found))
    return out


def changed_member(coll: CollectionManifest, m: int, found: str, where) -> FormatError:
    """C3 of member ``m``: its manifest at ``where`` hashes to ``found``, not the checksum the collection records."""
    entry = coll.members[m]
    return FormatError(f"{F.MANIFEST}: members[{m}] ({entry.name}): manifest: expected {entry.manifest} (recorded in "
                       f"the collection), found {found} in {where}: the member changed after the collection was "
                       "written; put the recorded member back, or write the collection again over the members as they "
                       "are now (`packfmt merge`; its pack indexes are then packed again)", file=F.MANIFEST,
                       field=f"members[{m}].manifest", expected=entry.manifest, found=found)


def first_changed_member(root: str | os.PathLike, coll: CollectionManifest) -> tuple[int, str, str] | None:
    """C3 of every member, in member order: ``(m, found, where)`` of the first member whose ``manifest.json`` (under
    ``root``, resolved as a reader resolves it) is missing or hashes to another checksum than the recorded one
    (``found``: that checksum, or what is wrong); None when every one is as recorded.

    One read of each manifest, nothing parsed: what a command that reads no member but must not write over a
    changed one (``packfmt pack``, from the collection's own ``doc_lengths.bin``) checks."""
    prefix = os.path.join(os.fspath(root), "")
    for m, (path, digest) in enumerate(zip(coll.members.paths, coll.members.digests)):
        where = prefix + path + _MANIFEST
        try:
            fd = os.open(where, _READ)
            try:
                raw = os.read(fd, SMALL_JSON)
            finally:
                os.close(fd)
            if len(raw) >= SMALL_JSON:
                raw = F.read_json_bytes(where, file=F.MANIFEST)
        except (OSError, PackfmtError):
            return m, "no readable manifest.json", where
        if xxh3_64_intdigest(raw) != digest:
            return m, manifest_checksum(raw), where
    return None


def member_error(exc: FormatError, entry) -> FormatError:
    """``exc``, raised by a member's own store, naming the member (its ``name`` and ``path``): its ``file`` is the
    member's file as the collection reaches it (``../web/manifest.json``), not a name of the collection's own."""
    file = exc.file if not exc.file or os.path.isabs(exc.file) else f"{entry.path}/{exc.file}"
    where = f"member {entry.name!r} ({entry.path}): "
    return type(exc)(where + str(exc), file=file, field=exc.field, expected=exc.expected, found=exc.found,
                     cli=None if exc.cli is None else where + exc.cli)


def manifest_checksum(raw: bytes) -> str:
    """``"xxh3_64:<hex>"`` of a manifest's bytes (what a collection records of each member, C3)."""
    return "xxh3_64:" + xxhash.xxh3_64_hexdigest(raw)


def member_doc_lengths(root: str | os.PathLike, cm: CollectionManifest, doc_start: np.ndarray,
                       slow: Callable[[int], np.ndarray | None], *, bare: bool = False) -> np.ndarray:
    """int64 ``(documents,)``: the lengths of every member's documents in order, each member checked first
    (C2, C3, V1-V11, V13; see the module doc).

    ``slow(m)``: the lengths of member ``m`` the long way, for a member with images, a large one, or one
    refused here, called in member order: ``np.diff`` of ``Collection.member(m).doc_offsets`` (which raises
    what is wrong), or ``validate``'s checks of it (which report it, and give None: its lengths are left
    unset). ``bare``: also refuse a member whose manifest lists a file the format does not define, or has a
    newer minor version (what ``validate`` of the member would warn about), so a member that passes has nothing
    for a structural ``validate`` to report (its directory is not listed: what it holds besides its files is
    ``--deep``'s, C4).
    """
    out = np.empty(cm.num_documents, dtype=np.int64)
    group: list[int] = []  # consecutive members whose offsets are the bytes ``chunks``, end to end
    chunks: list[bytes] = []
    used = 0  # offsets in ``chunks``
    reader = _MemberReader(os.fspath(root), cm, bare)
    read, documents, images = reader.read, reader.documents, cm.members.images.tolist()

    def the_long_way(m: int) -> None:
        lengths = slow(m)
        if lengths is not None:
            out[doc_start[m]:doc_start[m + 1]] = lengths

    def flush() -> None:
        if group:
            _check_group(cm, doc_start, group, np.frombuffer(b"".join(chunks), dtype=F.OFFSET_DTYPE), out,
                         the_long_way)
            group.clear()
            chunks.clear()

    for m in range(len(documents)):
        n = documents[m] + 1
        alone = images[m] or n > GROUP_OFFSETS
        if used + n > GROUP_OFFSETS or (alone and group):
            flush()
            used = 0
        if not alone:
            offsets = read(m)
            if offsets is not None:
                group.append(m)
                chunks.append(offsets)
                used += n
                continue
        flush()  # members before m first, in order
        used = 0
        the_long_way(m)
    flush()
    return out


#: The flags of every member file opened here: not blocking, so a FIFO in place of a file reads as empty.
_READ = os.O_RDONLY | os.O_NONBLOCK
_MANIFEST = "/" + F.MANIFEST
_OFFSETS = "/" + F.DOC_OFFSETS
_OFFSET_SIZE = F.OFFSET_DTYPE.itemsize


class _MemberReader:
    """``read(m)``: member ``m``'s checks of ``member_doc_lengths`` (``bare``: see there), with the templates
    (``member_template``) the members' manifests have given so far: a manifest that matches one costs one pattern
    match, not a parse. The entries are read as columns (``cm.members.paths``, ``.digests``), not as a ``Member`` each."""

    def __init__(self, root: str, cm: CollectionManifest, bare: bool) -> None:
        self.cm, self.bare = cm, bare
        self.prefix = os.path.join(root, "")  # a member's directory: this and its path (os.path.join costs more)
        self.paths, self.digests = cm.members.paths, cm.members.digests
        self.documents, self.tokens = cm.members.documents.tolist(), cm.members.tokens.tolist()
        self.names: list[str] | None = None  # the members' names, made when a template's shared keys are compared
        self.templates: list[Template] = []
        self.tries = TEMPLATE_TRIES  # manifests left to try as templates (members not canonical: tried no more)
        self.listed = listed_in(cm.unified)  # no member listed anywhere: every member's flags are these
        self.any_listed = any(self.listed)
        self.agree: set = set()  # templates whose shared keys are the collection's, with the flags ``listed``

    def read(self, m: int) -> bytes | None:
        """The bytes of member ``m``'s ``doc_offsets.bin`` when it passes C3, C2 and V1-V11 (and is ``bare``, see
        ``member_doc_lengths``) and the file has the size they give it; None on anything else (the caller takes the
        long way, which says why). A member whose manifest matches a template costs seven system calls (open, read,
        close of its manifest; ``stat`` of its tokens; open, read, close of its offsets), a loss mask one more."""
        path = self.prefix + self.paths[m]
        try:
            fd = os.open(path + _MANIFEST, _READ)
            try:
                raw = os.read(fd, SMALL_JSON)  # short: the end of a regular file
            finally:
                os.close(fd)
            if len(raw) >= SMALL_JSON:
                raw = F.read_json_bytes(path + _MANIFEST, file=F.MANIFEST)  # which bounds its size
            if xxh3_64_intdigest(raw) != self.digests[m]:  # C3
                return None
            documents = self.documents[m]
            templates = self.templates
            for k, t in enumerate(templates):
                g = t.sizes(raw, documents, self.tokens[m])  # V1-V9 by the match, C2's counts, V11
                if g is None:
                    continue
                if k:  # the last one matched is tried first
                    templates.insert(0, templates.pop(k))
                if g is False or (t not in self.agree and not self._shared_agree(t, m)):  # C2
                    return None
                if self.bare and not t.bare:
                    return None
                for group, name in t.stat:  # V10; doc_offsets.bin's size is checked by reading it
                    if os.stat(path + name).st_size != int(g[group]):
                        return None
                size = (documents + 1) * _OFFSET_SIZE  # ``_read_exact``, inlined: one call fewer per member
                fd = os.open(path + _OFFSETS, _READ)
                try:
                    data = os.read(fd, size + 1)
                    if 0 < len(data) < size:  # a short read before the end (not of a regular file)
                        data = _read_on(fd, data, size)
                finally:
                    os.close(fd)
                return data if len(data) == size else None
            return self._parsed(raw, m, path, self.bare)
        except (PackfmtError, OSError):
            return None

    def _shared_agree(self, t: Template, m: int) -> bool:
        """C2's shared keys of member ``m``, whose manifest matched ``t``: ``t.differences``; ``t`` is added to
        ``agree`` (what ``read`` looks in first) when they agree and ``unified`` lists no member."""
        if self.names is None:
            self.names = self.cm.members.names
        name = self.names[m]
        if not self.any_listed:
            if t.differences(self.cm.shared, self.cm.unified, name, self.listed):
                return False
            self.agree.add(t)
            return True
        listed = tuple(name in names for names in self.listed)
        return not t.differences(self.cm.shared, self.cm.unified, name, listed)

    def _parsed(self, raw: bytes, m: int, path: str, bare: bool) -> bytes | None:
        """``read`` of a manifest no template matches: parsed and checked, then a template if it can be one."""
        cm = self.cm
        obj = F.parse_json(raw, file=F.MANIFEST)
        if is_collection(obj):
            return None
        sm = F.parse_manifest(obj, file=F.MANIFEST)
        if sm.num_images or member_problems(cm, m, manifest_checksum(raw), sm, path):
            return None
        if self.tries and len(self.templates) < MAX_TEMPLATES:
            t = Template.of(raw, sm)
            if t is not None:
                self.templates.insert(0, t)
            else:
                self.tries -= 1
        if bare and not (sm.version <= F.KNOWN_VERSION
                         and set(sm.files) == set(F.required_files(sm.has_loss_mask, False))):
            return None
        check_files_table(path, sm.files, F.expected_layout(sm), where="")  # V10, V11: sizes of every file
        return _read_exact(path + _OFFSETS, sm.files[F.DOC_OFFSETS].bytes)


#: Manifests that fail to make a template (not canonical JSON, or with images) before no more are tried.
TEMPLATE_TRIES = 32

#: A member manifest read with one ``read`` when smaller than this (a canonical one is under 1 KiB).
SMALL_JSON = 1 << 14


def _read_exact(path: str, size: int) -> bytes | None:
    """The bytes of the file at ``path`` when it has exactly ``size`` bytes, else None: each read asks for a byte
    more, and a read of a regular file short of what it asked for ends at its end (no ``fstat``); not blocking,
    so a FIFO in its place reads as empty."""
    fd = os.open(path, _READ)
    try:
        data = os.read(fd, size + 1)
        if 0 < len(data) < size:
            data = _read_on(fd, data, size)
    finally:
        os.close(fd)
    return data if len(data) == size else None


def _read_on(fd: int, data: bytes, size: int) -> bytes:
    """``data``, a read of ``fd`` short of ``size`` bytes before its end (not a regular file), read on to the end or to
    a byte more than ``size``."""
    while 0 < len(data) < size:
        more = os.read(fd, size + 1 - len(data))
        if not more:
            break
        data += more
    return data


def _check_group(cm: CollectionManifest, doc_start: np.ndarray, group: list[int], off: np.ndarray,
                 out: np.ndarray, the_long_way: Callable[[int], None]) -> None:
    """V13 of consecutive members ``group`` at once (their offsets end to end in ``off``), then their lengths into
    ``out``; a member that breaks it takes the long way (``Store`` raises ``checks.offsets``' error)."""
    if not group:
        return
    ms = np.asarray(group, dtype=np.int64)
    docs = doc_start[ms + 1] - doc_start[ms]
    firsts = np.zeros(ms.shape[0], dtype=np.int64)
    np.cumsum(docs[:-1] + 1, out=firsts[1:])
    lasts = firsts + docs
    tokens = cm.members.tokens[ms]
    lengths = np.delete(np.diff(off), lasts[:-1])  # the steps inside each member
    bad = (off[firsts] != 0) | (off[lasts] != tokens)
    short = np.flatnonzero(lengths <= 0)
    if short.size:
        bad[np.repeat(np.arange(ms.shape[0]), docs)[short]] = True
    a = doc_start[group[0]]
    if not bad.any():
        out[a:doc_start[group[-1] + 1]] = lengths
        return
    for k, m in enumerate(group):  # in member order: the first error raised is the first member's
        if bad[k]:
            the_long_way(m)
        else:
            out[doc_start[m]:doc_start[m + 1]] = lengths[doc_start[m] - a:doc_start[m + 1] - a]
