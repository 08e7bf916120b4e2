"""A collection's member list as a table of two files (spec/COLLECTION.md §2.5, format 2.0).

Floor 0 like ``collection.lengths``: bytes and the checks on them, nothing opened but the two files.
At 10^5 members the ``members`` array is most of a collection's manifest, and parsing and checking it
as JSON costs microseconds a member (a second per command). The table holds the same entries:
``members.bin``, one 32-byte record per member (``documents``, ``tokens``, ``images`` as ``i8``, the
member manifest's xxh3_64 as ``u8``), and ``member_names.txt``, one ``name TAB path LF`` line per
member. Both are read whole, their size and checksum checked, and every C1 rule of §2.1/§2.2 checked
in vectorised passes over the bytes: no Python object per member until a member is asked for
(``MemberTable[m]``). ``MemberList`` gives a JSON array the same interface (columns as arrays), so
readers use one code path for both forms.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Callable

import numpy as np
import xxhash

from .. import format as F
from ..errors import FormatError
from .member_entry import Member, check_member_name, check_member_path, digest_int
from .versions import TABLE_VERSION

__all__ = ["TABLE_FILE", "NAMES_FILE", "TABLE_FILES", "RECORD", "TABLE_VALUE", "TABLE_VERSION", "DEFAULT_TABLE_MIN",
           "MemberTable", "MemberList", "listed_paths", "table_record", "table_paths", "read_table", "parse_table"]

TABLE_FILE = "members.bin"
NAMES_FILE = "member_names.txt"
TABLE_FILES = (TABLE_FILE, NAMES_FILE)
#: The value of ``members`` in a manifest whose member list is the table.
TABLE_VALUE = "table"
#: Writers keep the member list as a table from this many members on (below it, the readable JSON array). At
#: 1,000 members of 1,000 documents: open + lengths 2.8 ms against 8.2 ms, pack 1.03x one store against 1.45x
#: (`benchmarks/bench_members.py --forms array,table`, README "Measured here").
DEFAULT_TABLE_MIN = 256
#: One record of ``members.bin``: 32 bytes, little-endian.
RECORD = np.dtype([("documents", "<i8"), ("tokens", "<i8"), ("images", "<i8"), ("manifest", "<u8")])


class _Members(Sequence):
    """What readers use of a member list: ``len``, ``[m]`` (a ``Member``), iteration, and int64 columns."""

    documents: np.ndarray
    tokens: np.ndarray
    images: np.ndarray

    def __getitem__(self, m):
        if isinstance(m, slice):
            return [self._entry(i) for i in range(*m.indices(len(self)))]
        n = len(self)
        if not -n <= m < n:
            raise IndexError(f"member {m} of {n}")
        return self._entry(m % n)

    @property
    def names(self) -> list[str]:
        raise NotImplementedError

    @property
    def paths(self) -> list[str]:
        """Every member's ``path`` as written, in order (a list: no ``Member`` made per member)."""
        raise NotImplementedError

    @property
    def digests(self) -> list[int]:
        """Every member's recorded ``manifest`` checksum as the integer ``xxh3_64_intdigest`` gives (C3 compares
        integers; -1, which no manifest's equals, for a string not of the recorded form)."""
        raise NotImplementedError

    def __eq__(self, other) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]


class MemberList(_Members):
    """A JSON ``members`` array, parsed (``Member`` objects), with the table's columns."""

    def __init__(self, members: Sequence[Member]) -> None:
        self._members = tuple(members)
        n = len(self._members)
        self.documents = np.fromiter((x.documents for x in self._members), dtype=np.int64, count=n)
        self.tokens = np.fromiter((x.tokens for x in self._members), dtype=np.int64, count=n)
        self.images = np.fromiter((x.images for x in self._members), dtype=np.int64, count=n)

    def __len__(self) -> int:
        return len(self._members)

    def _entry(self, m: int) -> Member:
        return self._members[m]

    def __iter__(self):
        return iter(self._members)

    @property
    def names(self) -> list[str]:
        return [x.name for x in self._members]

    @property
    def paths(self) -> list[str]:
        return [x.path for x in self._members]

    @property
    def digests(self) -> list[int]:
        return [digest_int(x.manifest) for x in self._members]


