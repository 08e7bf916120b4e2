"""Collections as older writers left them, for the tests of their readers.

``without_lengths_record``: written before ``doc_lengths.bin`` (spec/COLLECTION.md 1.2), so its readers take the
per-member path (each member's manifest and ``doc_offsets.bin``), which stays valid. ``without_shard_rows``: a
layout's index written before §9.4 (1.1), which a streamed read fetches whole."""

from __future__ import annotations

import json
from pathlib import Path

from packfmt import format as F
from packfmt.collection.lengths import LENGTHS_FILE


def without_lengths_record(root) -> Path:
    """Rewrite the collection at ``root`` as a 1.2 one (no ``files``, no ``doc_lengths.bin``); return ``root``."""
    root = Path(root)
    obj = json.loads((root / F.MANIFEST).read_bytes())
    obj.pop("files", None)
    if "layout" not in obj:
        obj["format_version"] = "1.2"
    (root / F.MANIFEST).write_bytes(F.canonical_json(obj))
    (root / LENGTHS_FILE).unlink(missing_ok=True)
    return root


def without_shard_rows(index_dir) -> Path:
    """Rewrite a layout's pack index at ``index_dir`` as written before spec/COLLECTION.md §9.4 (format 1.1, neither
    ``shard_digests.bin`` nor ``pack_tokens.bin``): a streamed read fetches it whole; return ``index_dir``."""
    d = Path(index_dir)
    obj = json.loads((d / F.PACK_INDEX_JSON).read_bytes())
    for name in ("shard_digests.bin", "pack_tokens.bin"):
        del obj["files"][name]
        (d / name).unlink()
    obj["format_version"] = "1.1"
    (d / F.PACK_INDEX_JSON).write_bytes(F.canonical_json(obj))
    return d
