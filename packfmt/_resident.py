"""Bounded-memory passes over large memmaps: narrow document lengths, pages handed back.

A memmap's pages count in the process's resident set once touched, and stay there: one pass over
a 10^8-document ``doc_offsets.bin`` adds 800 MB to the peak RSS of ``packfmt pack`` although no byte
of it is needed afterwards. ``release`` hands such pages back (``madvise(MADV_DONTNEED)``: for a
read-only file mapping the data stays in the page cache, and a later access maps it again).
"""

from __future__ import annotations

import mmap

import numpy as np

__all__ = ["INT32_MAX", "narrow_lengths", "narrow", "release"]

INT32_MAX = int(np.iinfo(np.int32).max)
#: Elements per chunk of a pass over document offsets (32 MiB of int64): its pages are handed back after it.
CHUNK_ELEMS = 1 << 22
#: Elements narrowed at a time inside a chunk (512 KiB of int64): the difference, its maximum and the narrowing copy
#: read a temporary that stays in the CPU's cache, so the offsets are read from memory once (a chunk's temporary
#: read three times from memory was 16% of `packfmt pack`'s CPU at 10^8 documents).
STEP_ELEMS = 1 << 16


def release(arr) -> None:
    """Drop the resident pages of ``arr``'s read-only file mapping (no-op for anything else: a
    copy-on-write mapping, ``mode="c"``, would lose its changes)."""
    if getattr(arr, "mode", None) != "r":
        return
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
        for c in range(a, min(n, a + CHUNK_ELEMS), STEP_ELEMS):
            e = min(n, c + STEP_ELEMS)
            d = np.diff(np.asarray(doc_offsets[c:e + 1]))
            if int(d.max()) > INT32_MAX:  # a document longer than 2^31 - 1 tokens: keep int64
                release(doc_offsets)
                wide = np.diff(np.asarray(doc_offsets))
                release(doc_offsets)
                return wide
            out[c:e] = d
        release(doc_offsets)  # per chunk: never more than one chunk of offsets resident
    return out


def narrow(lengths: np.ndarray) -> np.ndarray:
    """``lengths`` (a dataset's own, e.g. a collection's ``doc_lengths.bin``) as int32 when every one fits, else
    as they are; copied in chunks, the source's pages released after each (as ``narrow_lengths``), each chunk's
    maximum checked as it is copied (no pass over the whole source before: its pages would all be resident)."""
    n = lengths.shape[0]
    out = np.empty(n, dtype=np.int32)
    for a in range(0, n, CHUNK_ELEMS):
        for c in range(a, min(n, a + CHUNK_ELEMS), STEP_ELEMS):  # each step's maximum and copy from the cache
            chunk = np.asarray(lengths[c:c + STEP_ELEMS])
            if int(chunk.max()) > INT32_MAX:  # a length of 2^31 tokens or more: kept as it is
                release(lengths)
                return lengths
            out[c:c + STEP_ELEMS] = chunk
        release(lengths)
    return out
