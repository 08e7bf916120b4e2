"""``validate --deep`` of a pack index in bounded memory: one pass over ``segments.bin`` in runs of packs.

Per document it holds the lengths (int32 when every document fits, spec FORMAT §4.2 puts no
smaller bound on them) and the segment count (int32 below 2^31 - 1 segments); per pack the
offsets; per segment nothing beyond one chunk, whose pages of ``segments.bin`` are handed back
before the next (``packfmt._resident.release``). The rules are those of ``_IndexChecks``
(``CoverageRows``, ``_coverage_docs``, ``_stats_of``, ``_max_docs``): this module only feeds them.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .. import format as F
from .._resident import INT32_MAX, narrow_lengths, release
from .segment_rows import CoverageRows, image_rows, pack_chunks


@njit(cache=True, nogil=True)
def _count_segments(doc, per_doc):
    """``per_doc[d] += 1`` for each ``d`` in ``doc`` (ids already checked to be in range, V27)."""
    for i in range(doc.shape[0]):
        per_doc[doc[i]] += 1


def deep_pass(ix, bar) -> None:
    """V28, V30 (segments and images per pack), V31 (coverage), V32 (materialized tokens), V33 (counts
    and stats) of ``ix`` (an ``_IndexChecks`` whose structural checks passed), reading each segment once."""
    segs_map, po = ix.array(F.SEGMENTS), np.asarray(ix.array(F.PACK_OFFSETS))
    ix._max_docs(po)  # V30 (segments)
    doc_len = narrow_lengths(ix.ds.array(F.DOC_OFFSETS))
    n_segments = int(segs_map.shape[0])
    per_doc = np.zeros(doc_len.shape[0], dtype=np.int32 if n_segments < INT32_MAX else np.int64)
    cap, truncate = ix.pm.capacity, ix.pm.oversize == "truncate"
    rows = CoverageRows(ix.pm.oversize, cap)
    packed = truncated_rows = 0
    with_images = ix.ds.m.num_images > 0 and ix.ds.spans_ok
    off = ix.ds.array(F.DOC_OFFSETS) if with_images or ix.pm.materialized else None
    spans = np.asarray(ix.ds.array(F.IMAGE_TOKEN_SPANS)) if with_images else None
    cuts, first_cut, images_per_pack, reported = [], None, np.zeros(po.shape[0] - 1, dtype=np.int64), set()
    for p0, p1 in pack_chunks(po):
        s0 = int(po[p0])
        segs = np.asarray(segs_map[s0:int(po[p1])])
        local_po = po[p0:p1 + 1] - s0
        doc = segs[:, 0]
        seg_len = segs[:, 2] - segs[:, 1]
        _count_segments(doc, per_doc)
        length = doc_len[doc]  # every segment lies inside its document (V27, structural)
        rows.add(segs, length, s0)
        if truncate:
            truncated_rows += int(seg_len[length > cap].sum())
        if with_images:  # V28, V30 (images)
            cut, images_per_pack[p0:p1] = image_rows(segs, local_po, off, spans)
            if cut.size:
                first_cut = segs[cut[0]].copy() if first_cut is None else first_cut
                cuts.append(cut + s0)
        if ix.pm.materialized:  # V32
            ix._materialized(segs, local_po, seg_len, off, bar, first_pack=p0, first_token=packed, found=reported)
        packed += int(seg_len.sum())
        del segs, doc, seg_len, length
        release(segs_map)
    if off is not None:
        release(off)
    if with_images:
        ix._report_images(np.concatenate(cuts) if cuts else np.zeros(0, dtype=np.int64), first_cut, images_per_pack)
    ix._coverage_docs(doc_len, per_doc)  # V31
    rows.report(ix.out, ix.file(F.SEGMENTS), doc_len, per_doc)
    ix._stats_of(packed, int(po.shape[0] - 1), n_segments, doc_len, per_doc, truncated_rows)  # V33
