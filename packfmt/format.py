"""The single source of truth for packfmt bytes on disk (spec/FORMAT.md, version 1.0): names, dtypes,
strict JSON, the store manifest and the layout its counts imply (``index_format`` holds ``index.json``).

Nothing else in packfmt spells a file name, a dtype or a manifest key by hand: it imports
them from here. Every binary file is one little-endian, C-ordered array with no header, so
each array starts at byte 0 of its own file (page-aligned when memory-mapped).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import xxhash

from .errors import ChecksumError, FormatError, UnsupportedVersionError

FORMAT_NAME = "packfmt"
FORMAT_VERSION = (1, 0)
FORMAT_VERSION_STR = f"{FORMAT_VERSION[0]}.{FORMAT_VERSION[1]}"
#: The newest version this reader knows: 1.1 added collections (spec/COLLECTION.md). Stores and
#: their pack indexes are still written as 1.0; a collection's pack indexes as 1.1; a collection
#: itself as 1.3, or 2.0 with a member table (``collection.versions``: its own versions, majors 1 and 2).
KNOWN_VERSION = (1, 1)
#: The newest pack index version this reader knows: 1.2 added a layout's per-shard digests (COLLECTION.md §9.4).
KNOWN_INDEX_VERSION = (1, 2)
PACK_INDEX_FORMAT_NAME = "packfmt-pack-index"

MANIFEST = "manifest.json"
#: Largest manifest / index.json a reader accepts (bytes); guards against hostile files.
MAX_JSON_BYTES = 64 * 1024 * 1024

# Dataset files: name -> (dtype, columns). dtype None = token dtype from the manifest.
TOKENS = "tokens.bin"
DOC_OFFSETS = "doc_offsets.bin"
LOSS_MASK = "loss_mask.bin"
IMAGE_BLOBS = "image_blobs.bin"
IMAGE_OFFSETS = "image_offsets.bin"
IMAGE_META = "image_meta.bin"
DOC_IMAGE_OFFSETS = "doc_image_offsets.bin"
IMAGE_TOKEN_SPANS = "image_token_spans.bin"

PACKS_DIR = "packs"
PACK_INDEX_JSON = "index.json"
PACK_OFFSETS = "pack_offsets.bin"
SEGMENTS = "segments.bin"
PACK_TOKEN_OFFSETS = "pack_token_offsets.bin"
PACKED_TOKENS = "tokens.bin"
PACKED_LOSS_MASK = "loss_mask.bin"
PACK_DOC_IDS = "doc_ids.bin"  # unused in 1.0, reserved

OFFSET_DTYPE = np.dtype("<i8")
MASK_DTYPE = np.dtype("u1")
BLOB_DTYPE = np.dtype("u1")
IMAGE_META_DTYPE = np.dtype("<u4")
IMAGE_META_COLUMNS = 3  # width, height, codec
SEGMENT_COLUMNS = 3  # doc, begin, end

TOKEN_DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
UINT16_VOCAB_LIMIT = 65536  # vocab_size <= this -> uint16 (ids 0..65535)
MAX_VOCAB_SIZE = 2**32

CHECKSUM_ALGORITHM = "xxh3_64"
CHECKSUM_RE = re.compile(r"^xxh3_64:[0-9a-f]{16}\Z")  # \Z: "$" would also match before a final "\n"

# Image codecs (uint32 in image_meta.bin column 2).
CODECS = {1: "png", 2: "jpeg", 3: "webp", 4: "bmp", 5: "gif", 6: "tiff", 16: "rgb8", 17: "rgb8+zstd"}
CODEC_IDS = {name: code for code, name in CODECS.items()}
#: Pillow format names -> codec name.
PIL_FORMATS = {"PNG": "png", "JPEG": "jpeg", "WEBP": "webp", "BMP": "bmp", "GIF": "gif", "TIFF": "tiff"}

SPECIAL_TOKEN_KEYS = ("bos", "eos", "pad", "image")

#: Largest ``width * height`` of a stored image (spec §3.4): writers refuse more, readers refuse to decode
#: more. 178,956,970 = twice Pillow's ``MAX_IMAGE_PIXELS``, the size at which Pillow itself refuses.
MAX_IMAGE_PIXELS = 178_956_970
#: ``seed`` of a pack index is null or an integer in ``[0, SEED_LIMIT)`` (spec §4.1): it fits an i8.
SEED_LIMIT = 2**63


def token_dtype_for_vocab(vocab_size: int) -> str:
    """Return the token dtype name the spec prescribes for ``vocab_size`` (spec §3.1)."""
    if not isinstance(vocab_size, int) or vocab_size < 1 or vocab_size > MAX_VOCAB_SIZE:
        raise FormatError(field="vocab_size", expected=f"integer in [1, {MAX_VOCAB_SIZE}]", found=vocab_size)
    return "uint16" if vocab_size <= UINT16_VOCAB_LIMIT else "uint32"


def canonical_json(obj: Any) -> bytes:
    """Deterministic JSON bytes: sorted keys, 2-space indent, UTF-8, trailing newline."""
    return (json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")


def parse_version(value: Any, *, file: str, field: str = "format_version", majors: tuple[int, ...] = (FORMAT_VERSION[0],),
                  supported: str | None = None) -> tuple[int, int]:
    """``"MAJOR.MINOR"`` as ``(major, minor)``; a major not in ``majors`` is refused by the number (spec/README.md
    "Versioning"), ``supported`` naming what this reader reads (default: format 1.0's major)."""
    if not isinstance(value, str) or not re.fullmatch(r"(0|[1-9]\d*)\.(0|[1-9]\d*)", value):
        raise FormatError(file=file, field=field, expected='"MAJOR.MINOR" string, e.g. "1.0"', found=repr(value))
    major, minor = (int(x) for x in value.split("."))
    if major not in majors:
        supported = supported or f"major version {FORMAT_VERSION[0]} (format {FORMAT_VERSION_STR})"
        raise UnsupportedVersionError(
            f"{file}: {field}: this reader supports {supported}; found {value}. "
            + ("Upgrade packfmt to read it." if major > max(majors) else "Convert it with an older packfmt."),
            file=file, field=field, expected=" or ".join(f"{m}.x" for m in majors), found=value,
        )
    return major, minor


def read_json(path, *, file: str) -> dict:
    """Read a JSON object with a size bound; never evaluates anything (no pickle, no eval).

    V1 / V21 (spec §2.1): at most 64 MiB, UTF-8, no NaN/Infinity, no duplicate keys, root an object;
    deep nesting (``RecursionError``) is a FormatError like any other parse failure.
    """
    return parse_json(read_json_bytes(path, file=file), file=file)


def read_json_bytes(path, *, file: str) -> bytes:
    """The bytes of a JSON file of at most ``MAX_JSON_BYTES`` (one open, one fstat): what a caller that also
    hashes the file (a collection's member manifest, C3) parses with ``parse_json``, so both see the same bytes."""
    import os

    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise FormatError(f"{file}: missing (expected a JSON file at {path})", file=file, field="file", expected="file", found="missing") from None
    try:
        size = os.fstat(fd).st_size
        if size > MAX_JSON_BYTES:
            raise FormatError(file=file, field="size", expected=f"<= {MAX_JSON_BYTES} bytes", found=size)
        parts, total = [], 0
        while True:  # a file grown since fstat is read to its end, or refused once too large
            want = max(size + 1, 1 << 16)
            chunk = os.read(fd, want)
            parts.append(chunk)
            total += len(chunk)
            if total > MAX_JSON_BYTES:
                raise FormatError(file=file, field="size", expected=f"<= {MAX_JSON_BYTES} bytes", found=f"> {total}")
            if len(chunk) < want:  # a short read of a regular file: its end
                break
    finally:
        os.close(fd)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def parse_json(raw: bytes, *, file: str) -> dict:
    """``read_json`` of bytes already read (``read_json_bytes``)."""
    try:
        obj = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant, object_pairs_hook=_no_duplicate_keys)
    except (UnicodeDecodeError, json.JSONDecodeError, ValueError, RecursionError) as exc:
        raise FormatError(f"{file}: not valid UTF-8 JSON ({exc})", file=file, field=_where_unparseable(exc),
                          expected="JSON object", found="unparseable") from None
    if not isinstance(obj, dict):
        raise FormatError(file=file, field="<root>", expected="JSON object", found=type(obj).__name__)
    return obj


