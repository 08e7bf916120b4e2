"""The structural invariants a reader indexes with, written once (spec/FORMAT.md §6: V13-V15, V19, V25, V27, V29).

The reader (``Store``, ``ImageStore``, ``PackIndex``: every public entry) runs these when it opens a
store or a pack index and raises the first finding as a ``FormatError``; ``validate`` runs the same
functions and reports every finding. After they pass, every offset the numba kernels and numpy
slicing use lies inside its array: no byte of a dataset can make the reader read outside it,
allocate more than a pack's ``capacity`` per pack, or loop past its arrays.

Each function takes plain arrays (memmaps included), scans them in bounded chunks with vectorised
numpy, and returns a list of ``Finding`` (empty when the invariant holds). ``offsets_chunk`` and
``image_span_rows`` are the same rules over an array read as a stream (``collection.physical``
checks each member's files while it copies them). Cost: one pass over each
array; at 10^7 segments a small fraction of a second (``benchmarks/bench_open.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Iterator

import numpy as np

from ._resident import release
from .errors import FormatError

__all__ = ["Finding", "raise_first", "offsets", "offsets_chunk", "image_spans", "image_span_rows", "segments", "packs",
           "pack_runs", "MAX_LISTED"]

#: Elements per chunk of a scan: bounded temporaries whatever the file size.
CHUNK = 1 << 20
#: At most this many individual elements are listed in one message.
MAX_LISTED = 5


@dataclass(frozen=True)
class Finding:
    """One broken invariant: ``file`` (relative to the dataset), ``field``, ``expected``, ``found``."""

    rule: str
    file: str
    field: str | None
    expected: Any
    found: Any

    def error(self) -> FormatError:
        where = f"{self.file}: {self.field}" if self.field else self.file
        return FormatError(f"{where}: expected {self.expected}, found {self.found} ({self.rule}; run `packfmt validate "
                           f"--deep` on the dataset for every finding)", file=self.file, field=self.field,
                           expected=self.expected, found=self.found)


def raise_first(findings: Iterable[Finding]) -> None:
    """Raise the first finding as a ``FormatError`` (what the reader does)."""
    for f in findings:
        raise f.error()


def listed(indices: np.ndarray) -> str:
    vals = [int(v) for v in indices[:MAX_LISTED]]
    more = f" and {len(indices) - MAX_LISTED} more" if len(indices) > MAX_LISTED else ""
    return ", ".join(map(str, vals)) + more


def _chunks(n: int, size: int = CHUNK) -> Iterator[tuple[int, int]]:
    for start in range(0, n, size):
        yield start, min(n, start + size)


class _First:
    """First position and total count of a condition over a chunked scan."""

    def __init__(self) -> None:
        self.first: int | None = None
        self.count = 0

    def add(self, mask: np.ndarray, base: int) -> None:
        n = int(np.count_nonzero(mask))
        if n:
            if self.first is None:
                self.first = base + int(np.flatnonzero(mask)[0])
            self.count += n


def offsets(arr: np.ndarray, *, rule: str, file: str, last: int, last_what: str, strict: bool, unit: str) -> list[Finding]:
    """An offsets array: ``arr[0] == 0``, ``arr[-1] == last``, increasing (strictly or not).

    Together these put every element in ``[0, last]``.
    """
    arr = np.asarray(arr)
    n = arr.shape[0]
    if n == 0:
        return [Finding(rule, file, "length", ">= 1 entry", "0 entries")]
    out = []
    if int(arr[0]) != 0:
        out.append(Finding(rule, file, "[0]", 0, int(arr[0])))
    if int(arr[-1]) != last:
        out.append(Finding(rule, file, f"[{n - 1}]", f"{last} ({last_what})", int(arr[-1])))
    return out + _steps(arr, 0, rule=rule, file=file, strict=strict, unit=unit)


def offsets_chunk(chunk: np.ndarray, *, prev: int, at: int, top: int, rule: str, file: str, strict: bool,
                  unit: str) -> list[Finding]:
    """``offsets`` of an array read as a stream: ``chunk`` holds elements ``at, at + 1, ...`` and ``prev`` is
    element ``at - 1``. Increasing from ``prev`` and at most ``top``; the caller checks the first element (0)
    and the last (the total), which it sees."""
    chunk = np.asarray(chunk)
    out = _steps(np.concatenate(([prev], chunk)), at - 1, rule=rule, file=file, strict=strict, unit=unit)
    if not out and chunk.shape[0] and int(chunk[-1]) > top:
        out.append(Finding(rule, file, f"[{at + chunk.shape[0] - 1}]", f"<= {top}", int(chunk[-1])))
    return out


def _steps(arr: np.ndarray, base: int, *, rule: str, file: str, strict: bool, unit: str) -> list[Finding]:
    """Every step of ``arr`` (element ``base`` onwards) increasing, strictly or not, scanned in chunks."""
    bad = _First()
    for a, b in _chunks(arr.shape[0] - 1):
        nxt, cur = arr[a + 1:b + 1], arr[a:b]
        bad.add(nxt <= cur if strict else nxt < cur, a)
    if bad.first is None:
        return []
    i = bad.first
    kind = "strictly increasing" if strict else "non-decreasing"
    return [Finding(rule, file, f"[{base + i}:{base + i + 2}]", f"{kind} ({unit})",
                    f"{int(arr[i])} then {int(arr[i + 1])} ({bad.count} bad step{'s' if bad.count > 1 else ''} in all)")]


def image_spans(spans: np.ndarray, doc_image_offsets: np.ndarray, doc_offsets: np.ndarray, *, file: str) -> list[Finding]:
    """V19: each image's token run ``[begin, end)`` lies inside its document, non-empty, runs of one
    document sorted and disjoint. Needs V13 and V15 to hold."""
    dio = np.asarray(doc_image_offsets)
    doc = np.repeat(np.arange(dio.shape[0] - 1, dtype=np.int64), np.diff(dio))
    return image_span_rows(spans, doc, np.asarray(doc_offsets), file=file)


def image_span_rows(spans: np.ndarray, doc: np.ndarray, doc_offsets: np.ndarray, *, file: str, at: int = 0,
                    prev: tuple[int, int] = (-1, 0), doc_base: int = 0) -> list[Finding]:
    """V19 of images ``at, at + 1, ...`` (``spans`` rows) of documents ``doc`` (``doc_offsets`` indexed by
    them; document ``doc_base + doc`` of the store); ``prev`` is ``(doc, end)`` of image ``at - 1`` (none:
    ``(-1, 0)``), for a stream of rows."""
    spans = np.asarray(spans)
    begin, end = spans[:, 0], spans[:, 1]
    lo, hi = doc_offsets[doc], doc_offsets[doc + 1]
    out = []
    outside = np.flatnonzero((begin < lo) | (end > hi) | (begin >= end))
    if outside.size:
        k = int(outside[0])
        out.append(Finding("V19", file, f"[{at + k}]", f"doc_start <= begin < end <= doc_end of document {doc_base + int(doc[k])} = "
                           f"[{int(lo[k])}, {int(hi[k])})", f"[{int(begin[k])}, {int(end[k])}) ({outside.size} image(s) "
                           f"outside their document or empty: {listed(outside + at)})"))
    prev_end = np.concatenate(([prev[1]], end[:-1]))
    same_doc = doc == np.concatenate(([prev[0]], doc[:-1]))
    overlap = np.flatnonzero(same_doc & (begin < prev_end))
    if overlap.size:
        k = int(overlap[0])
        out.append(Finding("V19", file, f"[{at + k - 1}:{at + k + 1}]", "spans of one document sorted and not overlapping",
                           f"a span ending at {int(prev_end[k])} then [{int(begin[k])}, {int(end[k])}) "
                           f"({overlap.size} in all)"))
    return out


def segments(segs: np.ndarray, doc_offsets: np.ndarray, pack_offsets: np.ndarray, *,
             file: str, doc_lengths: bool = False, doc_start: np.ndarray | None = None
             ) -> tuple[list[Finding], np.ndarray | None]:
    """V27: every segment ``(doc, begin, end)`` has ``0 <= doc < n`` and ``0 <= begin < end <= len(doc)``.

    Needs V13 (``doc_offsets``) and V25 (``pack_offsets``) to hold. ``doc_lengths``: the second argument holds the
    ``n`` documents' lengths instead of their ``n + 1`` offsets (a collection holds its lengths: no offsets array
    of 8 bytes a document is made to check an index). ``doc_start`` (``M + 1`` first document ids of ``M``
    members): the second argument holds one BOUND per member instead, and a document is taken to be at most as
    long as its member (a streamed collection before its members are fetched: nothing of 8 bytes a document).
    Returns the findings and, when there are none, the int64 token count of every pack (for ``packs``).

    Scanned in runs of packs (``pack_runs``), the pages of a mapped ``segs`` handed back after each run and those
    of a mapped second argument after the scan (``_resident.release``): opening an index leaves neither resident
    (24 bytes a segment and 8 a document, in every process that opens it).
    """
    mapped_segs, mapped_bounds = segs, doc_offsets
    doc_offsets, segs, pack_offsets = np.asarray(doc_offsets), np.asarray(segs), np.asarray(pack_offsets)
    mode = 2 if doc_start is not None else int(doc_lengths)
    starts = np.asarray(doc_start, dtype=np.int64) if doc_start is not None else np.zeros(1, dtype=np.int64)
    members = starts.shape[0] - 1  # with doc_start: bounds[m] read for a document of member m, 0 <= m < members
    if segs.ndim != 2 or segs.shape[1] != 3 or (mode == 2 and not (
            0 <= members <= doc_offsets.shape[0] and (members > 0 or int(starts[0]) <= 0))):
        raise ValueError(f"{file}: checks.segments needs (S, 3) segments and, with doc_start, one bound per member: "
                         f"found segments of shape {segs.shape}, {starts.shape[0]} doc_start entries and "
                         f"{doc_offsets.shape[0]} bounds")  # the scan indexes both unchecked
    n_docs = int(starts[-1]) if mode == 2 else doc_offsets.shape[0] - (0 if doc_lengths else 1)
    lengths = np.empty(pack_offsets.shape[0] - 1, dtype=np.int64)
    first_doc, n_doc, first_range, n_range = -1, 0, -1, 0
    small = mode != 2 and segs.shape[0] <= SMALL_SCAN_ROWS
    scan = _scan_small if small else _segment_kernel()
    # runs of packs: one run's pages of segments.bin resident at a time (numpy's temporaries: a short run's)
    for p0, p1 in pack_runs(pack_offsets, SMALL_RUN_ROWS if small else PACK_RUN_ROWS):
        s0 = int(pack_offsets[p0])
        fd, nd, fr, nr = scan(segs[s0:int(pack_offsets[p1])], doc_offsets, pack_offsets[p0:p1 + 1] - s0,
                              lengths[p0:p1], mode, starts)
        if fd < -1:  # a pack's range outside the segments: V25 was not checked first (a caller's bug, not a file's)
            p = p0 - fd - 2
            raise ValueError(f"{file}: pack {p}: expected segments in [0, {segs.shape[0]}) (V25, checked before V27), "
                             f"found [{int(pack_offsets[p])}, {int(pack_offsets[p + 1])})")
        if first_doc < 0 <= fd:
            first_doc = s0 + fd
        if first_range < 0 <= fr:
            first_range = s0 + fr
        n_doc, n_range = n_doc + nd, n_range + nr
        release(mapped_segs)
    release(mapped_bounds)  # read at random: handed back once, after the scan
    out = []
    if first_doc >= 0:
        k = first_doc
        out.append(Finding("V27", file, f"[{k}].doc", f"a document id in [0, {n_docs})",
                           f"{int(segs[k, 0])} ({n_doc} bad in all)"))
    if first_range >= 0:
        k = first_range
        d, beg, end = (int(v) for v in segs[k])
        if mode == 2:
            m = int(np.searchsorted(starts, d, side="right")) - 1
            what = f"at most the {int(doc_offsets[m])} tokens of its member {m}"
        else:
            what = str(int(doc_offsets[d]) if doc_lengths else int(doc_offsets[d + 1] - doc_offsets[d]))
        out.append(Finding("V27", file, f"[{k}]", f"0 <= begin < end <= length of document {d} ({what})",
                           f"[{beg}, {end}) (segment beyond its document, or empty; {n_range} bad segment(s) in all)"))
    return out, (None if out else lengths)


#: Segments per run of packs in ``segments`` (a run holds at least one pack): 1M rows, 24 MiB of segments.bin.
PACK_RUN_ROWS = 1 << 20


def pack_runs(pack_offsets: np.ndarray, rows: int = PACK_RUN_ROWS) -> Iterator[tuple[int, int]]:
    """``(p0, p1)``: runs of whole packs of about ``rows`` segments (one pack alone when it has more)."""
    n = pack_offsets.shape[0] - 1
    p = 0
    while p < n:
        q = int(np.searchsorted(pack_offsets, int(pack_offsets[p]) + rows, side="right")) - 1
        q = min(max(q, p + 1), n)
        yield p, q
        p = q


#: Indexes of at most this many segments are scanned by ``_scan_small`` (numpy), not the numba kernel: importing
#: numba and loading the compiled kernel is most of a small dataset's open (~0.5 s of ``packfmt validate``), and
#: numba's first load in a process (~0.25 s, numba imported) most of opening a pack-ordered layout of 10^4 shards
#: (``benchmarks/bench_layout_open.py``). numpy takes ~25 ns a segment (0.1 s at 2^22), the kernel ~3 once loaded.
SMALL_SCAN_ROWS = 1 << 22
#: Segments per run of packs that ``_scan_small`` sees at once: its temporaries (~80 bytes a segment) stay ~5 MiB.
SMALL_RUN_ROWS = 1 << 16


def _scan_small(segs, bounds, pack_offsets, lengths, mode, doc_start):
    """The scan of ``_segment_kernel`` (modes 0 and 1) as numpy expressions over at most ``SMALL_SCAN_ROWS`` segments:
    the same four numbers and ``lengths`` (``tests/test_reader_checks.py`` compares the two on random input). Rows
    are visited pack after pack, as the kernel does: a pack whose range is decreasing visits none, ranges that
    overlap visit a row once for each pack."""
    starts, ends = pack_offsets[:-1].astype(np.int64), pack_offsets[1:].astype(np.int64)
    outside = np.flatnonzero((starts < 0) | (ends > segs.shape[0]))
    if outside.size:
        return -2 - int(outside[0]), 0, -1, 0
    counts = np.maximum(ends - starts, 0)
    first = np.cumsum(counts) - counts  # where each pack's rows begin among the visits
    rows = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(first - starts, counts)
    d, b, e = (segs[rows, k].astype(np.int64) for k in range(3))
    bad_doc = (d < 0) | (d >= bounds.shape[0] - (1 if mode == 0 else 0))
    good = np.flatnonzero(~bad_doc)
    length = np.zeros_like(d)
    length[good] = bounds[d[good] + 1] - bounds[d[good]] if mode == 0 else bounds[d[good]]
    bad_range = ~bad_doc & ((b < 0) | (b >= e) | (e > length))
    total = np.concatenate(([0], np.cumsum(np.where(bad_doc | bad_range, 0, e - b))))
    lengths[:] = total[first + counts] - total[first]  # int64 sums, wrapping as the kernel's do

    def first_of(bad) -> int:
        return int(rows[int(np.argmax(bad))]) if bad.any() else -1

    return first_of(bad_doc), int(bad_doc.sum()), first_of(bad_range), int(bad_range.sum())


_KERNEL = None


def _segment_kernel():
    """The one-pass numba scan of ``segments`` (numba is imported on first use, not by ``import packfmt``).

    One loop, no temporaries the size of the segments: ten times faster than the same test as
    chunked numpy expressions (``benchmarks/bench_open.py``).
    """
    global _KERNEL
    if _KERNEL is None:
        from numba import njit

        @njit(cache=True, nogil=True)
        def scan(segs, bounds, pack_offsets, lengths, mode, doc_start):
            """(first bad doc id, count, first bad range, count), -1 for none (``-2 - p``, first: pack ``p``'s range
            is outside ``segs``, V25 unchecked); fills ``lengths``. ``mode`` 0:
            ``bounds`` are the documents' offsets; 1: their lengths; 2: one bound per member, the members
            starting at documents ``doc_start`` (found by bisection, as ``torch._kernels.doc_span`` does)."""
            if mode == 2:
                n_docs = doc_start[doc_start.shape[0] - 1]
            else:
                n_docs = bounds.shape[0] - (1 if mode == 0 else 0)
            first_doc, n_doc, first_range, n_range = -1, 0, -1, 0
            n_segs = segs.shape[0]
            for p in range(pack_offsets.shape[0] - 1):
                if pack_offsets[p] < 0 or pack_offsets[p + 1] > n_segs:  # one compare a pack: a decreasing pair
                    return -2 - p, 0, -1, 0  # is an empty range (V25 reports it), never an index outside
                total = 0
                for s in range(pack_offsets[p], pack_offsets[p + 1]):
                    d, b, e = segs[s, 0], segs[s, 1], segs[s, 2]
                    if d < 0 or d >= n_docs:
                        if first_doc < 0:
                            first_doc = s
                        n_doc += 1
                        continue
                    if mode == 0:
                        length = bounds[d + 1] - bounds[d]
                    elif mode == 1:
                        length = bounds[d]
                    else:
                        lo, hi = 0, doc_start.shape[0] - 1
                        while hi - lo > 1:
                            mid = (lo + hi) >> 1
                            if doc_start[mid] <= d:
                                lo = mid
                            else:
                                hi = mid
                        length = bounds[lo]
                    if b < 0 or b >= e or e > length:
                        if first_range < 0:
                            first_range = s
                        n_range += 1
                    else:
                        total += e - b
                lengths[p] = total
            return first_doc, n_doc, first_range, n_range

        _KERNEL = scan
    return _KERNEL


def packs(lengths: np.ndarray, capacity: int, packed_tokens: int, *, file: str,
          pack_token_offsets: np.ndarray | None = None, pto_file: str = "") -> list[Finding]:
    """V29: every pack holds at most ``capacity`` tokens, and all of them ``counts.packed_tokens``;
    and when materialized, each pack's run in ``pack_token_offsets`` is as long as
    the pack. ``lengths`` from ``segments``.
    """
    out = []
    total = int(lengths.sum())
    if total != packed_tokens:
        out.append(Finding("V29", file, "segment lengths (sum)", f"{packed_tokens} (counts.packed_tokens, index.json)",
                           total))
    over = np.flatnonzero(lengths > capacity)
    if over.size:
        p = int(over[0])
        out.append(Finding("V29", file, f"pack {p}", f"<= capacity {capacity} tokens (index.json)",
                           f"{int(lengths[p])} tokens ({over.size} pack(s) over capacity: {listed(over)})"))
    if pack_token_offsets is not None:
        runs = np.diff(np.asarray(pack_token_offsets))
        wrong = np.flatnonzero(runs != lengths)
        if wrong.size:
            p = int(wrong[0])
            out.append(Finding("V29", pto_file, f"[{p}:{p + 2}]", f"a run of {int(lengths[p])} tokens (the length of "
                               f"pack {p} by its segments)", f"{int(runs[p])} ({wrong.size} pack(s): {listed(wrong)})"))
    return out
