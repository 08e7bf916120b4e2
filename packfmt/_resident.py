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
#: Elements per chunk of a pass over document offsets (32 MiB of int64).
CHUNK_ELEMS = 1 << 22


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


def narrow(lengths: np.ndarray) -> np.ndarray:
    """``lengths`` (a dataset's own, e.g. a collection's ``doc_lengths.bin``) as int32 when every one fits, else
    as they are; copied in chunks, the source's pages released after each (as ``narrow_lengths``), each chunk's
    maximum checked as it is copied (no pass over the whole source before: its pages would all be resident)."""
    out = np.empty(lengths.shape[0], dtype=np.int32)
    for a in range(0, lengths.shape[0], CHUNK_ELEMS):
        chunk = np.asarray(lengths[a:a + CHUNK_ELEMS])
        if chunk.size and int(chunk.max()) > INT32_MAX:  # a length of 2^31 tokens or more: kept as it is
            release(lengths)
            return lengths
        out[a:a + CHUNK_ELEMS] = chunk
        release(lengths)
    return out
