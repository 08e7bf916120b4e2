"""One object of a remote dataset downloaded into the cache (``cache._Fetcher.file``): ranged GETs, the bytes hashed
and counted in order as they arrive, written to a temp name and renamed into place only when the count and the
xxh3_64 are the ones its manifest lists. Nothing here decides what to fetch or when (``cache``, ``pack_mirror``)."""

from __future__ import annotations

import os
from pathlib import Path

import xxhash

from .. import format as F
from .._io import CHUNK_BYTES
from ..errors import ChecksumError, FormatError

__all__ = ["download"]


def download(fs, rpath: str, url: str, local: Path, tmp: Path, entry: F.FileEntry, label: str) -> os.stat_result:
    """Stream ``rpath`` into ``local`` through ``tmp``, refusing any byte count or checksum but the manifest's;
    return the stat of the file it renamed into place (what its marker records).

    Read as ranged GETs of at most ``CHUNK_BYTES`` (``fs.cat_file(start, end)``), the last one reaching one byte
    past the listed size, so an object longer than listed is seen without reading the rest of it and no request
    asks for the object's size first (one request per chunk: a small file is one round trip)."""
    h, n = xxhash.xxh3_64(), 0
    try:
        with open(tmp, "wb") as dst:
            for chunk in _chunks(fs, rpath, url, entry, label):
                h.update(chunk)
                n += len(chunk)
                dst.write(chunk)
            dst.flush()
            os.fsync(dst.fileno())
            if n != entry.bytes:
                raise FormatError(f"{url}: size: expected {entry.bytes} bytes ({label}), found "
                                  f"{f'more than {entry.bytes}' if n > entry.bytes else n}; refused by the cache (nothing served). "
                                  "The object is not the one the manifest lists: write the dataset again", file=url,
                                  field="size", expected=entry.bytes,
                                  found=f"> {entry.bytes}" if n > entry.bytes else n)
            found = "xxh3_64:" + h.hexdigest()
            if found != entry.checksum:
                raise ChecksumError(f"{url}: checksum: expected {entry.checksum} ({label}), found {found}; refused by "
                                    "the cache (nothing served). The object is not the one the manifest lists: write "
                                    "the dataset again", file=url, field="checksum", expected=entry.checksum, found=found)
            os.replace(tmp, local)
            return os.fstat(dst.fileno())  # after the rename (which sets ctime): what the marker records
    finally:
        tmp.unlink(missing_ok=True)


def _chunks(fs, rpath: str, url: str, entry: F.FileEntry, label: str):
    """The object's bytes in chunks, up to one byte past ``entry.bytes`` (a longer object stops there)."""
    def missing() -> FormatError:
        return FormatError(f"{url}: missing (listed in {label} with {entry.bytes} bytes); the upload is incomplete: "
                           "write the dataset again", file=url, expected=f"{entry.bytes} bytes", found="missing")

    if entry.bytes == 0:  # (a range of an empty object is not satisfiable: read it as a stream, one chunk at most)
        try:
            src = fs.open(rpath, "rb", block_size=CHUNK_BYTES)
        except FileNotFoundError:
            raise missing() from None
        with src:
            yield src.read(CHUNK_BYTES)
        return
    n = 0
    while n <= entry.bytes:
        end = min(n + CHUNK_BYTES, entry.bytes + 1)
        try:
            chunk = fs.cat_file(rpath, start=n, end=end)
        except FileNotFoundError:
            raise missing() from None
        yield chunk
        if len(chunk) < end - n:  # the object ended
            return
        n = end
