"""The versions of the collection format (spec/COLLECTION.md §8): what this reader knows, and when each part came;
and what says a manifest is a collection's (its ``format``).

Floor 0: constants only (and ``is_collection``, which needs nothing else: a command that meets a store learns it
without importing the collection code). A part of a manifest this reader does not know is an error in a collection
of a version it knows (``<= COLLECTION_VERSION``) and ignored in a newer minor one.
"""

from __future__ import annotations

__all__ = ["COLLECTION_FORMAT_NAME", "is_collection", "COLLECTION_VERSION", "COLLECTION_VERSION_STR", "OLDEST_COLLECTION_VERSION", "UNIFIED_VERSION",
           "FILES_VERSION", "LAYOUT_VERSION", "TABLE_VERSION", "version_str"]

#: The ``format`` of a collection's manifest (a store's says ``"packfmt"``).
COLLECTION_FORMAT_NAME = "packfmt-collection"
#: The newest version this reader knows: 1.2 added ``unified``, 1.3 ``layout`` and ``files`` (``doc_lengths.bin``),
#: 1.4 the member table (``members.bin`` and ``member_names.txt``, §2.5).
COLLECTION_VERSION = (1, 4)
COLLECTION_VERSION_STR = "1.4"
#: Collections were added in 1.1; 1.1 collections are still read.
OLDEST_COLLECTION_VERSION = (1, 1)
UNIFIED_VERSION = (1, 2)
FILES_VERSION = (1, 3)
LAYOUT_VERSION = (1, 3)
TABLE_VERSION = (1, 4)


def version_str(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"


def is_collection(obj: dict) -> bool:
    """Whether ``obj``, a parsed ``manifest.json``, is a collection's."""
    return isinstance(obj, dict) and obj.get("format") == COLLECTION_FORMAT_NAME
