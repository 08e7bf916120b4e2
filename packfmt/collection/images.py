"""A collection's images, collection-wide: what ``Store.images`` is for a store (spec/COLLECTION.md §6).

Image ``j`` of a collection is image ``j - image_start[m]`` of member ``m``, and its document ids, token spans,
blob offsets and bytes are those a physical merge of the members would hold (§7.1). ``CollectionImages`` has the
interface of ``reader.ImageStore``: each call opens only the member it needs (through the collection's LRU), the
per-image arrays are lazy ``MemberArray`` views, and the two offset tables (8 bytes a document, 8 an image) are
computed when first used.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np

from .. import format as F
from .arrays import MemberArray, doc_image_offsets

__all__ = ["CollectionImages"]


class CollectionImages:
    """The images of a collection (``Collection.images``), with ``ImageStore``'s attributes and methods.

    Attributes (read-only, collection-wide):
        store: the collection.
        meta: ``(images, 3)`` width, height, codec (a ``MemberArray``).
        token_spans: ``(images, 2)`` token offsets in the collection's tokens (a ``MemberArray``).
        blobs: every image's encoded bytes end to end (a ``MemberArray``; opens every member with images first).
        offsets: int64 ``(images + 1,)``: image ``j`` is ``blobs[offsets[j]:offsets[j + 1]]``.
        doc_image_offsets: int64 ``(documents + 1,)``: the images of document ``g`` are
            ``doc_image_offsets[g]:doc_image_offsets[g + 1]``.
    """

    def __init__(self, coll) -> None:
        self.store = coll

    def __len__(self) -> int:
        return self.store.num_images

    def __repr__(self) -> str:
        return f"CollectionImages({len(self)} images, {self.store.num_members} members)"

    def _locate(self, i: int) -> tuple[object, int]:
        """``(member ImageStore, local id)`` of image ``i``."""
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"image {i} out of range [0, {n})")
        i = int(i) % n
        start = self.store.image_start
        m = int(np.searchsorted(start, i, side="right") - 1)
        return self.store.member(m).images, i - int(start[m])

    def data(self, i: int) -> memoryview:
        """Encoded bytes of image ``i`` (zero-copy, a view of its member's blobs)."""
        images, j = self._locate(i)
        return images.data(j)

    def codec(self, i: int) -> str:
        images, j = self._locate(i)
        return images.codec(j)

    def size(self, i: int) -> tuple[int, int]:
        images, j = self._locate(i)
        return images.size(j)

    def decode(self, i: int, max_pixels: int = F.MAX_IMAGE_PIXELS) -> np.ndarray:
        """Decode image ``i`` to a uint8 HxWxC array (``ImageStore.decode`` of its member)."""
        images, j = self._locate(i)
        return images.decode(j, max_pixels=max_pixels)

    def of_document(self, g: int) -> range:
        """The collection-wide ids of document ``g``'s images."""
        coll = self.store
        m, d = coll.locate(g)
        first = int(coll.image_start[m])
        if coll.image_start[m + 1] == first:  # a member without images (it has no image files)
            return range(first, first)
        local = coll.member(m).images.of_document(d)
        return range(first + local.start, first + local.stop)

    @cached_property
    def meta(self) -> MemberArray:
        return MemberArray(self.store, lambda s: s.images.meta, self.store.image_start, F.IMAGE_META_DTYPE,
                           row=(F.IMAGE_META_COLUMNS,))

    @cached_property
    def token_spans(self) -> MemberArray:
        return MemberArray(self.store, lambda s: s.images.token_spans, self.store.image_start, F.OFFSET_DTYPE,
                           row=(2,), shift=self.store.token_start[:-1])

    @cached_property
    def _blob_start(self) -> np.ndarray:
        """int64 ``(members + 1,)``: the blob bytes before each member (its ``image_offsets.bin``'s last value)."""
        coll = self.store
        sizes = [int(coll.member(m).images.offsets[-1]) if coll.image_start[m + 1] > coll.image_start[m] else 0
                 for m in range(coll.num_members)]
        out = np.zeros(len(sizes) + 1, dtype=np.int64)
        np.cumsum(sizes, out=out[1:])
        return out

    @cached_property
    def blobs(self) -> MemberArray:
        return MemberArray(self.store, lambda s: s.images.blobs, self._blob_start, F.BLOB_DTYPE)

    @cached_property
    def offsets(self) -> np.ndarray:
        """int64 ``(images + 1,)``, computed once: each member's ``image_offsets`` shifted by the bytes before it."""
        starts = MemberArray(self.store, lambda s: s.images.offsets[:-1], self.store.image_start, F.OFFSET_DTYPE,
                             shift=self._blob_start[:-1])
        out = np.empty(len(self) + 1, dtype=np.int64)
        out[:-1] = np.asarray(starts)
        out[-1] = self._blob_start[-1]
        out.flags.writeable = False
        return out

    @cached_property
    def doc_image_offsets(self) -> np.ndarray:
        """int64 ``(documents + 1,)``, computed once (``arrays.doc_image_offsets``)."""
        out = doc_image_offsets(self.store)
        out.flags.writeable = False
        return out
