"""Zero-copy reader: ``packfmt.open(path)`` (spec §3, §4).

Every array is a read-only ``np.memmap`` view of its file, created lazily on first use, so a
``Store`` is cheap to create, cheap to pickle (only the path travels), and safe to hand to
DataLoader workers under fork or spawn: each process maps the files itself. Nothing here
unpickles or evaluates anything; the manifest is plain JSON checked field by field.
"""

from __future__ import annotations

import os
from functools import cached_property
from pathlib import Path

import numpy as np

from . import format as F
from .errors import FormatError

__all__ = ["open_dataset", "Store", "ImageStore", "PackIndex"]


def _map(path: Path, dtype: np.dtype, shape: tuple[int, ...], *, file: str) -> np.ndarray:
    """Read-only memmap of a whole file with an exact expected size (empty files -> empty arrays)."""
    expected = F.nbytes_of(dtype, shape)
    try:
        found = os.path.getsize(path)
    except FileNotFoundError:
        raise FormatError(f"{file}: missing (expected {expected} bytes of {np.dtype(dtype).str} {shape})",
                          file=file, expected=f"{expected} bytes", found="missing") from None
    if found != expected:
        raise FormatError(f"{file}: size: expected {expected} bytes ({np.dtype(dtype).str} x {shape}), found {found}",
                          file=file, field="size", expected=expected, found=found)
    if expected == 0:
        arr = np.empty(shape, dtype=dtype)
        arr.flags.writeable = False
        return arr
    return np.memmap(path, dtype=dtype, mode="r", shape=shape)


def _check_files_table(root: Path, files: dict[str, F.FileEntry], layout: dict, *, where: str) -> None:
    """Every listed file exists with its recorded size; the size agrees with the layout."""
    for name, entry in files.items():
        p = root / name
        label = f"{where}{name}"
        try:
            size = os.path.getsize(p)
        except FileNotFoundError:
            raise FormatError(f"{label}: missing (listed in the manifest with {entry.bytes} bytes)",
                              file=label, expected=f"{entry.bytes} bytes", found="missing") from None
        if size != entry.bytes:
            raise FormatError(f"{label}: size: expected {entry.bytes} bytes (manifest), found {size}",
                              file=label, field="size", expected=entry.bytes, found=size)
        if name in layout:
            dtype, shape = layout[name]
            want = F.nbytes_of(dtype, shape)
            if want != entry.bytes:
                raise FormatError(f"{label}: size: expected {want} bytes ({np.dtype(dtype).str} x {shape} from the counts), "
                                  f"found {entry.bytes} recorded", file=label, field="bytes", expected=want, found=entry.bytes)