def _where_unparseable(exc: Exception) -> str:
    """The ``field`` of a JSON file that does not parse: where the parser stopped (a line and column, a byte), or why
    (``nesting``: deeper than the parser goes; ``<text>``: a duplicate key or NaN/Infinity, named in the message)."""
    if isinstance(exc, json.JSONDecodeError):
        return f"line {exc.lineno} column {exc.colno}"
    if isinstance(exc, UnicodeDecodeError):
        return f"byte {exc.start}"
    return "nesting" if isinstance(exc, RecursionError) else "<text>"


def _no_duplicate_keys(pairs):
    obj = dict(pairs)
    if len(obj) == len(pairs):
        return obj
    obj = {}
    for key, value in pairs:
        if key in obj:
            raise ValueError(f"duplicate key {key!r}")
        obj[key] = value
    return obj


def _reject_constant(name: str):
    raise ValueError(f"non-standard JSON constant {name}")


# ----------------------------------------------------------------------------- manifest schema
@dataclass(frozen=True)
class FileEntry:
    """One entry of a manifest's ``files`` table."""

    name: str
    bytes: int
    checksum: str  # "xxh3_64:<16 hex digits>"


def require(obj: Mapping, key: str, types, *, file: str, prefix: str = "") -> Any:
    value = obj.get(key, _MISSING)  # the field's name is composed only for an error (tens of calls per manifest)
    cls = value.__class__
    if cls is types or (types.__class__ is tuple and cls in types):  # exactly a wanted type (a bool is not an int)
        return value
    if value is _MISSING:
        field = f"{prefix}{key}"
        raise FormatError(f"{file}: {field}: required key missing", file=file, field=field, expected="present", found="missing")
    if types is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in _as_tuple(types))
    if not ok:
        raise FormatError(file=file, field=f"{prefix}{key}", expected=_type_names(types), found=repr(value))
    return value


