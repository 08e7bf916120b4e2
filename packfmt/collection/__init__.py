"""Collections: many packfmt stores read, packed and merged as one dataset (spec/COLLECTION.md)."""

from .manifest import (
           COLLECTION_FORMAT_NAME,
           COLLECTION_VERSION_STR,
           CollectionManifest,
           Member,
           member_list_checksum,
)
from .physical import merge_physical
from .reader import Collection
from .writer import parse_source, write_collection

__all__ = ["Collection", "merge_physical", "CollectionManifest", "Member", "write_collection", "parse_source", "member_list_checksum",
           "COLLECTION_FORMAT_NAME", "COLLECTION_VERSION_STR"]