class Store:
    """A packfmt dataset directory opened for reading.

    Attributes:
        path: the dataset directory.
        manifest: the parsed ``Manifest``.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        if not self.path.is_dir():
            raise FormatError(f"{self.path}: not a directory (expected a packfmt dataset directory)",
                              file=str(self.path), expected="directory", found="missing" if not self.path.exists() else "file")
        self.manifest = F.parse_manifest(F.read_json(self.path / F.MANIFEST, file=F.MANIFEST), file=F.MANIFEST)
        _check_files_table(self.path, self.manifest.files, F.expected_layout(self.manifest), where="")

    # -- pickling: only the path crosses process boundaries; memmaps are re-created lazily.
    def __getstate__(self) -> dict:
        return {"path": str(self.path)}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path"])

    def __repr__(self) -> str:
        m = self.manifest
        return (f"Store({str(self.path)!r}, documents={m.num_documents}, tokens={m.num_tokens}, "
                f"dtype={m.token_dtype}, images={m.num_images}, loss_mask={m.has_loss_mask})")

    # -- counts
    @property
    def num_documents(self) -> int:
        return self.manifest.num_documents

    @property
    def num_tokens(self) -> int:
        return self.manifest.num_tokens

    @property
    def num_images(self) -> int:
        return self.manifest.num_images

    @property
    def vocab_size(self) -> int:
        return self.manifest.vocab_size

    @property
    def special_tokens(self) -> dict:
        return self.manifest.special_tokens

    def __len__(self) -> int:
        return self.num_documents

    # -- arrays (zero-copy)
    def _array(self, name: str) -> np.ndarray:
        dtype, shape = F.expected_layout(self.manifest)[name]
        return _map(self.path / name, dtype, shape, file=name)

    @cached_property
    def tokens(self) -> np.ndarray:
        """Token ids, shape ``(num_tokens,)``, uint16 or uint32."""
        return self._array(F.TOKENS)

    @cached_property
    def doc_offsets(self) -> np.ndarray:
        """int64 ``(num_documents + 1,)``: document d is ``tokens[doc_offsets[d]:doc_offsets[d+1]]``."""
        arr = self._array(F.DOC_OFFSETS)
        if arr[0] != 0 or arr[-1] != self.num_tokens:
            field = "[0]" if arr[0] != 0 else f"[{arr.shape[0] - 1}]"
            raise FormatError(file=F.DOC_OFFSETS, field=field, expected=0 if arr[0] != 0 else self.num_tokens,
                              found=int(arr[0] if arr[0] != 0 else arr[-1]))
        return arr

    @cached_property
    def loss_mask(self) -> np.ndarray | None:
        """uint8 ``(num_tokens,)`` of 0/1 (1 = token is a training target), or None."""
        return self._array(F.LOSS_MASK) if self.manifest.has_loss_mask else None

    @property
    def doc_lengths(self) -> np.ndarray:
        """int64 ``(num_documents,)``, computed (not stored)."""
        return np.diff(self.doc_offsets)

    def document(self, i: int) -> np.ndarray:
        """Tokens of document ``i`` as a zero-copy view."""
        off = self.doc_offsets
        if not -self.num_documents <= i < self.num_documents:
            raise IndexError(f"document {i} out of range [0, {self.num_documents})")
        i %= self.num_documents
        return self.tokens[off[i]:off[i + 1]]

    def document_loss_mask(self, i: int) -> np.ndarray | None:
        if self.loss_mask is None:
            return None
        off = self.doc_offsets
        return self.loss_mask[off[i]:off[i + 1]]

    @cached_property
    def images(self) -> "ImageStore | None":
        return ImageStore(self) if self.num_images > 0 else None

    # -- pack indexes
    def pack_index_names(self) -> list[str]:
        root = self.path / F.PACKS_DIR
        if not root.is_dir():
            return []
        return sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")
                      and (p / F.PACK_INDEX_JSON).exists())

    def pack_index(self, name: str | None = None) -> "PackIndex":
        """Open pack index ``name`` (default: the only one there is)."""
        names = self.pack_index_names()
        if name is None:
            if len(names) != 1:
                raise FormatError(f"{self.path / F.PACKS_DIR}: expected exactly one pack index when no name is given, found {names}",
                                  file=F.PACKS_DIR, expected="one pack index", found=names)
            name = names[0]
        return PackIndex(self, name)


class ImageStore:
    """Zero-copy access to the images of a store (spec §3.4)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.blobs = _map(store.path / F.IMAGE_BLOBS, F.BLOB_DTYPE, (store.manifest.files[F.IMAGE_BLOBS].bytes,), file=F.IMAGE_BLOBS)
        self.offsets = store._array(F.IMAGE_OFFSETS)
        self.meta = store._array(F.IMAGE_META)  # (n_images, 3): width, height, codec
        self.doc_image_offsets = store._array(F.DOC_IMAGE_OFFSETS)
        self.token_spans = store._array(F.IMAGE_TOKEN_SPANS)  # (n_images, 2) global token offsets
        if self.offsets[-1] != self.blobs.shape[0]:
            raise FormatError(file=F.IMAGE_OFFSETS, field=f"[{self.offsets.shape[0] - 1}]",
                              expected=f"{self.blobs.shape[0]} (size of {F.IMAGE_BLOBS})", found=int(self.offsets[-1]))

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


