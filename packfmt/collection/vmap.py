"""The members' arrays of a collection as one read-only array each, mapped end to end (no copy).

A collection's reader needs its members' ``tokens.bin`` (and ``loss_mask.bin``, ``doc_offsets.bin``)
as if they were one file, without copying them and without holding a file descriptor per member.
``map_end_to_end`` reserves one span of address space and maps each file into it at a page-aligned
base (``mmap`` with ``MAP_FIXED`` over a ``PROT_NONE`` reservation), then closes the file: the
numba kernels index one array, thousands of members hold no descriptor, and the page cache is
shared by every DataLoader worker as with a single store. The gap after each member (to its next
page boundary) is never indexed: every offset is checked against its member first.

POSIX only (Linux, macOS); each member file is one kernel mapping (``vm.max_map_count``, 65,530 by
default on Linux): past ``lazy_members.MAP_BUDGET`` mappings a collection's members are mapped as batches need
them (``Reserved`` spans, ``lazy_members.LocalMembers``), as a streamed collection's are.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import weakref
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["map_end_to_end", "Concatenated", "concatenate_members", "Reserved", "batch_segments", "PAGE"]

PAGE = mmap.PAGESIZE
_MAP_FIXED = 0x10  # same value on Linux and macOS; not exposed by Python's mmap module
_PROT_NONE = 0
_MAP_FAILED = ctypes.c_void_p(-1).value
_libc = None


def _c():
    global _libc
    if _libc is None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        libc.munmap.restype = ctypes.c_int
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        _libc = libc
    return _libc


class _Region:
    """Owns one reserved span of address space; unmapped when the last array using it is gone."""

    def __init__(self, nbytes: int) -> None:
        libc = _c()
        self.nbytes = nbytes
        addr = libc.mmap(None, nbytes, _PROT_NONE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
        if addr in (None, _MAP_FAILED):
            err = ctypes.get_errno()
            raise OSError(err, f"cannot reserve {nbytes:,} bytes of address space: {os.strerror(err)}")
        self.addr = addr
        self._finalizer = weakref.finalize(self, libc.munmap, addr, nbytes)

    def map_file(self, path: Path, offset: int, nbytes: int) -> None:
        libc = _c()
        fd = os.open(path, os.O_RDONLY)
        try:
            got = libc.mmap(self.addr + offset, nbytes, mmap.PROT_READ, mmap.MAP_SHARED | _MAP_FIXED, fd, 0)
        finally:
            os.close(fd)
        if got != self.addr + offset:
            err = ctypes.get_errno()
            raise OSError(err, f"{path}: cannot map {nbytes:,} bytes: {os.strerror(err)}")

    def array(self, dtype: np.dtype) -> np.ndarray:
        buf = (ctypes.c_char * self.nbytes).from_address(self.addr)
        buf._region = self  # the array keeps the buffer, the buffer keeps the region (and its mapping) alive
        arr = np.frombuffer(buf, dtype=np.uint8).view(dtype)
        arr.flags.writeable = False
        return arr


def map_end_to_end(files: list[tuple[Path | None, int]], dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """Map ``(path, elements)`` files end to end; return the array and each file's first element (int64).

    Each file starts at a multiple of ``PAGE`` elements (so that arrays of different widths mapped
    with the same element counts share their bases). A file of 0 elements (or path None) is not mapped.
    """
    dtype = np.dtype(dtype)
    sizes = np.fromiter((n for _, n in files), dtype=np.int64, count=len(files))
    spans = -(-sizes // PAGE) * PAGE
    bases = np.zeros(len(files), dtype=np.int64)
    np.cumsum(spans[:-1], out=bases[1:])
    total = int(spans.sum())
    region = _Region(max(total, PAGE) * dtype.itemsize)
    for (path, n), base in zip(files, bases):
        if n and path is not None:
            region.map_file(path, int(base) * dtype.itemsize, n * dtype.itemsize)
    return region.array(dtype), bases


@dataclass(frozen=True)
class Concatenated:
    """What the torch kernels read: ``tokens``, ``loss_mask`` (or None) and ``docs`` (see ``_kernels.doc_span``).

    ``docs[4]`` is uint8 per member: 1 when the member's own mask is mapped into ``loss_mask``, 0 when
    its tokens are all trained (no mask, or none mapped: a member without one in a mixed collection).
    ``members``: None when every member is mapped; else what maps the members a batch touches while it is read
    (``hold(packs, pack_offsets, segments, label)``, a context: ``stream.StreamedMembers``,
    ``lazy_members.LocalMembers``)."""

    tokens: np.ndarray
    loss_mask: np.ndarray | None
    docs: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]
    members: object = None


class Reserved:
    """Every member's span of ``tokens``, ``loss_mask`` and ``doc_offsets`` reserved end to end as
    ``concatenate_members`` lays them out, nothing mapped: ``map_member`` / ``unmap_member`` map one member's
    files into its spans and put ``PROT_NONE`` back (its pages released)."""

    def __init__(self, coll) -> None:
        from .. import format as F

        self.coll = coll
        m = coll.members  # its columns: no Member object per member (10^5 members)
        self.member_mask = (coll.has_loss_mask & ~np.asarray(coll.all_trained, dtype=bool)).astype(np.uint8)
        spans = [(None, n) for n in m.tokens.tolist()]
        self.tokens, self.token_base = map_end_to_end(spans, coll.np_token_dtype)
        self.loss_mask = map_end_to_end(spans, F.MASK_DTYPE)[0] if coll.has_loss_mask else None
        self.doc_offsets, self.doc_base = map_end_to_end([(None, n + 1) for n in m.documents.tolist()], F.OFFSET_DTYPE)

    def source(self, members) -> Concatenated:
        return Concatenated(self.tokens, self.loss_mask, (self.doc_offsets, np.asarray(self.coll.doc_start, np.int64),
                                                          self.doc_base, self.token_base, self.member_mask), members)

    def map_member(self, m: int, local: Path) -> None:
        from .. import format as F

        tokens, documents = int(self.coll.members.tokens[m]), int(self.coll.members.documents[m])
        _map_into(self.tokens, int(self.token_base[m]), local / F.TOKENS, tokens)
        if self.loss_mask is not None and self.member_mask[m]:
            _map_into(self.loss_mask, int(self.token_base[m]), local / F.LOSS_MASK, tokens)
        _map_into(self.doc_offsets, int(self.doc_base[m]), local / F.DOC_OFFSETS, documents + 1)

    def unmap_member(self, m: int) -> None:
        tokens, documents = int(self.coll.members.tokens[m]), int(self.coll.members.documents[m])
        _unmap(self.tokens, int(self.token_base[m]), tokens)
        if self.loss_mask is not None and self.member_mask[m]:
            _unmap(self.loss_mask, int(self.token_base[m]), tokens)
        _unmap(self.doc_offsets, int(self.doc_base[m]), documents + 1)


def batch_segments(packs: np.ndarray, pack_offsets: np.ndarray, segments: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(rows, seg)``: the rows of ``segments`` that packs ``packs`` (valid ids) hold, and those segments (int64
    ``(k, 3)``): what a batch reads, so the members it touches."""
    lo, hi = pack_offsets[packs], pack_offsets[packs + 1]
    n = hi - lo
    rows = np.repeat(lo - np.concatenate([[0], np.cumsum(n)[:-1]]), n) + np.arange(int(n.sum()))
    return rows, np.asarray(segments[rows], dtype=np.int64).reshape(-1, 3)


