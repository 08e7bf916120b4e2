"""One entry of a collection's member list (spec/COLLECTION.md §2.1, §2.2): ``Member`` and the rules of its
``name``, ``path`` and recorded ``manifest`` checksum, shared by the JSON ``members`` array (``manifest``) and the
member table (``member_table``, §2.5). Floor 0: strings and their checks, nothing opened."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .. import format as F
from ..errors import FormatError

__all__ = ["Member", "NAME_RE", "check_member_name", "check_member_path", "digest_int"]


@dataclass(frozen=True)
class Member:
    """One entry of ``members`` (spec/COLLECTION.md §2.1): ``path`` as written (relative to the collection directory)."""

    name: str
    path: str
    documents: int
    tokens: int
    images: int
    manifest: str  # "xxh3_64:<hex>" of the member's manifest.json bytes

    def to_json(self) -> dict:
        return {"name": self.name, "path": self.path, "documents": self.documents, "tokens": self.tokens,
                "images": self.images, "manifest": self.manifest}


NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\Z")  # \Z: "$" would also match before a final "\n"


def check_member_name(name, *, file: str = F.MANIFEST, field: str = "name") -> str:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise FormatError(file=file, field=field, expected="1-128 chars of [A-Za-z0-9_.-], starting with a letter or "
                          "digit", found=repr(name))
    return name


def check_member_path(path, *, file: str = F.MANIFEST, field: str = "path") -> str:
    """A relative POSIX path: no empty or '.' component, no backslash, not absolute ('..' allowed)."""
    ok = isinstance(path, str) and path and not path.startswith("/") and "\\" not in path and "\0" not in path
    if ok:
        ok = all(part not in ("", ".") for part in path.split("/"))
    if not ok:
        raise FormatError(file=file, field=field, expected="a relative POSIX path (no empty or '.' component, "
                          "no backslash, not starting with '/')", found=repr(path))
    return path


_DIGEST = re.compile(r"xxh3_64:([0-9a-f]{16})")


def digest_int(checksum: str) -> int:
    """The integer of ``"xxh3_64:<16 lowercase hex digits>"``; -1 for any other string."""
    found = _DIGEST.fullmatch(checksum)
    return int(found[1], 16) if found else -1
