"""Collections: many packfmt stores read, packed and merged as one dataset (spec/COLLECTION.md).

The names below are imported on first use (PEP 562): importing one module of this package (``versions``, to learn
whether a manifest is a collection's) does not import the readers and writers, nor numba with them.
"""

from __future__ import annotations

import importlib

#: Public name -> the module of this package that defines it.
_LAZY = {
    "COLLECTION_FORMAT_NAME": "manifest", "COLLECTION_VERSION_STR": "manifest", "CollectionManifest": "manifest",
    "Member": "manifest", "member_list_checksum": "manifest", "merge_physical": "physical", "Collection": "reader",
    "parse_source": "writer", "write_collection": "writer",
}

__all__ = ["Collection", "merge_physical", "CollectionManifest", "Member", "write_collection", "parse_source",
           "member_list_checksum", "COLLECTION_FORMAT_NAME", "COLLECTION_VERSION_STR"]


def __getattr__(name: str):
    if name not in _LAZY:  # (a submodule named in ``from packfmt.collection import x`` is then imported as one)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    globals()[name] = value
    return value