class MemberTable(_Members):
    """The member table read from its two files and checked (``parse_table``); entries made on demand."""

    def __init__(self, records: np.ndarray, text: bytes, line_start: np.ndarray, tab: np.ndarray, binding: str) -> None:
        self._records, self._text, self._start, self._tab = records, text, line_start, tab
        self.documents = records["documents"]  # int64 views of the records (read-only, strided: no copy)
        self.tokens = records["tokens"]
        self.images = records["images"]
        #: ``"xxh3_64:..."`` of ``members.bin`` then ``member_names.txt``: what a pack index binds to (§4).
        self.binding = binding
        self._names: list[str] | None = None

    def __len__(self) -> int:
        return self._records.shape[0]

    def _entry(self, m: int) -> Member:
        a, t, b = int(self._start[m]), int(self._tab[m]), int(self._start[m + 1]) - 1
        r = self._records[m]
        return Member(self._text[a:t].decode("ascii"), self._text[t + 1:b].decode("utf-8"), int(r["documents"]),
                      int(r["tokens"]), int(r["images"]), f"xxh3_64:{int(r['manifest']):016x}")

    def __iter__(self):
        """Every entry in order, from one split of the names file (not one slice and decode per member)."""
        n = len(self)
        parts = self._parts()
        docs, toks, imgs = self.documents.tolist(), self.tokens.tolist(), self.images.tolist()
        digests = self._records["manifest"].tolist()
        for i in range(n):
            yield Member(parts[2 * i], parts[2 * i + 1], docs[i], toks[i], imgs[i], f"xxh3_64:{digests[i]:016x}")

    def _parts(self) -> list[str]:
        """``[name, path, name, path, ..., ""]`` from one split of the names file (a path may hold a form feed or
        U+2028, which ``splitlines`` would cut: split on TAB and LF only)."""
        return self._text.decode("utf-8").replace("\n", "\t").split("\t")

    @property
    def names(self) -> list[str]:
        if self._names is None:
            self._names = self._parts()[0:2 * len(self):2]
        return self._names

    @property
    def paths(self) -> list[str]:
        return self._parts()[1:2 * len(self):2]

    @property
    def digests(self) -> list[int]:
        return self._records["manifest"].tolist()


def table_paths(text: bytes) -> list[str]:
    """The paths of ``member_names.txt`` read leniently (a cycle check or a sweep of what a collection lists: the
    table itself is checked by ``read_table`` wherever it is used as the member list)."""
    # lines end in LF only: splitlines would also cut at a form feed or U+2028, which a path may hold
    return [line.split("\t", 1)[1] for line in text.decode("utf-8", "replace").split("\n") if "\t" in line]


def listed_paths(members, names: Callable[[], bytes | None]) -> list[str]:
    """The member paths a collection manifest's ``members`` value lists, read leniently (whose files to look at, a
    cycle to name, what a sweep keeps; the member list itself is checked wherever it is used as one): the array's
    ``path`` strings, or for ``"table"`` those of ``member_names.txt``, whose bytes ``names()`` gives (None when
    it is missing); anything else lists none."""
    if members == TABLE_VALUE:
        text = names()
        return [] if text is None else table_paths(text)
    if isinstance(members, list):
        return [m["path"] for m in members if isinstance(m, dict) and isinstance(m.get("path"), str)]
    return []


def table_record(members: Sequence[Member]) -> dict[str, bytes]:
    """The bytes of ``members.bin`` and ``member_names.txt`` listing ``members`` (checked entries)."""
    rec = np.zeros(len(members), dtype=RECORD)
    rec["documents"] = [m.documents for m in members]
    rec["tokens"] = [m.tokens for m in members]
    rec["images"] = [m.images for m in members]
    rec["manifest"] = [int(m.manifest.split(":", 1)[1], 16) for m in members]
    for m in members:
        if any(c in m.path for c in "\t\n\r"):
            raise ValueError(f"member {m.name}: path {m.path!r} has a tab or a line break, which a member table "
                             "cannot hold (spec/COLLECTION.md §2.5); keep the member list as a JSON array")
    return {TABLE_FILE: rec.tobytes(), NAMES_FILE: "".join(f"{m.name}\t{m.path}\n" for m in members).encode("utf-8")}


