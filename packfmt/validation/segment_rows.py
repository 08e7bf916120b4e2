"""Segment rows in chunks: the coverage rule over rows (``CoverageRows``) and runs of whole packs.

Shared by the whole-array checks of ``validation.index`` and the bounded pass of
``validation.index_pass``, so each rule is written once whatever the size of the rows fed to it.
"""

from __future__ import annotations

import numpy as np

from .. import checks
from .report import CHUNK_ELEMS, _distinct, _listed


class CoverageRows:
    """The per-segment half of the coverage (spec FORMAT §4.3), fed rows in chunks of any size.

    ``split``: a segment ``[0, length)`` is a whole document (right when its document has one
    segment); the others are kept (few: the pieces of split documents) and, with the segment count
    of each document, checked to tile ``[0, length)`` exactly once in ``report``. ``truncate`` /
    ``drop``: each row must be ``[0, length)`` (or a prefix of at most the capacity, truncated).
    """

    def __init__(self, policy: str, cap: int) -> None:
        self.policy, self.cap = policy, cap
        self.pieces: list[np.ndarray] = []  # split: rows other than [0, length)
        self.bad_docs: list[np.ndarray] = []  # truncate / drop: documents of the rows that differ
        self.bad_rows = 0

    def add(self, segs: np.ndarray, length: np.ndarray, first_row: int) -> None:
        doc, begin, end = segs[:, 0], segs[:, 1], segs[:, 2]
        if self.policy == "split":
            whole = (begin == 0) & (end == length)
            if not whole.all():
                self.pieces.append(np.asarray(segs[~whole]))
            return
        if self.policy == "truncate":
            ok = (begin == 0) & np.where(length <= self.cap, end == length, end <= self.cap)
        else:
            ok = (begin == 0) & (end == length)
        if not ok.all():
            self.bad_docs.append(np.asarray(doc[~ok]))
            self.bad_rows += int(np.count_nonzero(~ok))

    def report(self, out, label: str, doc_len: np.ndarray, per_doc: np.ndarray, where: str = "") -> None:
        n_docs, policy = doc_len.shape[0], self.policy
        if policy != "split":
            dup = np.flatnonzero(per_doc > 1)
            if dup.size:
                out.add(label, "coverage", f"each document at most once (oversize={policy!r}){where}",
                        f"{dup.size} document(s) appear more than once: {_listed(dup)}")
            if self.bad_rows:
                rule = (f"[0, length) when length <= {self.cap}, else [0, k) with k <= {self.cap}"
                        if policy == "truncate" else "[0, length)")
                bad = _distinct(np.concatenate(self.bad_docs), n_docs)
                out.add(label, "coverage", f"each document as {rule} (oversize={policy!r}){where}",
                        f"{self.bad_rows} segment(s) differ, documents {_listed(bad)}")
            return
        s = np.concatenate(self.pieces) if self.pieces else np.zeros((0, 3), dtype=np.int64)
        bad = []
        if s.shape[0]:
            s = s[np.lexsort((s[:, 1], s[:, 0]))]
            sd, sb, se = s[:, 0], s[:, 1], s[:, 2]
            new_doc = np.ones(s.shape[0], dtype=bool)
            new_doc[1:] = sd[1:] != sd[:-1]
            prev_end = np.concatenate([[0], se[:-1]])
            last_of_doc = np.ones(s.shape[0], dtype=bool)
            last_of_doc[:-1] = new_doc[1:]
            bad.append(sd[(sb != np.where(new_doc, 0, prev_end)) | (last_of_doc & (se != doc_len[sd]))])
            # a document's pieces must be all its segments: a whole row [0, length) beside them overlaps
            docs, counts = sd[new_doc], np.diff(np.append(np.flatnonzero(new_doc), s.shape[0]))
            bad.append(docs[per_doc[docs] != counts])
        several = np.flatnonzero(per_doc > 1) if per_doc.size and per_doc.max() > 1 else np.zeros(0, dtype=np.int64)
        if several.size:  # several segments, none of them a piece: duplicates of the whole document
            has_pieces = np.zeros(n_docs, dtype=bool)
            has_pieces[s[:, 0]] = True
            bad.append(several[~has_pieces[several]])
        bad = _distinct(np.concatenate(bad), n_docs) if bad else np.zeros(0, dtype=np.int64)
        if bad.size:
            out.add(label, "coverage", f"the segments of each document tile [0, length) exactly once (oversize='split'){where}",
                    f"gaps, overlaps or duplicates in {bad.size} document(s): {_listed(bad)}")


#: Segments per run of packs (a run holds at least one pack): 1M rows, 24 MiB of segments.bin.
PACK_CHUNK_ROWS = CHUNK_ELEMS // 4


def pack_chunks(po: np.ndarray, rows: int | None = None):
    """``(p0, p1)``: runs of whole packs of about ``rows`` (default ``PACK_CHUNK_ROWS``) segments: ``checks.pack_runs``,
    which the index open's V27 scan walks too."""
    return checks.pack_runs(po, PACK_CHUNK_ROWS if rows is None else rows)


def segments_in_chunks(segs, off, po, file: str):
    """``checks.segments`` (V27) over runs of packs, the pages of ``segments.bin`` handed back after each.

    The same findings as one call over everything: on the first finding that one call is made,
    so its element numbers are the file's.
    """
    from .._resident import release

    lengths = np.empty(po.shape[0] - 1, dtype=np.int64)
    for p0, p1 in pack_chunks(po):
        s0 = int(po[p0])
        found, part = checks.segments(segs[s0:int(po[p1])], off, np.asarray(po[p0:p1 + 1]) - s0, file=file)
        if found:
            release(segs)
            return checks.segments(segs, off, po, file=file)
        lengths[p0:p1] = part
        release(segs)
    release(off)
    return [], lengths


def image_rows(segs: np.ndarray, po: np.ndarray, off, spans: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Segments (rows of ``segs``) that cut through an image, and the images of each pack (``po``
    local to ``segs``), from the images' global token spans (sorted and disjoint, V19)."""
    doc_start = np.asarray(off[segs[:, 0]])
    g_begin, g_end = doc_start + segs[:, 1], doc_start + segs[:, 2]
    # spans are sorted and disjoint, so ends are sorted too: count by binary search
    starts_before_begin = np.searchsorted(spans[:, 0], g_begin, side="left")
    ends_by_begin = np.searchsorted(spans[:, 1], g_begin, side="right")
    starts_before_end = np.searchsorted(spans[:, 0], g_end, side="left")
    ends_by_end = np.searchsorted(spans[:, 1], g_end, side="right")
    straddling = (starts_before_begin - ends_by_begin) + (starts_before_end - ends_by_end)
    n_starting = starts_before_end - starts_before_begin  # images that start inside the segment
    cum = np.concatenate([[0], np.cumsum(n_starting)])
    return np.flatnonzero(straddling > 0), cum[po[1:]] - cum[po[:-1]]
