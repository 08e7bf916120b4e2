"""Pack indexes of a collection carried into its physical merge (spec/COLLECTION.md §7.2).

A collection index's segments use collection-wide document ids, which are the merged store's
document ids when the collection is the merge's only source; its files are then copied (verified
against their checksums) and its ``index.json`` rebound from ``collection`` to the merged store's
``dataset`` checksums, as a 1.0 index. Any other index is named with the reason it stays behind.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

from .. import format as F
from .. import index_format as IF
from .._io import HashedFile
from ..index import list_pack_indexes
from .manifest import collection_reader, is_collection, member_list_checksum, parse_collection_manifest
from .verified_copy import VerifiedReader, copy_verified

__all__ = ["carry_indexes"]


def carry_indexes(sources: list[tuple[str | None, Path]], tmp: Path, binding: dict, buf: bytearray,
                  on_bytes: Callable[[int], None]) -> tuple[list[str], dict[str, str]]:
    """Copy the carriable pack indexes of the source collections into ``tmp/packs/``.

    ``binding`` is the merged store's ``dataset`` binding (its tokens.bin / doc_offsets.bin
    checksums). Returns the names carried and ``{index: why not}`` for every index left behind.
    """
    carried: list[str] = []
    not_carried: dict[str, str] = {}
    only = len(sources) == 1
    for _, path in sources:
        obj = F.read_json(path / F.MANIFEST, file=str(path / F.MANIFEST))
        names = list_pack_indexes(path) if is_collection(obj) else []
        cm = parse_collection_manifest(obj, read=collection_reader(path)) if names else None
        want = member_list_checksum(cm.members) if names else None
        for name in names:
            index_dir = path / F.PACKS_DIR / name
            label = str(index_dir / F.PACK_INDEX_JSON)
            raw = F.read_json(index_dir / F.PACK_INDEX_JSON, file=label)
            parsed = IF.parse_pack_index_manifest(raw, file=label)
            key = name if only else f"{path.name}/{name}"
            if not only:
                not_carried[key] = ("its collection is one of several sources, so the index covers only part of "
                                    "the merged store; pack the merged store")
            elif parsed.binding != {"collection": want}:
                not_carried[key] = "bound to another member list (stale); pack the merged store"
            elif "mixture" in raw:
                not_carried[key] = ("weighted (mixture): a store's index covers each document exactly once "
                                    "(FORMAT.md §4.3); pack the merged store")
            else:
                _copy_index(index_dir, tmp / F.PACKS_DIR / name, raw, parsed, binding, buf, on_bytes)
                carried.append(name)
    return carried, not_carried


def _copy_index(src: Path, out: Path, raw: dict, parsed, binding: dict, buf: bytearray,
                on_bytes: Callable[[int], None]) -> None:
    out.mkdir(parents=True)
    for fname, entry in sorted(parsed.files.items()):
        f = HashedFile(out / fname)
        copy_verified(VerifiedReader(src / fname, entry), f, buf, on_bytes)
        f.close()
    index = {k: v for k, v in raw.items() if k != "collection"}
    index["format_version"] = F.FORMAT_VERSION_STR
    index["dataset"] = dict(binding)
    IF.parse_pack_index_manifest(json.loads(F.canonical_json(index)), file=str(out / F.PACK_INDEX_JSON))
    with open(out / F.PACK_INDEX_JSON, "wb") as fh:
        fh.write(F.canonical_json(index))
        fh.flush()
        os.fsync(fh.fileno())