def read_table(read: Callable[[str, int], bytes], files: dict, count: int, *, file: str = F.MANIFEST) -> MemberTable:
    """The member table of a manifest whose ``files`` lists it: each file read by ``read(name, at_most)`` (raising
    ``FileNotFoundError`` when absent), its size and checksum checked, then its contents (``parse_table``)."""
    raw = {}
    for name in TABLE_FILES:
        entry = files[name]
        try:
            data = read(name, entry.bytes + 1)
        except FileNotFoundError:
            raise FormatError(f"{name}: missing: the collection's {file} keeps its member list in {TABLE_FILE} and "
                              f"{NAMES_FILE} (spec/COLLECTION.md §2.5); copy the whole collection directory, or "
                              "write it again with `packfmt merge`", file=name, field="file", expected="present",
                              found="missing") from None
        F.check_listed_bytes(name, data, entry, file)
        raw[name] = data
    return parse_table(raw[TABLE_FILE], raw[NAMES_FILE], count)


def _fail(name: str, field: str, expected, found) -> FormatError:
    return FormatError(f"{name}: {field}: expected {expected}, found {found}", file=name, field=field,
                       expected=expected, found=found)


def parse_table(table: bytes, text: bytes, count: int) -> MemberTable:
    """C1 of a member table (§2.5) over its bytes: ``count`` records and lines, each line ``name TAB path LF`` with a
    well-formed name (unique) and path, counts in ``[0, 2^63)``. Raises ``FormatError`` naming file, line, field."""
    if len(table) != RECORD.itemsize * count:
        raise _fail(TABLE_FILE, "size", f"{RECORD.itemsize * count} bytes (32 per member, counts.members {count})",
                    len(table))
    records = np.frombuffer(table, dtype=RECORD)
    for key in ("documents", "tokens", "images"):
        bad = np.flatnonzero(records[key] < 0)
        if bad.size:
            m = int(bad[0])
            raise _fail(TABLE_FILE, f"[{m}].{key}", "an integer in [0, 2^63 - 1]",
                        int(records[key][m].view(np.uint64)))
    try:
        if not text.isascii():  # ASCII (the usual names and paths) is UTF-8: no decode needed to know
            text.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = text.count(b"\n", 0, exc.start) + 1
        raise _fail(NAMES_FILE, f"line {line}", "UTF-8 text", f"{text[exc.start:exc.start + 4]!r} at byte {exc.start}"
                    ) from None
    lines = _scan(np.frombuffer(text, dtype=np.uint8), count)  # every rule of a line (§2.5), vectorised
    if lines is None:
        raise _first_bad_line(text, count)
    both = xxhash.xxh3_64(table)
    both.update(text)  # the two files end to end (§4), without joining them
    table_ = MemberTable(records, text, *lines, "xxh3_64:" + both.hexdigest())
    _unique_names(np.frombuffer(text, dtype=np.uint8), *lines, table_)
    return table_


#: Per byte value, for ``_scan``: 1 a name's first byte (a letter or digit), 2 any byte of a name, 4 a byte no path
#: may hold (TAB, CR, NUL, backslash).
_CLASS = np.zeros(256, dtype=np.uint8)
for _c in b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789":
    _CLASS[_c] |= 3
for _c in b"_.-":
    _CLASS[_c] |= 2
for _c in b"\t\r\0\\":
    _CLASS[_c] |= 4
TAB, LF, SLASH, DOT = 9, 10, 47, 46
#: Longest name (§2.1).
NAME_MOST = 128


