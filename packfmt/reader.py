"""Zero-copy reader of one store (spec §3); pack indexes are ``packfmt.index``, the door is ``packfmt.opening``.

Every array is a read-only ``np.memmap`` view of its file, mapped when the store or pack index
is opened and checked then (``packfmt.checks``: every offset the reader indexes with lies inside
its array), so a ``Store`` is cheap to pickle (only the path travels; the receiving process maps
and checks the files itself) and safe to hand to DataLoader workers under fork or spawn. Nothing
here unpickles or evaluates anything; the manifest is plain JSON checked field by field.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from . import checks
from . import format as F
from .dataset import Dataset, running_sum
from .errors import FormatError, UnsupportedVersionError
from .mapped import check_files_table, map_file

__all__ = ["Store", "ImageStore"]


class Store(Dataset):
    """A packfmt dataset directory opened for reading.

    Opening maps every array and checks every structural invariant the reader indexes with
    (spec V10, V11, V13-V15, V19: ``packfmt.checks``), so no byte of the files can make a later
    read leave the dataset; anything else raises ``FormatError`` naming file, field, expected, found.

    Attributes:
        path: the dataset directory.
        manifest: the parsed ``Manifest``.
        tokens: token ids, shape ``(num_tokens,)``, uint16 or uint32 (zero-copy memmap).
        doc_offsets: int64 ``(num_documents + 1,)``: document d is ``tokens[doc_offsets[d]:doc_offsets[d+1]]``.
        loss_mask: uint8 ``(num_tokens,)`` of 0/1 (1 = token is a training target), or None.
        images: an ``ImageStore``, or None for a store without images.

    As a ``Dataset`` it is a collection of one: ``member(0)`` is the store itself.
    """

    def __init__(self, path: str | os.PathLike, *, origin=None) -> None:
        """``origin``: where a store opened from a URL came from (``storage.cache.Origin``; ``packfmt.open``)."""
        self.path = Path(path)
        self.origin = origin
        if not self.path.is_dir():
            raise FormatError(f"{self.path}: not a directory (expected a packfmt dataset directory)",
                              file=str(self.path), field="path", expected="directory",
                              found="missing" if not self.path.exists() else "file")
        #: the manifest's bytes, read once: parsed here, hashed by a collection that binds its checksum (C3)
        self.manifest_bytes = F.read_json_bytes(self.path / F.MANIFEST, file=F.MANIFEST)
        obj = F.parse_json(self.manifest_bytes, file=F.MANIFEST)
        if obj.get("format") == "packfmt-collection":
            raise UnsupportedVersionError(
                f"{self.path / F.MANIFEST}: format: a packfmt collection (format {obj.get('format_version')}: many "
                "stores read as one, spec/COLLECTION.md), not a single store; open it with packfmt.open(path)",
                file=F.MANIFEST, field="format", expected="'packfmt' (a store)", found="'packfmt-collection'")
        self.manifest = F.parse_manifest(obj, file=F.MANIFEST)
        check_files_table(self.path, self.manifest.files, F.expected_layout(self.manifest), where="")
        # Every array is mapped now, so a reader never mixes the files of this store with those of one
        # that replaced it at the same path later (a lazy map would open the new tokens.bin).
        self.tokens = self._array(F.TOKENS)
        self.doc_offsets = self._array(F.DOC_OFFSETS)
        self.loss_mask = self._array(F.LOSS_MASK) if self.manifest.has_loss_mask else None
        checks.raise_first(checks.offsets(self.doc_offsets, rule="V13", file=F.DOC_OFFSETS, last=self.num_tokens,
                                          last_what="counts.tokens", strict=True, unit="every document has >= 1 token"))
        self.images = ImageStore(self) if self.num_images > 0 else None
        m = self.manifest
        self.doc_start, self.token_start, self.image_start = (running_sum([n]) for n in
                                                              (m.num_documents, m.num_tokens, m.num_images))
        self.all_trained = (False,)

    # -- pickling: only the path crosses process boundaries; memmaps are re-created (and re-checked).
    def __getstate__(self) -> dict:
        return {"path": str(self.path)}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path"])

    def __repr__(self) -> str:
        m = self.manifest
        return (f"Store({str(self.path)!r}, documents={m.num_documents}, tokens={m.num_tokens}, "
                f"dtype={m.token_dtype}, images={m.num_images}, loss_mask={m.has_loss_mask})")

    def _shared(self) -> dict:
        m = self.manifest
        return {"vocab_size": m.vocab_size, "token_dtype": m.token_dtype, "special_tokens": m.special_tokens,
                "loss_mask": m.has_loss_mask}

    def member(self, m: int) -> "Store":
        """The store itself: a store is a collection of one."""
        if m not in (0, -1):
            raise IndexError(f"member {m} out of range [0, 1) (a store is a collection of one)")
        return self

    # -- arrays (zero-copy)
    def _array(self, name: str) -> np.ndarray:
        dtype, shape = F.expected_layout(self.manifest)[name]
        return map_file(self.path / name, dtype, shape, file=name)

    @property
    def doc_lengths(self) -> np.ndarray:
        """int64 ``(num_documents,)``, computed (not stored)."""
        return np.diff(self.doc_offsets)

    def document(self, i: int) -> np.ndarray:
        """Tokens of document ``i`` as a zero-copy view."""
        i = self._doc_index(i)
        off = self.doc_offsets
        return self.tokens[off[i]:off[i + 1]]

    def document_loss_mask(self, i: int) -> np.ndarray | None:
        if self.loss_mask is None:
            return None
        i = self._doc_index(i)
        off = self.doc_offsets
        return self.loss_mask[off[i]:off[i + 1]]

    def _doc_index(self, i: int) -> int:
        return self.locate(i)[1]

    def index_binding(self) -> dict:
        """What a pack index of this store records to bind to it (spec FORMAT §4.1 ``dataset``)."""
        files = self.manifest.files
        return {"dataset": {F.TOKENS: files[F.TOKENS].checksum, F.DOC_OFFSETS: files[F.DOC_OFFSETS].checksum}}


class ImageStore:
    """Zero-copy access to the images of a store (spec §3.4)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.blobs = map_file(store.path / F.IMAGE_BLOBS, F.BLOB_DTYPE, (store.manifest.files[F.IMAGE_BLOBS].bytes,), file=F.IMAGE_BLOBS)
        self.offsets = store._array(F.IMAGE_OFFSETS)
        self.meta = store._array(F.IMAGE_META)  # (n_images, 3): width, height, codec
        self.doc_image_offsets = store._array(F.DOC_IMAGE_OFFSETS)
        self.token_spans = store._array(F.IMAGE_TOKEN_SPANS)  # (n_images, 2) global token offsets
        checks.raise_first(checks.offsets(self.offsets, rule="V14", file=F.IMAGE_OFFSETS, last=self.blobs.shape[0],
                                          last_what=f"size of {F.IMAGE_BLOBS}", strict=True, unit="every image has >= 1 byte in image_blobs.bin"))
        checks.raise_first(checks.offsets(self.doc_image_offsets, rule="V15", file=F.DOC_IMAGE_OFFSETS,
                                          last=store.num_images, last_what="counts.images", strict=False,
                                          unit="images per document"))
        checks.raise_first(checks.image_spans(self.token_spans, self.doc_image_offsets, store.doc_offsets,
                                              file=F.IMAGE_TOKEN_SPANS))

    def __len__(self) -> int:
        return self.meta.shape[0]

    def data(self, i: int) -> memoryview:
        """Encoded bytes of image ``i`` (zero-copy)."""
        return memoryview(self.blobs[self.offsets[i]:self.offsets[i + 1]])

    def codec(self, i: int) -> str:
        code = int(self.meta[i, 2])
        if code not in F.CODECS:
            raise FormatError(file=F.IMAGE_META, field=f"[{i}].codec", expected=f"one of {sorted(F.CODECS)}", found=code)
        return F.CODECS[code]

    def size(self, i: int) -> tuple[int, int]:
        return int(self.meta[i, 0]), int(self.meta[i, 1])

    def of_document(self, d: int) -> range:
        return range(int(self.doc_image_offsets[d]), int(self.doc_image_offsets[d + 1]))

    def decode(self, i: int, max_pixels: int = F.MAX_IMAGE_PIXELS) -> np.ndarray:
        """Decode image ``i`` to a uint8 HxWxC array (Pillow for encoded codecs)."""
        from .images import decode_image

        w, h = self.size(i)
        return decode_image(bytes(self.data(i)), self.codec(i), w, h, max_pixels=max_pixels)