_MISSING = object()


def _as_tuple(t):
    return t if isinstance(t, tuple) else (t,)


def _type_names(types) -> str:
    names = {int: "integer", str: "string", dict: "object", list: "array", bool: "boolean", type(None): "null"}
    return " or ".join(names.get(t, t.__name__) for t in _as_tuple(types))


#: Largest count, size or capacity a reader accepts: every offset is an int64 (spec §2.2).
INT64_MAX = 2**63 - 1


def nonneg(value: int, *, file: str, field: str, low: int = 0) -> int:
    if not low <= value <= INT64_MAX:
        raise FormatError(file=file, field=field, expected=f"an integer in [{low}, 2^63 - 1]", found=value)
    return value


def check_listed_bytes(name: str, data: bytes, entry: "FileEntry", listed_in: str) -> None:
    """A collection's own file read whole (``data``: at most one byte more than recorded is enough to tell) against
    its ``files`` entry: the recorded size, then the recorded checksum (spec/COLLECTION.md §2.4, §2.5); the errors
    name the file and say what to do."""
    if len(data) != entry.bytes:
        raise FormatError(f"{name}: size: expected {entry.bytes} bytes ({listed_in}), found {len(data)}"
                          + ("+" if len(data) > entry.bytes else ""), file=name, field="size", expected=entry.bytes,
                          found=len(data))
    found = "xxh3_64:" + xxhash.xxh3_64_hexdigest(data)
    if found != entry.checksum:
        raise ChecksumError(f"{name}: checksum: expected {entry.checksum} ({listed_in}), found {found}: the file "
                            "changed after the collection was written; run `packfmt merge` again", file=name,
                            field="checksum", expected=entry.checksum, found=found)


def parse_files_table(obj: Mapping, *, file: str) -> dict[str, FileEntry]:
    """V8 / V24 (spec §2.4): plain file names, ``bytes >= 0``, ``xxh3_64:`` checksums."""
    files = require(obj, "files", dict, file=file)
    out = {}
    for name, entry in files.items():
        prefix = f"files.{name}."
        if not isinstance(entry, dict):
            raise FormatError(file=file, field=f"files.{name}", expected="object", found=repr(entry))
        if "/" in name or "\\" in name or name in ("", ".", "..") or name.startswith("."):
            raise FormatError(file=file, field="files", expected="plain file names", found=repr(name))
        nbytes = nonneg(require(entry, "bytes", int, file=file, prefix=prefix), file=file, field=prefix + "bytes")
        checksum = require(entry, "checksum", str, file=file, prefix=prefix)
        if not CHECKSUM_RE.match(checksum):
            raise FormatError(file=file, field=prefix + "checksum", expected='"xxh3_64:" + 16 lowercase hex digits', found=repr(checksum))
        out[name] = FileEntry(name, nbytes, checksum)
    return out


@dataclass(frozen=True)
class Manifest:
    """The parsed, type-checked ``manifest.json`` (spec §2). ``raw`` keeps unknown keys."""

    version: tuple[int, int]
    vocab_size: int
    token_dtype: str
    tokenizer: dict
    special_tokens: dict
    num_documents: int
    num_tokens: int
    num_images: int
    has_loss_mask: bool
    files: dict[str, FileEntry]
    raw: dict

    @property
    def np_token_dtype(self) -> np.dtype:
        return TOKEN_DTYPES[self.token_dtype]


