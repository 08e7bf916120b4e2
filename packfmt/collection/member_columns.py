"""Every member's path and recorded manifest checksum as two lists, for a loop over 10^5 members
(``member_checks``, spec/COLLECTION.md C3).

A ``MemberTable`` makes a ``Member`` per entry it is asked for (about 3.5 us each at 10^5 members, a tenth
of what a member costs ``validate``). Its two files (§2.5) already hold these columns: they are read again
from the collection directory and taken only when they are the very bytes the table was parsed from and
checked (``xxh3_64`` of both end to end is the table's ``binding``, §4) and have its number of entries;
otherwise (files changed since, unreadable, or a JSON ``members`` array) the columns come from the
entries themselves. A checksum is the integer ``xxhash.xxh3_64_intdigest`` gives, so a member's is
compared without formatting it; one that is not ``"xxh3_64:"`` and 16 lowercase hex digits is -1, which no
manifest's equals.
"""

from __future__ import annotations

import os
import re

import numpy as np
import xxhash

from .manifest import CollectionManifest
from .member_table import NAMES_FILE, RECORD, TABLE_FILE, MemberTable

__all__ = ["member_columns"]

_DIGEST = re.compile(r"xxh3_64:([0-9a-f]{16})")


def member_columns(root: str | os.PathLike, cm: CollectionManifest) -> tuple[list[str], list[int]]:
    """``(paths, checksums)`` of ``cm``'s members in order: each ``path`` as written, each recorded ``manifest``
    as an integer (-1 when not well formed); see the module doc."""
    members = cm.members
    if isinstance(members, MemberTable):
        got = _table_columns(os.fspath(root), cm, members)
        if got is not None:
            return got
    paths, digests = [], []
    for x in members:
        paths.append(x.path)
        digests.append(digest_int(x.manifest))
    return paths, digests


def digest_int(checksum: str) -> int:
    """The integer of ``"xxh3_64:<16 lowercase hex digits>"``; -1 for any other string."""
    found = _DIGEST.fullmatch(checksum)
    return int(found[1], 16) if found else -1


def _table_columns(root: str, cm: CollectionManifest, table: MemberTable) -> tuple[list[str], list[int]] | None:
    """The columns from the table's two files read again, or None when they are not what ``table`` was parsed from."""
    n = len(table)
    try:
        with open(os.path.join(root, TABLE_FILE), "rb") as fh:
            records = fh.read(RECORD.itemsize * n + 1)
        with open(os.path.join(root, NAMES_FILE), "rb") as fh:
            text = fh.read(cm.files[NAMES_FILE].bytes + 1)
    except (OSError, KeyError):
        return None
    both = xxhash.xxh3_64(records)
    both.update(text)
    if len(records) != RECORD.itemsize * n or "xxh3_64:" + both.hexdigest() != table.binding:
        return None
    parts = text.decode("utf-8", "replace").replace("\n", "\t").split("\t")  # name, path, ..., "" (lines end in LF)
    if len(parts) != 2 * n + 1:
        return None
    return parts[1:2 * n:2], np.frombuffer(records, dtype=RECORD)["manifest"].tolist()
