"""Bounded-memory passes over large arrays: narrow document lengths, file chunks, dropped pages.

A memmap's pages count in the process's resident set once touched, and stay there: one pass over
a 10^8-document ``doc_offsets.bin`` adds 800 MB to the peak RSS of ``packfmt pack`` although no byte
of it is needed afterwards. ``release`` hands such pages back (``madvise(MADV_DONTNEED)``: for a
read-only file mapping the data stays in the page cache, a later access maps it again), and
``file_chunks`` reads a file's rows in chunks into one reused buffer, mapping nothing.
"""

from __future__ import annotations

import mmap
from pathlib import Path
from typing import Iterator

import numpy as np

__all__ = ["release", "file_chunks", "narrow_lengths", "INT32_MAX"]

INT32_MAX = int(np.iinfo(np.int32).max)
#: Elements per chunk of a pass over document offsets (32 MiB of int64).
CHUNK_ELEMS = 1 << 22


def release(arr) -> None:
    """Drop the resident pages of ``arr``'s read-only file mapping (no-op for anything else)."""
    mm = getattr(arr, "_mmap", None)  # np.memmap (and its views) keep the mmap.mmap they map
    if mm is None or not hasattr(mm, "madvise") or not hasattr(mmap, "MADV_DONTNEED"):
        return
    try:
        mm.madvise(mmap.MADV_DONTNEED)
    except (OSError, ValueError):  # a closed or odd mapping: keeping the pages is always correct
        pass


def narrow_lengths(doc_offsets: np.ndarray, cap: int | None = None) -> np.ndarray:
    """``np.diff(doc_offsets)`` as int32 when every length fits (else int64), computed in chunks.

    The offsets' pages are released afterwards (see ``release``), so a caller holding a memmap of
    ``doc_offsets.bin`` keeps only the 4 bytes per document of the result. ``cap``: the largest
    length the caller needs exactly; longer ones must still fit int32 to keep the narrow type.
    """
    n = max(0, doc_offsets.shape[0] - 1)
    out = np.empty(n, dtype=np.int32)
    for a in range(0, n, CHUNK_ELEMS):
        b = min(n, a + CHUNK_ELEMS)
        d = np.diff(np.asarray(doc_offsets[a:b + 1]))
        if d.size and int(d.max()) > INT32_MAX:  # a document longer than 2^31 - 1 tokens: keep int64
            release(doc_offsets)
            wide = np.diff(np.asarray(doc_offsets))
            release(doc_offsets)
            return wide
        out[a:b] = d
        release(doc_offsets)  # per chunk: never more than one chunk of offsets resident
    return out


def file_chunks(path: Path, dtype, row_shape: tuple = (), start: int = 0, stop: int | None = None,
                rows: int = 1 << 20) -> Iterator[tuple[int, np.ndarray]]:
    """``(first row, rows)`` of the rows ``[start, stop)`` of a headerless array file, ``rows`` at a time.

    Each chunk is read (not mapped) into one buffer reused for the next chunk: hold no reference
    to a chunk past the next iteration. Memory stays at one chunk whatever the file size.
    """
    dtype = np.dtype(dtype)
    row_bytes = dtype.itemsize * int(np.prod(row_shape, dtype=np.int64))
    with open(path, "rb", buffering=0) as f:
        if stop is None:
            stop = f.seek(0, 2) // row_bytes
        buf = np.empty((min(rows, max(stop - start, 0)),) + tuple(row_shape), dtype=dtype)
        view = memoryview(buf.reshape(-1).view(np.uint8))
        f.seek(start * row_bytes)
        a = start
        while a < stop:
            k = min(rows, stop - a)
            want, got = k * row_bytes, 0
            while got < want:
                n = f.readinto(view[got:want])
                if not n:
                    raise EOFError(f"{path}: ends at byte {a * row_bytes + got}, before row {stop}")
                got += n
            yield a, buf[:k]
            a += k
