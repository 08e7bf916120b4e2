"""Where ``PackedDataset`` reads tokens and images: a dataset's members (a store is its own one member)
mapped end to end (``packfmt.collection.vmap``), behind one document table (``_kernels.doc_span``)."""

from __future__ import annotations

import numpy as np


def _segment_sums(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Sum of ``values[offsets[p]:offsets[p+1]]`` for every p (empty ranges give 0)."""
    csum = np.zeros(values.shape[0] + 1, dtype=np.int64)
    np.cumsum(values, out=csum[1:])
    return csum[offsets[1:]] - csum[offsets[:-1]]


def _token_source(source):
    """Tokens, mask and document table the kernels read (``_kernels.doc_span``): every member of the
    dataset mapped end to end (``packfmt.collection.vmap``; a store is its own one member), or the members of a
    remote collection mapped as batches need them (``packfmt.collection.stream``)."""
    if getattr(source, "_stream", None) is not None:
        return source._stream.source()
    from ..collection.vmap import concatenate_members

    return concatenate_members(source)


class _ImageIndex:
    """Images of a dataset by dataset-wide id: ``doc_image_offsets``, spans relative to their document,
    and ``decode``. Built once per process (when a pack first has images)."""

    def __init__(self, source) -> None:
        from ..collection.arrays import relative_image_spans

        self.source = source
        spans, dio = relative_image_spans(source)
        self.doc_image_offsets = np.zeros(source.num_documents + 1, dtype=np.int64) if dio is None else dio
        self.relative_spans = np.zeros((0, 2), dtype=np.int64) if spans is None else spans

    def decode(self, j: int) -> np.ndarray:
        m = int(np.searchsorted(self.source.image_start, j, side="right")) - 1
        return self.source.member(m).images.decode(j - int(self.source.image_start[m]))
