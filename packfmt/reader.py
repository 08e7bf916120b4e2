"""Zero-copy reader: ``packfmt.open(path)`` (spec §3, §4).

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
from .errors import FormatError, UnsupportedVersionError

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
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        if not self.path.is_dir():
            raise FormatError(f"{self.path}: not a directory (expected a packfmt dataset directory)",
                              file=str(self.path), expected="directory", found="missing" if not self.path.exists() else "file")
        obj = F.read_json(self.path / F.MANIFEST, file=F.MANIFEST)
        if obj.get("format") == "packfmt-collection":
            raise UnsupportedVersionError(
                f"{self.path / F.MANIFEST}: format: a packfmt collection (format {obj.get('format_version')}: many "
                "stores read as one, spec/COLLECTION.md), not a single store; open it with packfmt.open(path)",
                file=F.MANIFEST, field="format", expected="'packfmt' (a store)", found="'packfmt-collection'")
        self.manifest = F.parse_manifest(obj, file=F.MANIFEST)
        _check_files_table(self.path, self.manifest.files, F.expected_layout(self.manifest), where="")
        self.tokens = self._array(F.TOKENS)
        self.doc_offsets = self._array(F.DOC_OFFSETS)
        checks.raise_first(checks.offsets(self.doc_offsets, rule="V13", file=F.DOC_OFFSETS, last=self.num_tokens,
                                          last_what="counts.tokens", strict=True, unit="every document has >= 1 token"))
        self.loss_mask = self._array(F.LOSS_MASK) if self.manifest.has_loss_mask else None
        self.images = ImageStore(self) if self.num_images > 0 else None

    # -- pickling: only the path crosses process boundaries; memmaps are re-created (and re-checked).
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
        if not -self.num_documents <= i < self.num_documents:
            raise IndexError(f"document {i} out of range [0, {self.num_documents})")
        return int(i) % self.num_documents

    # -- pack indexes
    def pack_index_names(self) -> list[str]:
        """Names of the pack indexes under ``packs/`` (sorted; temporaries of unfinished writes excluded)."""
        return list_pack_indexes(self.path)

    def pack_index(self, name: str | None = None) -> "PackIndex":
        """Open pack index ``name`` (default: the only one there is); see ``open_pack_index``."""
        return open_pack_index(self, name)

    # -- what a collection also says (a 1.0 store is a collection of one)
    @property
    def np_token_dtype(self) -> np.dtype:
        return self.manifest.np_token_dtype

    @property
    def has_loss_mask(self) -> bool:
        return self.manifest.has_loss_mask

    def index_binding(self) -> dict:
        """What a pack index of this store records to bind to it (spec FORMAT §4.1 ``dataset``)."""
        files = self.manifest.files
        return {"dataset": {F.TOKENS: files[F.TOKENS].checksum, F.DOC_OFFSETS: files[F.DOC_OFFSETS].checksum}}


def list_pack_indexes(root: Path) -> list[str]:
    """Names of the pack indexes under ``root/packs/`` (sorted; temporaries of unfinished writes excluded)."""
    packs = Path(root) / F.PACKS_DIR
    if not packs.is_dir():
        return []
    return sorted(p.name for p in packs.iterdir() if p.is_dir() and not p.name.startswith(".")
                  and (p / F.PACK_INDEX_JSON).exists())


def open_pack_index(source, name: str | None = None) -> "PackIndex":
    """Open pack index ``name`` of a store or collection (default: the only one there is).

    A name that does not exist, or no name when there are several, is a FormatError that lists
    the indexes there are; a dataset without any says how to create one. (A ``packs/<name>``
    folder that is not a complete index gets PackIndex's own, more precise, error.)
    """
    path = source.path
    names = list_pack_indexes(path)
    if not names:
        api = f"build_pack_index({str(path)!r}, capacity=N)"
        cli = f"packfmt pack {path} --capacity N"
        what = f"{path}: no pack index" + ("" if name is None else f" (asked for {name!r})")
        raise FormatError(f"{what}; create one with {api}", file=F.PACKS_DIR, expected="a pack index", found="none",
                          cli=f"{what}; create one with `{cli}`")
    if name is None and len(names) > 1:
        raise FormatError(f"{path}: {len(names)} pack indexes {names}: pass one of them as the index name",
                          file=F.PACKS_DIR, expected="one pack index name", found=names,
                          cli=f"{path}: {len(names)} pack indexes {names}: pick one with --index NAME")
    if name is not None and name not in names and not (path / F.PACKS_DIR / name).is_dir():
        raise FormatError(f"{path}: no pack index {name!r}; the pack indexes are {names}",
                          file=F.PACKS_DIR, field=name, expected=f"one of {names}", found=name)
    return PackIndex(source, names[0] if name is None else name)


class ImageStore:
    """Zero-copy access to the images of a store (spec §3.4)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.blobs = _map(store.path / F.IMAGE_BLOBS, F.BLOB_DTYPE, (store.manifest.files[F.IMAGE_BLOBS].bytes,), file=F.IMAGE_BLOBS)
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


class PackIndex:
    """One pack index under ``packs/<name>/`` (spec §4): CSR of segments ``(doc, begin, end)``.

    ``store`` is the store or the collection (spec/COLLECTION.md §4) the index belongs to; its
    document ids are that source's.
    """

    def __init__(self, store, name: str, *, _built_pack_lengths: np.ndarray | None = None) -> None:
        """``_built_pack_lengths``: for ``build_pack_index`` only, which returns the index it has just
        written with the pack lengths it computed: the segment and pack bounds hold by construction
        there, so they are not read back (everything else, index.json and the file sizes, is)."""
        self.store = store
        self.name = F.check_index_name(name)
        self.path = store.path / F.PACKS_DIR / name
        self._label = f"{F.PACKS_DIR}/{name}/"
        self.manifest = F.parse_pack_index_manifest(
            F.read_json(self.path / F.PACK_INDEX_JSON, file=self._label + F.PACK_INDEX_JSON), file=self._label + F.PACK_INDEX_JSON)
        self._check_binding(store.index_binding())
        if self.manifest.name != name:
            raise FormatError(file=self._label + F.PACK_INDEX_JSON, field="name", expected=repr(name) + " (the directory name)",
                              found=repr(self.manifest.name))
        n_packed = self.manifest.raw["counts"]["packed_tokens"]
        self._layout = F.pack_index_layout(self.manifest, store.np_token_dtype, store.has_loss_mask, n_packed)
        for fname in self._layout:
            if fname not in self.manifest.files:
                raise FormatError(f"{self._label}{F.PACK_INDEX_JSON}: files.{fname}: required entry missing",
                                  file=self._label + F.PACK_INDEX_JSON, field=f"files.{fname}", expected="present", found="missing")
        _check_files_table(self.path, self.manifest.files, self._layout, where=self._label)
        # Every array is mapped now, so a reader never mixes the files of an index with those of
        # one that replaced it later; then every offset the reader indexes with is checked.
        materialized = self.manifest.materialized
        self.pack_offsets = self._array(F.PACK_OFFSETS)
        self.segments = self._array(F.SEGMENTS)
        self.pack_token_offsets = self._array(F.PACK_TOKEN_OFFSETS) if materialized else None
        self.packed_tokens = self._array(F.PACKED_TOKENS) if materialized else None
        self.packed_loss_mask = self._array(F.PACKED_LOSS_MASK) if materialized and store.has_loss_mask else None
        self.pack_lengths = self._check(n_packed) if _built_pack_lengths is None else _built_pack_lengths

    def _check_binding(self, want: dict) -> None:
        """V23 / COLLECTION C5: the index was built for this store (or this collection's member list)."""
        label = self._label + F.PACK_INDEX_JSON
        have = self.manifest.binding
        if set(have) != set(want):
            kind = "a collection" if "collection" in have else "a single store"
            raise FormatError(f"{label}: this index was built for {kind} (it records {sorted(have)}), but "
                              f"{self.store.path} is not one (it needs {sorted(want)}); pack it again there",
                              file=label, field=sorted(have)[0], expected=sorted(want)[0], found=sorted(have)[0])
        for key, value in want.items():
            for sub, expected in (value.items() if isinstance(value, dict) else [(None, value)]):
                found = have[key][sub] if sub else have[key]
                if found != expected:
                    field = f"{key}.{sub}" if sub else key
                    what = "token store" if key == "dataset" else "member list"
                    raise FormatError(f"{label}: {field}: this index was built for another {what} (expected "
                                      f"{expected} from {self.store.path / F.MANIFEST}, found {found}); pack it again",
                                      file=label, field=field, expected=expected, found=found)

    def _check(self, n_packed: int) -> np.ndarray:
        """V25, V27, V29: return the int64 token count of every pack."""
        lab = self._label
        checks.raise_first(checks.offsets(self.pack_offsets, rule="V25", file=lab + F.PACK_OFFSETS,
                                          last=self.manifest.num_segments, last_what="counts.segments", strict=True,
                                          unit="every pack has >= 1 segment"))
        if self.pack_token_offsets is not None:
            checks.raise_first(checks.offsets(self.pack_token_offsets, rule="V25", file=lab + F.PACK_TOKEN_OFFSETS,
                                              last=n_packed, last_what="counts.packed_tokens", strict=False,
                                              unit="tokens per pack"))
        found, lengths = checks.segments(self.segments, self.store.doc_offsets, self.pack_offsets,
                                         file=lab + F.SEGMENTS)
        checks.raise_first(found)
        checks.raise_first(checks.packs(lengths, self.capacity, n_packed, file=lab + F.SEGMENTS,
                                        pack_token_offsets=self.pack_token_offsets, pto_file=lab + F.PACK_TOKEN_OFFSETS))
        return lengths

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
        return np.concatenate([self.store.document(int(d))[b:e] for d, b, e in segs])

    def __getstate__(self) -> dict:
        return {"store": self.store, "name": self.name}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["store"], state["name"])


