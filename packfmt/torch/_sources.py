"""Where ``PackedDataset`` reads tokens and images: a dataset's members (a store is its own one member)
mapped end to end (``packfmt.collection.vmap``), behind one document table (``_kernels.doc_span``)."""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np


def _segment_sums(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Sum of ``values[offsets[p]:offsets[p+1]]`` for every p (empty ranges give 0)."""
    csum = np.zeros(values.shape[0] + 1, dtype=np.int64)
    np.cumsum(values, out=csum[1:])
    return csum[offsets[1:]] - csum[offsets[:-1]]


def _token_source(source):
    """Tokens, mask and document table the kernels read (``_kernels.doc_span``): every member of the
    dataset mapped end to end (``packfmt.collection.vmap``; a store is its own one member), or the members mapped
    as batches need them (``Concatenated.members``, a ``collection.resident.ResidentMembers``:
    ``source.resident_members()``): those of a remote collection (``packfmt.remote.members``), and those of a local
    one with more members than a process may map at once (``collection.lazy_members``)."""
    members = source.resident_members()
    if members is not None:
        return members.source()
    from ..collection.vmap import concatenate_members

    return concatenate_members(source)


class _ImageIndex:
    """Images of a dataset by dataset-wide id, one member at a time: a member's image table (``doc_image_offsets``,
    spans relative to their document: ``collection.arrays.member_image_table``) is read when a pack first needs
    it and kept (16 bytes per image, 8 per document); no member is opened before. Members mapped as batches need them
    (``members``, a ``collection.resident.ResidentMembers``: a streamed collection's, ``stream=True``) are read
    through ``members.images(m)``: the member a batch holds."""

    def __init__(self, source, members=None) -> None:
        self.source, self.members = source, members
        self.image_start = np.asarray(source.image_start, dtype=np.int64)
        self.doc_start = np.asarray(source.doc_start, dtype=np.int64)
        self.tables: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def _images(self, m: int):
        """A context giving member ``m``'s ``ImageStore``."""
        if self.members is not None:
            return self.members.images(m)
        return nullcontext(self.source.member(m).images)

    def table(self, m: int) -> tuple[np.ndarray, np.ndarray]:
        """``(doc_image_offsets, relative spans)`` of member ``m`` (its own ids and documents)."""
        t = self.tables.get(m)
        if t is None:
            from ..collection.arrays import member_image_table

            with self._images(m) as images:
                t = self.tables[m] = member_image_table(images.store)
        return t

    def in_segments(self, docs, begins, ends, starts=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Images whose runs lie inside segments ``(docs, begins, ends)`` (an image is never cut, V28): their
        dataset-wide ids, int64 ``(k, 2)`` spans shifted to start at ``starts`` of their segment (relative to the
        segment's begin when None), and the count in each segment."""
        docs = np.asarray(docs, dtype=np.int64)
        member = np.searchsorted(self.doc_start, docs, side="right") - 1
        counts = np.zeros(docs.shape[0], dtype=np.int64)
        ids, spans = [], []
        for s, (d, b, e, m) in enumerate(zip(docs.tolist(), np.asarray(begins).tolist(), np.asarray(ends).tolist(),
                                             member.tolist())):
            if self.image_start[m + 1] == self.image_start[m]:
                continue  # a member without images: nothing to open
            dio, rel_all = self.table(m)
            lo, hi = int(dio[d - self.doc_start[m]]), int(dio[d - self.doc_start[m] + 1])
            if hi == lo:
                continue
            rel = rel_all[lo:hi]
            keep = (rel[:, 0] >= b) & (rel[:, 1] <= e)
            counts[s] = int(keep.sum())
            ids.append(np.arange(lo, hi, dtype=np.int64)[keep] + self.image_start[m])
            spans.append(rel[keep] - b + (0 if starts is None else int(starts[s])))
        image_ids = np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64)
        image_spans = np.concatenate(spans) if spans else np.zeros((0, 2), dtype=np.int64)
        return image_ids, image_spans, counts

    def decode(self, j: int) -> np.ndarray:
        m = int(np.searchsorted(self.image_start, j, side="right")) - 1
        with self._images(m) as images:
            return images.decode(j - int(self.image_start[m]))
