"""The schema of a pack index's ``index.json`` (spec/FORMAT.md §4.1, COLLECTION.md §4): parsed and checked
field by field, and the file layout its counts imply. Names and dtypes come from ``packfmt.format``."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import FormatError, UnsupportedVersionError
from .format import (
    CHECKSUM_RE,
    DOC_OFFSETS,
    KNOWN_INDEX_VERSION,
    MASK_DTYPE,
    OFFSET_DTYPE,
    PACK_INDEX_FORMAT_NAME,
    PACK_OFFSETS,
    PACK_TOKEN_OFFSETS,
    PACKED_LOSS_MASK,
    PACKED_TOKENS,
    SEED_LIMIT,
    SEGMENT_COLUMNS,
    SEGMENTS,
    TOKENS,
    FileEntry,
    nonneg,
    parse_files_table,
    parse_version,
    require,
)

__all__ = ["ALGORITHM_NAMES", "OVERSIZE_POLICIES", "PackIndexManifest", "check_index_name", "check_seed",
           "parse_pack_index_manifest", "pack_index_layout"]

ALGORITHM_NAMES = ("ffd", "bfd", "first_fit_shuffle", "shuffle_and_pack", "greedy", "balanced", "pad")
OVERSIZE_POLICIES = ("split", "truncate", "drop")
_INDEX_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\Z")  # \Z, not "$" (a final "\n")


def check_index_name(name: str) -> str:
    if not isinstance(name, str) or not _INDEX_NAME_RE.match(name):
        raise FormatError(field="name", expected="1-128 chars of [A-Za-z0-9_.-], not starting with '.', '_' or '-'", found=repr(name))
    return name


@dataclass(frozen=True)
class PackIndexManifest:
    """Parsed ``packs/<name>/index.json`` (spec §4)."""

    version: tuple[int, int]
    name: str
    capacity: int
    algorithm: str
    seed: int | None
    oversize: str
    num_packs: int
    num_segments: int
    materialized: bool
    dataset: dict | None  # the store's checksums (None for a collection's index)
    files: dict[str, FileEntry]
    raw: dict
    binding: dict = field(default_factory=dict)  # {"dataset": {...}} or {"collection": "xxh3_64:..."}

    @property
    def stats(self) -> dict:
        return self.raw.get("stats", {})

    @property
    def params(self) -> dict:
        return self.raw.get("params", {})


def check_seed(seed: Any, *, file: str | None = None, field: str = "seed") -> int | None:
    """``seed`` of a pack index: null or an integer in ``[0, 2**63)`` (spec §4.1), else FormatError."""
    if seed is not None and (not isinstance(seed, (int, np.integer)) or isinstance(seed, bool)
                             or not 0 <= seed < SEED_LIMIT):
        raise FormatError(file=file, field=field, expected="null or an integer in [0, 2**63)", found=repr(seed))
    return None if seed is None else int(seed)


def parse_pack_index_manifest(obj: dict, *, file: str) -> PackIndexManifest:
    """Check ``index.json`` (spec §4.1): V21 (format, version) and V22 (keys, types and ranges)."""
    fmt = obj.get("format")
    if fmt != PACK_INDEX_FORMAT_NAME:
        raise UnsupportedVersionError(file=file, field="format", expected=repr(PACK_INDEX_FORMAT_NAME), found=repr(fmt))
    version = parse_version(require(obj, "format_version", str, file=file), file=file)
    producer = require(obj, "producer", dict, file=file)
    require(producer, "name", str, file=file, prefix="producer.")
    require(producer, "version", str, file=file, prefix="producer.")
    name = require(obj, "name", str, file=file)
    try:
        check_index_name(name)
    except FormatError as exc:
        raise FormatError(file=file, field="name", expected=exc.expected, found=exc.found) from None
    capacity = nonneg(require(obj, "capacity", int, file=file), file=file, field="capacity", low=1)
    algorithm = require(obj, "algorithm", str, file=file)
    if algorithm not in ALGORITHM_NAMES and version <= KNOWN_INDEX_VERSION:
        raise FormatError(file=file, field="algorithm", expected=f"one of {list(ALGORITHM_NAMES)}", found=repr(algorithm))
    seed = check_seed(require(obj, "seed", (int, type(None)), file=file), file=file)
    oversize = require(obj, "oversize", str, file=file)
    if oversize not in OVERSIZE_POLICIES:
        raise FormatError(file=file, field="oversize", expected=f"one of {list(OVERSIZE_POLICIES)}", found=repr(oversize))
    params = require(obj, "params", dict, file=file)
    for key in ("max_docs_per_pack", "max_images_per_pack"):
        value = params.get(key)  # an absent key reads as null (no limit), spec §4.1
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise FormatError(file=file, field=f"params.{key}", expected="null or integer >= 1", found=repr(value))
    require(obj, "stats", dict, file=file)
    counts = require(obj, "counts", dict, file=file)
    n_packs = nonneg(require(counts, "packs", int, file=file, prefix="counts."), file=file, field="counts.packs")
    n_segments = nonneg(require(counts, "segments", int, file=file, prefix="counts."), file=file, field="counts.segments")
    nonneg(require(counts, "packed_tokens", int, file=file, prefix="counts."), file=file, field="counts.packed_tokens")
    materialized = require(obj, "materialized", bool, file=file)
    binding = _parse_binding(obj, version, file=file)
    files = parse_files_table(obj, file=file)
    needed = [PACK_OFFSETS, SEGMENTS] + ([PACK_TOKEN_OFFSETS, PACKED_TOKENS] if materialized else [])
    for fname in needed:
        if fname not in files:
            raise FormatError(f"{file}: files.{fname}: required entry missing", file=file, field=f"files.{fname}", expected="present", found="missing")
    return PackIndexManifest(version, name, capacity, algorithm, seed, oversize, n_packs, n_segments, materialized,
                             binding.get("dataset"), files, obj, binding)


def _parse_binding(obj: dict, version: tuple[int, int], *, file: str) -> dict:
    """``dataset`` (the store's two checksums, §4.1) or, from 1.1, ``collection`` (spec/COLLECTION.md §4)."""
    if version >= (1, 1) and "collection" in obj and "dataset" not in obj:
        value = require(obj, "collection", str, file=file)
        if not CHECKSUM_RE.match(value):
            raise FormatError(file=file, field="collection", expected="xxh3_64 checksum string", found=repr(value))
        return {"collection": value}
    dataset = require(obj, "dataset", dict, file=file)
    for key in (TOKENS, DOC_OFFSETS):
        value = require(dataset, key, str, file=file, prefix="dataset.")
        if not CHECKSUM_RE.match(value):
            raise FormatError(file=file, field=f"dataset.{key}", expected="xxh3_64 checksum string", found=repr(value))
    return {"dataset": {TOKENS: dataset[TOKENS], DOC_OFFSETS: dataset[DOC_OFFSETS]}}


def pack_index_layout(pm: PackIndexManifest, token_dtype: np.dtype, has_loss_mask: bool, num_packed_tokens: int | None) -> dict:
    layout = {
        PACK_OFFSETS: (OFFSET_DTYPE, (pm.num_packs + 1,)),
        SEGMENTS: (OFFSET_DTYPE, (pm.num_segments, SEGMENT_COLUMNS)),
    }
    if pm.materialized:
        layout[PACK_TOKEN_OFFSETS] = (OFFSET_DTYPE, (pm.num_packs + 1,))
        if num_packed_tokens is not None:
            layout[PACKED_TOKENS] = (token_dtype, (num_packed_tokens,))
            if has_loss_mask:
                layout[PACKED_LOSS_MASK] = (MASK_DTYPE, (num_packed_tokens,))
    return layout