def open_dataset(path: str | os.PathLike, *, storage_options: dict | None = None, cache_dir=None, cache_limit=None,
                 cache_verify: str | None = None, stream: bool = False):
    """Open a packfmt store (a ``Store``) or collection (a ``Collection``): manifest, sizes and offsets checked.

    ``path`` may be a URL (``s3://``, ``gs://``, ``file://`` ...; ``packfmt.storage``): its files are
    fetched whole into the node-local cache (``cache_dir=``, else ``$PACKFMT_CACHE``; at most
    ``cache_limit`` bytes), verified against the manifest's sizes and checksums, and mapped from there.
    ``storage_options`` go to fsspec (credentials, ``endpoint_url`` ...). A cached file is hashed again when its
    stat changed since it was verified; ``cache_verify="full"`` (or ``$PACKFMT_CACHE_VERIFY=full``) on every open.
    ``stream=True`` (a remote collection): fetch its manifest and pack indexes only, and each member when a read
    first needs it, at most ``cache_limit`` bytes of members at once (``packfmt.storage.stream``).
    """
    from .storage import is_remote, local_file

    if is_remote(path) and stream:
        from .storage.stream import open_streamed

        return open_streamed(path, storage_options, cache_dir, cache_limit, cache_verify)
    if is_remote(path):
        from .storage import open_url

        return open_url(path, storage_options, cache_dir, cache_limit, cache_verify)
    path = Path(local_file(path))
    from .storage.verify import check_mirror

    check_mirror(path, cache_verify)  # a mirror in the remote cache: changed files hashed again (packfmt.storage)
    if (path / F.MANIFEST).is_file():
        from .collection.manifest import is_collection

        if is_collection(F.read_json(path / F.MANIFEST, file=F.MANIFEST)):
            from .collection import Collection

            return Collection(path)
    return Store(path)
