"""Where ``PackedDataset`` reads tokens and images: a store's own memmaps, or a collection's members
mapped end to end (``packfmt.collection.vmap``), behind one document table (``_kernels.doc_span``)."""

from __future__ import annotations

import numpy as np

from ..reader import Store

def _segment_sums(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Sum of ``values[offsets[p]:offsets[p+1]]`` for every p (empty ranges give 0)."""
    csum = np.zeros(values.shape[0] + 1, dtype=np.int64)
    np.cumsum(values, out=csum[1:])
    return csum[offsets[1:]] - csum[offsets[:-1]]


def _token_source(source):
    """Tokens, mask and document table the kernels read (``_kernels.doc_span``): a store's own memmaps,
    or a collection's members mapped end to end (``packfmt.collection.vmap``)."""
    if isinstance(source, Store):
        from ..collection.vmap import Concatenated

        one = np.zeros(1, dtype=np.int64)
        docs = (np.asarray(source.doc_offsets), np.array([0, source.num_documents], dtype=np.int64), one, one,
                np.array([source.loss_mask is not None], dtype=np.uint8))
        return Concatenated(np.asarray(source.tokens), None if source.loss_mask is None else np.asarray(source.loss_mask),
                            docs)
    if getattr(source, "_stream", None) is not None:  # a remote collection read member by member (storage.stream)
        return source._stream.source()
    from ..collection.vmap import concatenate_members

    return concatenate_members(source)


class _ImageIndex:
    """Images of a store or collection by collection-wide id: ``doc_image_offsets``, spans relative to
    their document, and ``decode``. Built once per process (when a pack first has images)."""

    def __init__(self, source) -> None:
        self.source = source
        members = [source] if isinstance(source, Store) else [source.member(m) for m in range(len(source.members))]
        self.image_start = np.zeros(len(members) + 1, dtype=np.int64)
        dios, rels = [np.zeros(1, dtype=np.int64)], []
        for m, store in enumerate(members):
            n = store.num_images
            self.image_start[m + 1] = self.image_start[m] + n
            if n:
                dio = np.asarray(store.images.doc_image_offsets, dtype=np.int64)
                doc_of_image = np.repeat(np.arange(store.num_documents, dtype=np.int64), np.diff(dio))
                rels.append(np.asarray(store.images.token_spans, dtype=np.int64)
                            - np.asarray(store.doc_offsets)[doc_of_image][:, None])
                dios.append(dio[1:] + self.image_start[m])
            else:
                dios.append(np.full(store.num_documents, self.image_start[m], dtype=np.int64))
        self.doc_image_offsets = np.concatenate(dios)
        self.relative_spans = np.concatenate(rels) if rels else np.zeros((0, 2), dtype=np.int64)
        self._members = None if isinstance(source, Store) else source

    def decode(self, j: int) -> np.ndarray:
        if self._members is None:
            return self.source.images.decode(j)
        m = int(np.searchsorted(self.image_start, j, side="right")) - 1
        return self._members.member(m).images.decode(j - int(self.image_start[m]))