def parse_manifest(obj: dict, *, file: str = MANIFEST) -> Manifest:
    """Check every field the spec requires; raise FormatError naming the first bad one.

    Invariants V2, V3 (every REQUIRED key with its type, via ``_req``), V4, V5, V6, V7, V8, V9 of spec §6.
    """
    fmt = obj.get("format")
    if fmt != FORMAT_NAME:
        raise UnsupportedVersionError(file=file, field="format", expected=repr(FORMAT_NAME), found=repr(fmt))
    version = parse_version(require(obj, "format_version", str, file=file), file=file)  # V2
    producer = require(obj, "producer", dict, file=file)
    require(producer, "name", str, file=file, prefix="producer.")
    require(producer, "version", str, file=file, prefix="producer.")
    vocab_size = require(obj, "vocab_size", int, file=file)
    if not 1 <= vocab_size <= MAX_VOCAB_SIZE:  # V4
        raise FormatError(file=file, field="vocab_size", expected=f"integer in [1, {MAX_VOCAB_SIZE}]", found=vocab_size)
    token_dtype = require(obj, "token_dtype", str, file=file)
    expected_dtype = token_dtype_for_vocab(vocab_size)
    if token_dtype != expected_dtype:
        raise FormatError(file=file, field="token_dtype", expected=f"{expected_dtype!r} for vocab_size {vocab_size}", found=repr(token_dtype))
    tokenizer = require(obj, "tokenizer", dict, file=file)
    require(tokenizer, "name", str, file=file, prefix="tokenizer.")
    tok_hash = require(tokenizer, "hash", (str, type(None)), file=file, prefix="tokenizer.")  # V5
    if tok_hash is not None and not re.fullmatch(r"sha256:[0-9a-f]{64}", tok_hash):
        raise FormatError(file=file, field="tokenizer.hash", expected='null or "sha256:" + 64 hex digits', found=repr(tok_hash))
    special = require(obj, "special_tokens", dict, file=file)  # V6
    for key in SPECIAL_TOKEN_KEYS:
        value = require(special, key, (int, type(None)), file=file, prefix="special_tokens.")
        if value is not None and not 0 <= value < vocab_size:
            raise FormatError(file=file, field=f"special_tokens.{key}", expected=f"null or id in [0, {vocab_size})", found=value)
    counts = require(obj, "counts", dict, file=file)  # V7
    n_docs = nonneg(require(counts, "documents", int, file=file, prefix="counts."), file=file, field="counts.documents")
    n_tokens = nonneg(require(counts, "tokens", int, file=file, prefix="counts."), file=file, field="counts.tokens")
    n_images = nonneg(require(counts, "images", int, file=file, prefix="counts."), file=file, field="counts.images")
    has_mask = require(obj, "loss_mask", bool, file=file)
    checksum_alg = require(obj, "checksum_algorithm", str, file=file)  # V8
    if checksum_alg != CHECKSUM_ALGORITHM:
        raise FormatError(file=file, field="checksum_algorithm", expected=repr(CHECKSUM_ALGORITHM), found=repr(checksum_alg))
    files = parse_files_table(obj, file=file)
    needed = required_files(has_mask, n_images > 0)  # V9
    for name in needed:
        if name not in files:
            raise FormatError(f"{file}: files.{name}: required entry missing", file=file, field=f"files.{name}", expected="present", found="missing")
    for name in set(required_files(True, True)) - set(needed):
        if name in files:
            raise FormatError(f"{file}: files.{name}: listed although loss_mask/counts.images say it must be absent",
                              file=file, field=f"files.{name}", expected="absent", found="listed")
    return Manifest(version, vocab_size, token_dtype, tokenizer, special, n_docs, n_tokens, n_images, has_mask, files, obj)


def required_files(has_loss_mask: bool, has_images: bool) -> list[str]:
    names = [TOKENS, DOC_OFFSETS]
    if has_loss_mask:
        names.append(LOSS_MASK)
    if has_images:
        names += [IMAGE_BLOBS, IMAGE_OFFSETS, IMAGE_META, DOC_IMAGE_OFFSETS, IMAGE_TOKEN_SPANS]
    return names


def expected_layout(m: Manifest) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    """File name -> (dtype, shape) implied by the manifest's counts (spec §3).

    The image blob file's length is not implied by the counts; it is checked against
    ``image_offsets[-1]`` instead, so it is absent from this table.
    """
    layout = {
        TOKENS: (m.np_token_dtype, (m.num_tokens,)),
        DOC_OFFSETS: (OFFSET_DTYPE, (m.num_documents + 1,)),
    }
    if m.has_loss_mask:
        layout[LOSS_MASK] = (MASK_DTYPE, (m.num_tokens,))
    if m.num_images > 0:
        layout[IMAGE_OFFSETS] = (OFFSET_DTYPE, (m.num_images + 1,))
        layout[IMAGE_META] = (IMAGE_META_DTYPE, (m.num_images, IMAGE_META_COLUMNS))
        layout[DOC_IMAGE_OFFSETS] = (OFFSET_DTYPE, (m.num_documents + 1,))
        layout[IMAGE_TOKEN_SPANS] = (OFFSET_DTYPE, (m.num_images, 2))
    return layout


def nbytes_of(dtype: np.dtype, shape: tuple[int, ...]) -> int:
    return int(math.prod(shape)) * np.dtype(dtype).itemsize
