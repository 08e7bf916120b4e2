"""One object of a remote dataset downloaded into the cache (``cache.Fetcher.file``): ranged GETs, the bytes hashed
and counted in order as they arrive, written to a temp name and renamed into place only when the count and the
xxh3_64 are the ones its manifest lists. Nothing here decides what to fetch or when (``cache``, ``packfmt.remote``).
Each GET is ``transport``'s (a deadline, retries, one ``StorageError`` when they are spent)."""

from __future__ import annotations

import os
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import xxhash

from .. import format as F
from .._io import CHUNK_BYTES
from ..errors import ChecksumError, FormatError
from .in_flight import env_count
from .transport import Remote, as_remote

__all__ = ["RANGES_ENV", "RANGES_IN_FLIGHT", "download", "ranges_in_flight"]

#: Ranged GETs of one file in flight at once. One stream from an object store runs at tens to a few hundred
#: MB/s and every request first waits out a round trip; a few at once fill the link (``benchmarks/bench_fetch.py``).
#: Memory: this many chunks of ``CHUNK_BYTES`` (8 MiB) per file being downloaded.
RANGES_IN_FLIGHT = 4
RANGES_ENV = "PACKFMT_FETCH_RANGES"


def download(fs: Remote, rpath: str, url: str, local: Path, tmp: Path, entry: F.FileEntry,
             label: str) -> os.stat_result:
    """Stream ``rpath`` into ``local`` through ``tmp``, refusing any byte count or checksum but the manifest's;
    return the stat of the file it renamed into place (what its marker records).

    Read as ranged GETs of at most ``CHUNK_BYTES`` (``fs.cat_file(start, end)``), the last one reaching one byte
    past the listed size, so an object longer than listed is seen without reading the rest of it and no request
    asks for the object's size first (one request per chunk: a small file is one round trip). Up to
    ``ranges_in_flight()`` of them are in flight at once; their bytes are hashed, counted and written in order.
    ``fs``: a ``transport.Remote`` (a back end itself is put under the environment's request rules)."""
    fs = as_remote(fs)
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


def ranges_in_flight() -> int:
    """Ranged GETs kept in flight per downloaded file: ``$PACKFMT_FETCH_RANGES``, else ``RANGES_IN_FLIGHT``."""
    return env_count(RANGES_ENV, RANGES_IN_FLIGHT, "ranged GETs in flight per file; 1 fetches one chunk after another")


def _chunks(fs, rpath: str, url: str, entry: F.FileEntry, label: str):
    """The object's bytes in order, in chunks of ``CHUNK_BYTES``, up to one byte past ``entry.bytes`` (a longer
    object stops there): the same ranges as one after another, ``ranges_in_flight()`` of them requested at once."""
    def missing() -> FormatError:
        return FormatError(f"{url}: missing (listed in {label} with {entry.bytes} bytes); the upload is incomplete: "
                           "write the dataset again", file=url, expected=f"{entry.bytes} bytes", found="missing")

    if entry.bytes == 0:  # (a range of an empty object is not satisfiable: its size asked instead, one HEAD)
        try:
            size = fs.size(rpath)
        except FileNotFoundError:
            raise missing() from None
        yield fs.cat_file(rpath, start=0, end=1) if size else b""
        return
    ranges = [(n, min(n + CHUNK_BYTES, entry.bytes + 1)) for n in range(0, entry.bytes + 1, CHUNK_BYTES)]
    # several at once only through an async back end (s3fs, gcsfs, adlfs, http: one event loop, safe from threads);
    # a sync one (a local or in-memory file system, sftp) is read one range after another, as before
    k = min(ranges_in_flight(), len(ranges)) if fs.async_impl else 1

    def get(r: tuple[int, int]) -> bytes:  # (a range past the object's end: b"", ``Remote.cat_file``)
        return fs.cat_file(rpath, start=r[0], end=r[1])

    if k == 1:  # one chunk (a small file: one round trip), or one at a time asked for: no thread
        results = map(get, ranges)
        pool = None
    else:  # a sliding window: the next range is asked for as soon as the oldest arrives
        pool = ThreadPoolExecutor(k, thread_name_prefix="packfmt-fetch")
        window = deque(pool.submit(get, r) for r in ranges[:k])
        rest = iter(ranges[k:])

        def in_order():
            while window:
                chunk = window.popleft().result()
                r = next(rest, None)
                if r is not None:
                    window.append(pool.submit(get, r))
                yield chunk

        results = in_order()
    try:
        for (begin, end), chunk in zip(ranges, _missing_as(results, missing)):
            yield chunk
            if len(chunk) < end - begin:  # the object ended (ranges asked past it are dropped unread)
                return
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def _missing_as(results, missing):
    """``results``, with a ``FileNotFoundError`` (the object is gone) raised as ``missing()``."""
    try:
        yield from results
    except FileNotFoundError:
        raise missing() from None

