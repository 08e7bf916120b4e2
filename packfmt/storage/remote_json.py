"""JSON read from object storage: its size known before its bytes are read, then parsed by ``format``'s one rule
(spec/FORMAT.md §2.1, V1; spec/SECURITY.md A1, A2).

Every remote JSON packfmt reads (a store's or collection's ``manifest.json``, a member's, a pack index's
``index.json``) goes through ``read_json``: a ranged GET of its first ``FIRST_BYTES`` (one request: a manifest is
almost always smaller); only when that range comes back full is the object's size asked (a HEAD), and one larger
than ``format.MAX_JSON_BYTES`` refused before any more of it is read; else one GET of at most that many bytes plus
one, so the bytes parsed are one answer of the server, never pieces of two versions. Memory stays bounded by the
limit whatever the object's size. The bytes are then ``format.parse_json``'s: UTF-8, standard JSON (no NaN), no
duplicate keys, an object at the root, deep nesting refused, each failure a ``FormatError`` naming the URL.
"""

from __future__ import annotations

import posixpath

from .. import format as F
from ..errors import FormatError
from .errors import require_bucket
from .transport import Remote

__all__ = ["FIRST_BYTES", "read_bounded", "read_json", "read_manifest"]

#: Bytes of a remote JSON read by the first request (a larger one costs a HEAD and a second GET).
FIRST_BYTES = 1 << 20


def read_bounded(fs: Remote, rpath: str, label: str, limit: int = F.MAX_JSON_BYTES) -> bytes:
    """The bytes of the object ``rpath`` (named ``label`` in errors), refused (``FormatError``, field ``size``) when
    it holds more than ``limit``; ``FileNotFoundError`` when it is missing (the caller names what that means)."""
    first = min(FIRST_BYTES, limit + 1)
    raw = fs.cat_file(rpath, start=0, end=first)
    if len(raw) < first:
        return raw
    size = fs.size(rpath) if first <= limit else None  # (a HEAD: the rest is read only if it may be)
    if size is not None and size <= limit:
        raw = fs.cat_file(rpath, start=0, end=limit + 1)  # one answer, whole (bounded even if it grew meanwhile)
        if len(raw) <= limit:
            return raw
        size = None
    found = f"more than {limit:,}" if size is None else f"{size:,}"
    raise FormatError(f"{label}: size: expected at most {limit:,} bytes (a JSON file of packfmt, V1), found {found}; "
                      "refused before it was read. It is not a file packfmt wrote: check the URL, or write the dataset "
                      "again", file=label, field="size", expected=f"<= {limit} bytes", found=found)


def read_json(fs: Remote, rpath: str, label: str) -> tuple[bytes, dict]:
    """``(bytes, object)`` of the JSON object at ``rpath`` (``read_bounded``, then ``format.parse_json``)."""
    raw = read_bounded(fs, rpath, label)
    return raw, F.parse_json(raw, file=label)


def read_manifest(fs: Remote, rpath: str, url: str, storage_options: dict | None = None) -> tuple[bytes, dict]:
    """``read_json`` of the manifest ``rpath`` of the dataset at ``url`` (a commit point: always from the bucket); one
    that is missing is a ``FormatError`` saying the URL holds no dataset (or a ``StorageError``: no such bucket)."""
    name = posixpath.basename(rpath)
    try:
        return read_json(fs, rpath, f"{url}/{name}")
    except FileNotFoundError:
        require_bucket(fs, url, storage_options)
        raise FormatError(f"{url}: not a packfmt dataset (no {name} there); check the URL, or write one with packfmt "
                          "build / merge", file=url, expected="a manifest", found="missing") from None