class PackIndex:
    """One pack index under ``packs/<name>/`` (spec §4): CSR of segments ``(doc, begin, end)``."""

    def __init__(self, store: Store, name: str) -> None:
        self.store = store
        self.name = F.check_index_name(name)
        self.path = store.path / F.PACKS_DIR / name
        self._label = f"{F.PACKS_DIR}/{name}/"
        self.manifest = F.parse_pack_index_manifest(
            F.read_json(self.path / F.PACK_INDEX_JSON, file=self._label + F.PACK_INDEX_JSON), file=self._label + F.PACK_INDEX_JSON)
        sm = store.manifest
        for key in (F.TOKENS, F.DOC_OFFSETS):
            if self.manifest.dataset[key] != sm.files[key].checksum:
                raise FormatError(
                    f"{self._label}{F.PACK_INDEX_JSON}: dataset.{key}: this index was built for another token store "
                    f"(expected {sm.files[key].checksum} from manifest.json, found {self.manifest.dataset[key]})",
                    file=self._label + F.PACK_INDEX_JSON, field=f"dataset.{key}", expected=sm.files[key].checksum,
                    found=self.manifest.dataset[key])
        if self.manifest.name != name:
            raise FormatError(file=self._label + F.PACK_INDEX_JSON, field="name", expected=repr(name) + " (the directory name)",
                              found=repr(self.manifest.name))
        n_packed = self.manifest.raw["counts"]["packed_tokens"]
        self._layout = F.pack_index_layout(self.manifest, sm.np_token_dtype, sm.has_loss_mask, n_packed)
        for fname in self._layout:
            if fname not in self.manifest.files:
                raise FormatError(f"{self._label}{F.PACK_INDEX_JSON}: files.{fname}: required entry missing",
                                  file=self._label + F.PACK_INDEX_JSON, field=f"files.{fname}", expected="present", found="missing")
        _check_files_table(self.path, self.manifest.files, self._layout, where=self._label)

    def _array(self, name: str) -> np.ndarray:
        dtype, shape = self._layout[name]
        return _map(self.path / name, dtype, shape, file=self._label + name)

    @property
    def capacity(self) -> int:
        return self.manifest.capacity

    @property
    def algorithm(self) -> str:
        return self.manifest.algorithm

    @property
    def stats(self) -> dict:
        return self.manifest.stats

    @property
    def num_packs(self) -> int:
        return self.manifest.num_packs

    def __len__(self) -> int:
        return self.num_packs

    @cached_property
    def pack_offsets(self) -> np.ndarray:
        """int64 ``(num_packs + 1,)``: pack p holds segments ``pack_offsets[p]:pack_offsets[p+1]``."""
        return self._array(F.PACK_OFFSETS)

    @cached_property
    def segments(self) -> np.ndarray:
        """int64 ``(num_segments, 3)``: ``(doc, begin, end)``, offsets relative to the document start."""
        return self._array(F.SEGMENTS)

    @cached_property
    def pack_token_offsets(self) -> np.ndarray | None:
        return self._array(F.PACK_TOKEN_OFFSETS) if self.manifest.materialized else None

    @cached_property
    def packed_tokens(self) -> np.ndarray | None:
        return self._array(F.PACKED_TOKENS) if self.manifest.materialized else None

    @cached_property
    def packed_loss_mask(self) -> np.ndarray | None:
        if not (self.manifest.materialized and self.store.manifest.has_loss_mask):
            return None
        return self._array(F.PACKED_LOSS_MASK)

    def pack_segments(self, p: int) -> np.ndarray:
        """Segments of pack ``p``: view of shape ``(k, 3)``."""
        off = self.pack_offsets
        return self.segments[off[p]:off[p + 1]]

    def pack_tokens(self, p: int) -> np.ndarray:
        """Tokens of pack ``p`` in order (a view when materialized, else a concatenated copy)."""
        if self.manifest.materialized:
            o = self.pack_token_offsets
            return self.packed_tokens[o[p]:o[p + 1]]
        segs = self.pack_segments(p)
        starts = self.store.doc_offsets[segs[:, 0]]
        toks = self.store.tokens
        return np.concatenate([toks[s + b:s + e] for s, b, e in zip(starts, segs[:, 1], segs[:, 2])])

    def __getstate__(self) -> dict:
        return {"store": self.store, "name": self.name}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["store"], state["name"])


def open_dataset(path: str | os.PathLike) -> Store:
    """Open a packfmt dataset directory (checks manifest, file presence and sizes; no data read)."""
    return Store(path)