def _map_into(arr: np.ndarray, base: int, path: Path, n: int) -> None:
    if n:
        _region(arr).map_file(path, base * arr.itemsize, n * arr.itemsize)


def _unmap(arr: np.ndarray, base: int, n: int) -> None:
    """Put ``PROT_NONE`` back over a member's span (its file's pages are released)."""
    if not n:
        return
    region = _region(arr)
    addr = region.addr + base * arr.itemsize
    got = _c().mmap(addr, n * arr.itemsize, _PROT_NONE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_FIXED, -1, 0)
    if got in (None, _MAP_FAILED) or got != addr:
        raise OSError(ctypes.get_errno(), "cannot unmap a member")


def _region(arr: np.ndarray) -> _Region:
    """The ``_Region`` behind an array ``map_end_to_end`` returned."""
    obj = arr
    while obj is not None and not hasattr(obj, "_region"):
        obj = getattr(obj, "base", None)
    return obj._region


def concatenate_members(coll) -> Concatenated:
    """Every member of ``coll`` (a ``Dataset``) mapped end to end, each member checked on the way.

    One member with its own mask (or none), a store above all, is its own memmaps: nothing is mapped again."""
    from .. import format as F

    if coll.num_members == 1 and not coll.all_trained[0]:
        store = coll.member(0)
        one = np.zeros(1, dtype=np.int64)
        mask = store.loss_mask if coll.has_loss_mask else None
        return Concatenated(np.asarray(store.tokens), None if mask is None else np.asarray(mask),
                            (np.asarray(store.doc_offsets), np.asarray(coll.doc_start, dtype=np.int64), one, one,
                             np.array([mask is not None], dtype=np.uint8)))
    paths, counts = [], []
    for m in range(coll.num_members):
        store = coll.member(m)  # opens and checks it (C2, C3, V13)
        paths.append(store.path)
        counts.append((int(coll.token_start[m + 1] - coll.token_start[m]), int(coll.doc_start[m + 1] - coll.doc_start[m]) + 1))
    tokens, token_base = map_end_to_end([(p / F.TOKENS, t) for p, (t, _) in zip(paths, counts)], coll.np_token_dtype)
    mask = None
    member_mask = np.array([coll.has_loss_mask and not ones for ones in coll.all_trained], dtype=np.uint8)
    if coll.has_loss_mask:  # a member without a mask is not mapped: the kernels read its tokens as mask 1
        mask, mask_base = map_end_to_end([(p / F.LOSS_MASK if has else None, t) for p, (t, _), has
                                          in zip(paths, counts, member_mask)], F.MASK_DTYPE)
        assert (mask_base == token_base).all()  # same element counts, same page-multiple bases
    doc_offsets, doc_base = map_end_to_end([(p / F.DOC_OFFSETS, d) for p, (_, d) in zip(paths, counts)],
                                           F.OFFSET_DTYPE)
    return Concatenated(tokens, mask, (doc_offsets, np.asarray(coll.doc_start, dtype=np.int64), doc_base, token_base,
                                       member_mask))
