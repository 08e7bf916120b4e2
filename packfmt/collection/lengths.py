"""A collection's own record of its documents' lengths: ``doc_lengths.bin`` (spec/COLLECTION.md §2.4, C7).

Floor 0 like ``collection.manifest``: the file's bytes and the checks on them, nothing opened but the
file. ``doc_lengths.bin`` holds one little-endian ``i8`` per collection document, in collection order,
listed with its size and checksum in the manifest's ``files`` table; packing, describing and opening a
collection read it once (checksum verified, C7 checked in one pass) instead of every
member's manifest and ``doc_offsets.bin``. It is only a record: a member's own offsets are the truth,
and ``member_lengths_problem`` (run when a member is first opened, and by ``validate``) refuses a
member whose lengths differ from its slice of the file, before any offset of it is used.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import NoReturn

import numpy as np
import xxhash

from .. import format as F
from ..errors import FormatError
from ..mapped import map_bytes
from .member_table import TABLE_FILES
from .versions import FILES_VERSION, newer_minor, table_allowed

__all__ = ["LENGTHS_FILE", "LENGTHS_DTYPE", "parse_collection_files", "lengths_record",
           "read_lengths", "check_record", "check_lengths", "member_lengths_problem", "store_lengths"]

#: The one file a collection's ``files`` table may list in format 1.3 (2.0 adds the member table's two, §2.5).
LENGTHS_FILE = "doc_lengths.bin"
#: ``i8`` little-endian, as ``doc_offsets.bin`` (FORMAT.md §3.2).
LENGTHS_DTYPE = F.OFFSET_DTYPE


def parse_collection_files(obj: Mapping, version: tuple[int, int], documents: int, *, file: str = F.MANIFEST,
                           table: bool = False) -> dict[str, F.FileEntry]:
    """C1 of ``files``: {} when absent; the known entries else: ``doc_lengths.bin`` (of ``8 * documents`` bytes) and,
    in format 2.0 (and the withdrawn 1.4), the member table's ``members.bin`` and ``member_names.txt`` (§2.5), listed exactly when ``table``
    (the manifest's ``members`` is ``"table"``). A name this reader does not know is an error in a collection of a
    version it knows and ignored in a newer minor."""
    if "files" not in obj:
        if table:
            raise FormatError(file=file, field="files", expected=f"a files table listing {TABLE_FILES[0]} and "
                              f"{TABLE_FILES[1]} (members is \"table\", §2.5)", found="absent")
        return {}
    if version < FILES_VERSION:
        raise FormatError(file=file, field="files", expected=f"absent in a collection of format {version[0]}.{version[1]} "
                          "(added in 1.3)", found=repr(obj["files"])[:200])
    files = F.parse_files_table(obj, file=file)
    known = {LENGTHS_FILE, *TABLE_FILES} if table_allowed(version) else {LENGTHS_FILE}
    unknown = sorted(set(files) - known)
    if unknown and not newer_minor(version):
        raise FormatError(file=file, field="files", expected=f"only {sorted(known)} (collection format "
                          f"{version[0]}.{version[1]})", found=repr(unknown))
    listed = [name for name in TABLE_FILES if name in files]
    if table and len(listed) != len(TABLE_FILES):
        raise FormatError(file=file, field="files", expected=f"{TABLE_FILES[0]} and {TABLE_FILES[1]} listed (members "
                          "is \"table\", §2.5)", found=repr(sorted(files)))
    if listed and not table:
        raise FormatError(file=file, field=f"files.{listed[0]}", expected="absent: members is an array, not \"table\" "
                          "(§2.5)", found="listed")
    entry = files.get(LENGTHS_FILE)
    if entry is not None and entry.bytes != LENGTHS_DTYPE.itemsize * documents:
        raise FormatError(f"{file}: files.{LENGTHS_FILE}.bytes: expected {LENGTHS_DTYPE.itemsize * documents} "
                          f"(8 bytes x counts.documents {documents}), found {entry.bytes}", file=file,
                          field=f"files.{LENGTHS_FILE}.bytes", expected=LENGTHS_DTYPE.itemsize * documents,
                          found=entry.bytes)
    return {name: entry for name, entry in files.items() if name in known}


def lengths_record(lengths: np.ndarray) -> tuple[bytes, dict]:
    """The bytes of ``doc_lengths.bin`` for ``lengths`` and the manifest's ``files`` table listing them."""
    data = np.ascontiguousarray(lengths, dtype=LENGTHS_DTYPE).tobytes()
    return data, {LENGTHS_FILE: {"bytes": len(data), "checksum": "xxh3_64:" + xxhash.xxh3_64_hexdigest(data)}}


def store_lengths(path: str | os.PathLike, documents: int) -> np.ndarray:
    """int64 lengths of the store at ``path`` (one already opened and checked, V13) from its ``doc_offsets.bin``."""
    offsets = np.fromfile(os.path.join(os.fspath(path), F.DOC_OFFSETS), dtype=F.OFFSET_DTYPE, count=documents + 1)
    return np.diff(offsets)


def read_lengths(root: str | os.PathLike, cm) -> np.ndarray | None:
    """The checked lengths of ``doc_lengths.bin`` (read-only int64); None when ``cm`` records none, or when the file
    is absent (a reader then computes them from the members, which it checks: §2.4). Raises ``FormatError`` /
    ``ChecksumError`` naming the file when its size, checksum or contents (C7) are wrong."""
    entry = cm.files.get(LENGTHS_FILE)
    if entry is None:
        return None
    try:  # mapped, not read: hashed and checked in place, no private copy of 8 bytes a document
        raw = map_bytes(os.path.join(os.fspath(root), LENGTHS_FILE))
    except FileNotFoundError:
        return None
    return check_record(raw, cm)


def check_record(raw, cm) -> np.ndarray:
    """The lengths in ``raw``, the bytes of ``doc_lengths.bin`` (``bytes``, or a uint8 array mapping the file;
    at most one byte more than recorded is enough to tell), once their size, checksum and contents (C7) are
    checked against ``cm``."""
    F.check_listed_bytes(LENGTHS_FILE, raw, cm.files[LENGTHS_FILE], "manifest")
    # a view keeps a mapping a memmap (its pages can be handed back: _resident.release)
    lengths = raw.view(LENGTHS_DTYPE) if isinstance(raw, np.ndarray) else np.frombuffer(raw, dtype=LENGTHS_DTYPE)
    check_lengths(lengths, cm)
    return lengths


def check_lengths(lengths: np.ndarray, cm) -> None:
    """C7 of the record's contents: ``counts.documents`` lengths, each ``>= 1``, with a running sum below ``2^63``,
    summing per member to its ``tokens``: chunked passes (``_c7_scan``), nothing allocated a document."""
    n = cm.num_documents
    if lengths.shape != (n,):
        raise FormatError(file=LENGTHS_FILE, field="length", expected=f"{n} lengths (counts.documents)",
                          found=lengths.shape[0])
    members = cm.members
    d, m, found = _c7_scan(lengths, members.documents, members.tokens)
    if d == _SHORT_COUNTS:  # C1 makes the members' documents sum to counts.documents: a caller's bug, not a file's
        raise ValueError(f"{LENGTHS_FILE}: the members' documents do not sum to counts.documents {n}")
    if d >= 0:  # a length below 1, or where the running sum passed 2^63 (reported before any member's sum)
        _short(lengths, d)
    if m >= 0:
        entry = members[m]
        doc_start = int(np.sum(members.documents[:m], dtype=np.int64))
        end = doc_start + int(entry.documents)
        raise FormatError(f"{LENGTHS_FILE}: [{doc_start}:{end}] (members[{m}] {entry.name}): expected "
                          f"lengths summing to {entry.tokens} (its tokens in {F.MANIFEST}), found {found}",
                          file=LENGTHS_FILE, field=f"[{doc_start}:{end}]", expected=entry.tokens, found=found)


def _short(lengths: np.ndarray, d: int) -> NoReturn:
    """The error of document ``d``: a length below 1, or where the running sum passed ``2^63``."""
    raise FormatError(f"{LENGTHS_FILE}: [{d}]: expected a length >= 1 (every document has a token; the running "
                      f"sum stays below 2^63), found {int(lengths[d])}", file=LENGTHS_FILE, field=f"[{d}]",
                      expected=">= 1", found=int(lengths[d]))


#: ``_c7_scan``'s first value when the members hold more documents than ``lengths`` has (never, after C1).
_SHORT_COUNTS = -2
_INT64_MAX = 2**63 - 1


#: Lengths ``_c7_scan`` checks at a time (8 MiB of them).
_CHUNK = 1 << 20


def _c7_scan(lengths, documents, tokens) -> tuple[int, int, int]:
    """C7 over the lengths, member by member: ``(d, m, s)`` with ``d`` the first document whose length is below 1 or
    whose length takes the running sum past ``2^63 - 1`` (-1: none; ``_SHORT_COUNTS``: the members hold more
    documents than there are lengths), ``m`` the first member before ``d`` whose lengths sum to other than its
    ``tokens`` (-1: none) and ``s`` that sum. numpy passes a chunk at a time and one sum a member (no array of a
    running sum: at 10^5 members of 2 documents its ``8 n`` bytes of fresh pages were most of the check), and no
    numba: its first load in a process (~0.25 s) was most of opening a collection."""
    ends = np.cumsum(documents, dtype=np.int64)
    n = int(ends[-1]) if ends.shape[0] else 0
    if n > lengths.shape[0]:
        return _SHORT_COUNTS, -1, 0
    d = _first_short(lengths[:n])
    done = n if d < 0 else d  # the members ending by then are compared with their tokens
    whole = np.flatnonzero((ends <= done) & (documents > 0))
    sums = np.zeros(documents.shape[0], dtype=np.int64)
    if whole.size:  # the sums of consecutive whole members: one reduceat (each below 2^63: the running sum is)
        sums[whole] = np.add.reduceat(lengths[:int(ends[whole[-1]])], ends[whole] - documents[whole])
    bad = np.flatnonzero((sums != tokens) & (ends <= done))
    m = int(bad[0]) if bad.size else -1
    return d, m, int(sums[m]) if m >= 0 else 0


def _first_short(lengths: np.ndarray) -> int:
    """The first document whose length is below 1 or takes the running sum past ``2^63 - 1``; -1 when none."""
    total = 0
    for a in range(0, lengths.shape[0], _CHUNK):
        chunk = lengths[a:a + _CHUNK]
        if int(chunk.min()) < 1:
            return a + int(np.argmax(chunk < 1))
        if total + int(chunk.max()) * chunk.shape[0] <= _INT64_MAX:  # no sum in it can pass 2^63 - 1
            total += int(chunk.sum())
            continue
        running = np.cumsum(chunk.astype(object)) + total  # exact (Python integers): only near 2^63
        past = np.flatnonzero(running > _INT64_MAX)
        if past.size:
            return a + int(past[0])
        total = int(running[-1])
    return -1


def member_lengths_problem(cm, m: int, doc_start: int, own: np.ndarray, lengths: np.ndarray,
                           where) -> FormatError | None:
    """The error when member ``m``'s own lengths ``own`` (``np.diff`` of its ``doc_offsets.bin`` at ``where``, V13
    held) differ from ``lengths``, its slice of ``doc_lengths.bin`` (which starts at document ``doc_start``)."""
    if own.shape == lengths.shape and np.array_equal(own, lengths):
        return None
    entry = cm.members[m]
    if own.shape != lengths.shape:
        d, expected, found = 0, f"{own.shape[0]} documents", f"{lengths.shape[0]}"
    else:
        d = int(np.flatnonzero(own != lengths)[0])
        expected, found = int(own[d]), int(lengths[d])
    g = doc_start + d
    return FormatError(f"{LENGTHS_FILE}: [{g}] (members[{m}] {entry.name}, its document {d}): expected {expected} "
                       f"(the length in {where}), found {found}: the collection's record of its lengths lies about "
                       "this member; run `packfmt merge` again", file=LENGTHS_FILE, field=f"[{g}]",
                       expected=expected, found=found)