def _scan(b: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray] | None:
    """``member_names.txt`` as ``count`` lines of ``name TAB path LF``, the name 1-128 bytes of ``[A-Za-z0-9_.-]``
    starting with a letter or digit, the path non-empty, not absolute, no empty or ``.`` component, no TAB, CR, NUL
    or backslash: ``(start, tab)``, each line's first byte (and ``start[count]``, the end) and its TAB; None when a
    rule fails (``_first_bad_line`` then names it). numpy passes over the bytes, no Python object a line, and no
    numba: its first load in a process (~0.25 s) was most of opening a collection of 10^4 members."""
    n = b.shape[0]
    if count == 0 or n == 0:
        return (np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int64)) if n == count == 0 else None
    ends = np.flatnonzero(b == LF)
    tab = np.flatnonzero(b == TAB)
    if ends.shape[0] != count or tab.shape[0] != count or ends[-1] != n - 1:
        return None
    start = np.empty(count + 1, dtype=np.int64)
    start[0], start[1:] = 0, ends + 1
    # one TAB a line (as many of each, the i-th TAB inside line i), a name of 1-128 bytes, a path of >= 1
    name_len = tab - start[:-1]
    if not ((name_len >= 1) & (name_len <= NAME_MOST) & (tab + 1 < ends)).all():
        return None
    cls = _CLASS.take(b)
    if not (cls[start[:-1]] & 1).all() or np.count_nonzero(cls & 4) != count:  # the only TAB/CR/NUL/backslash: the TABs
        return None
    in_name = np.zeros(n + 1, dtype=np.int8)  # 1 from a line's first byte to its TAB (excluded)
    in_name[start[:-1]] = 1
    in_name[tab] = -1
    in_name = np.cumsum(in_name[:n], dtype=np.int8).view(bool)
    if not (cls[in_name] & 2).all():
        return None
    # the path: not absolute; after a "/" neither "/" nor the line's end (no empty component); no "." component
    if (b[tab + 1] == SLASH).any():
        return None
    slash = np.flatnonzero(b == SLASH)  # (never in a name: checked above), never the last byte (an LF is)
    if ((b[slash + 1] == SLASH) | (b[slash + 1] == LF)).any():
        return None
    dot = np.flatnonzero(~in_name & (b == DOT))  # (never the first byte: a name's), never the last
    after, before = b[dot + 1], b[dot - 1]
    if (((before == TAB) | (before == SLASH)) & ((after == SLASH) | (after == LF))).any():
        return None
    return start, tab


def _unique_names(b: np.ndarray, start: np.ndarray, tab: np.ndarray, table: MemberTable) -> None:
    """Names unique (§2.1), compared exactly: each name's bytes padded with NUL (which no name holds) to the longest,
    the rows sorted, neighbours compared. Raises naming the first line (in member order) whose name an earlier line
    has."""
    count = tab.shape[0]
    if count < 2:
        return
    width = int((tab - start[:-1]).max())
    at = start[:-1, None] + np.arange(width)
    rows = np.where(at < tab[:, None], b[np.minimum(at, b.shape[0] - 1)], 0).astype(np.uint8)
    keys = np.ascontiguousarray(rows).view(f"V{width}").ravel()
    order = np.argsort(keys, kind="stable")
    ks = keys[order]
    dup = np.flatnonzero(ks[1:] == ks[:-1])
    if not dup.size:  # the usual case
        return
    later = order[dup + 1]  # a line whose name the line sorted just before it (an earlier line: stable) has
    j = int(later.min())
    at = int(np.flatnonzero(order == j)[0])
    while at > 0 and ks[at - 1] == ks[at]:  # the first line of its run of equal names (stable: the earliest)
        at -= 1
    first = int(order[at])
    raise _fail(NAMES_FILE, f"line {j + 1} name", f"a name no other member has (line {first + 1} has it)",
                repr(table._entry(j).name))


def _first_bad_line(text: bytes, count: int) -> FormatError:
    """The error naming the first malformed line (the slow path, after the vectorised checks failed)."""
    lines = text.split(b"\n")
    if lines[-1] != b"":
        return _fail(NAMES_FILE, f"line {len(lines)}", "every line ending with LF", repr(lines[-1][:60]))
    lines = lines[:-1]
    for i, line in enumerate(lines[:count]):
        where = f"line {i + 1}"
        parts = line.decode("utf-8").split("\t")
        if len(parts) != 2:
            raise _fail(NAMES_FILE, where, "name TAB path (one tab)", repr(line[:200].decode("utf-8", "replace")))
        check_member_name(parts[0], file=NAMES_FILE, field=where + " name")
        path = check_member_path(parts[1], file=NAMES_FILE, field=where + " path")
        if "\r" in path:
            raise _fail(NAMES_FILE, where + " path", "no CR in a path", repr(path))
    return _fail(NAMES_FILE, "lines", f"{count} lines (counts.members)", len(lines))

