"""The versions of the collection format (spec/COLLECTION.md §8, the rule of spec/README.md "Versioning").

Floor 0: constants and the version check only. A minor version only adds what an older reader of its major may
ignore and still read right, so a part of a manifest this reader does not know is an error in a collection of a
version it knows and ignored in a newer minor one (``newer_minor``); anything else is a new major, refused by
the number. Collection majors 1 and 2 are read: 2.0 is the member table (§2.5), which a 1.x reader cannot read.
"""

from __future__ import annotations

from .. import format as F

__all__ = ["COLLECTION_FORMAT_NAME", "is_collection", "COLLECTION_VERSION", "OLDEST_COLLECTION_VERSION", "UNIFIED_VERSION",
           "FILES_VERSION", "LAYOUT_VERSION", "TABLE_VERSION", "WITHDRAWN_TABLE_VERSION", "ARRAY_VERSION", "KNOWN_MINORS",
           "version_str", "newer_minor", "table_allowed", "parse_collection_version"]

#: The ``format`` of a collection's manifest (a store's says ``"packfmt"``).
COLLECTION_FORMAT_NAME = "packfmt-collection"
#: The newest minor this reader knows of each major it reads: 1.2 added ``unified``, 1.3 ``layout`` and ``files``
#: (``doc_lengths.bin``), 1.4 the member table as a minor (withdrawn: a 1.3 reader cannot read it, so it is the
#: new major 2.0; 1.4 collections already written are still read); 2.0 is 1.4's content under its own major.
KNOWN_MINORS = {1: 4, 2: 0}
#: The newest version this reader knows (what a writer writes is ``ARRAY_VERSION`` or ``TABLE_VERSION``).
COLLECTION_VERSION = (2, 0)
#: Collections were added in 1.1; 1.1 collections are still read.
OLDEST_COLLECTION_VERSION = (1, 1)
UNIFIED_VERSION = (1, 2)
FILES_VERSION = (1, 3)
LAYOUT_VERSION = (1, 3)
#: What a writer writes for a collection whose member list is a JSON array: every 1.3 (and 2.0) reader reads it.
ARRAY_VERSION = (1, 3)
#: What a writer writes for a collection with a member table (§2.5).
TABLE_VERSION = (2, 0)
#: The member table's first, withdrawn, version: read, never written.
WITHDRAWN_TABLE_VERSION = (1, 4)


def version_str(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"


def newer_minor(version: tuple[int, int]) -> bool:
    """Whether ``version`` (of a major this reader reads) is a minor newer than the newest it knows of that major:
    parts it does not know are then ignored, never errors (spec/README.md "Versioning")."""
    return version[1] > KNOWN_MINORS[version[0]]


def table_allowed(version: tuple[int, int]) -> bool:
    """Whether ``members`` may be ``"table"`` (§2.5): in 1.4 (withdrawn, still read) and from 2.0 on."""
    return version >= WITHDRAWN_TABLE_VERSION


def parse_collection_version(value, *, file: str) -> tuple[int, int]:
    """A collection's ``format_version`` as ``(major, minor)``: majors 1 (from 1.1) and 2; any other major is refused
    by the number (``UnsupportedVersionError``), an older one than 1.1 as a ``FormatError``."""
    from ..errors import FormatError

    version = F.parse_version(value, file=file, majors=tuple(KNOWN_MINORS),
                              supported="collection formats 1.1-1.4 and 2.x (spec/COLLECTION.md §8)")
    if version < OLDEST_COLLECTION_VERSION:
        raise FormatError(file=file, field="format_version", expected=">= 1.1 (collections were added in 1.1)",
                          found=value)
    return version


def is_collection(obj: dict) -> bool:
    """Whether ``obj``, a parsed ``manifest.json``, is a collection's (what a command that meets a store learns
    without importing the collection code)."""
    return isinstance(obj, dict) and obj.get("format") == COLLECTION_FORMAT_NAME
