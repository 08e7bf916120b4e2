"""Sequence packing: pure functions from document lengths (and image counts) to packs. No I/O.

* ``segment_documents``: split / truncate / drop documents longer than the capacity, never
  cutting through an image's tokens.
* ``pack_items``: assign segments to packs with one of ``ALGORITHMS``.
* ``pack_stats``: fill efficiency, distance to the lower bound, items and images per pack.

The normative description of each algorithm is spec/packing.md.
"""

from .algorithms import ALGORITHMS, PackResult, pack_items, pack_stats
from .segment import OVERSIZE_POLICIES, Segmentation, segment_documents

__all__ = ["ALGORITHMS", "OVERSIZE_POLICIES", "PackResult", "Segmentation", "pack_items", "pack_stats",
           "segment_documents"]
