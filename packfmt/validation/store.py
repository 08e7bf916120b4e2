"""Checks of a store's own files and arrays (spec FORMAT §6, V1-V20)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

from .. import checks
from .. import format as F
from .report import (CHUNK_ELEMS, ERROR, MAX_LISTED, WARNING, _check_offsets, _chunks, _Collector, _hash, _listed,
                     _map_file)


# ----------------------------------------------------------------------------- the token store
class _DatasetChecks:
    """Checks of the dataset directory proper; keeps the arrays it could map for the index checks."""

    def __init__(self, root: Path, manifest: F.Manifest, out: _Collector) -> None:
        self.root, self.m, self.out = root, manifest, out
        self.sizes_ok: dict[str, bool] = {}  # file -> on-disk size agrees with manifest and counts
        self.decode_images = True  # V20 in the deep pass
        self.doc_offsets_ok = False
        self.spans_ok = False

    # -- structural
    def structural(self, listed: bool = True) -> None:
        """V9-V11, V13-V15, V19; ``listed``: also warn of what the directory holds besides its files."""
        self._files_table()  # V9 (the "only if" half), V10, V11
        if listed:
            self._unknown_files()
        self._doc_offsets()  # V13
        if self.m.num_images > 0:
            self._image_offsets()  # V14, V15, V19

    def _files_table(self) -> None:
        layout = F.expected_layout(self.m)
        for name, entry in sorted(self.m.files.items()):
            self.sizes_ok[name] = _check_file_size(self.out, self.root / name, name, entry, layout.get(name),
                                                   _layout_source(self.m, name))
            self._listed_but_unexpected(name)
        for name in layout:
            if name not in self.m.files:
                self.sizes_ok[name] = False
                self.out.add(F.MANIFEST, f"files.{name}", "an entry (implied by the counts)", "missing")

    def _listed_but_unexpected(self, name: str) -> None:
        """A format file listed although the manifest's flags say it is absent is an error; others warn."""
        m = self.m
        if name in F.required_files(m.has_loss_mask, m.num_images > 0):
            return
        if name == F.LOSS_MASK:
            self.out.add(F.MANIFEST, "loss_mask", f"true (files lists {F.LOSS_MASK})", "false")
        elif name in F.required_files(False, True):
            self.out.add(F.MANIFEST, "counts.images", f">= 1 (files lists {name})", m.num_images)
        else:
            self.out.add(name, None, severity=WARNING, detail="listed in manifest.json but not a file of format "
                         f"{F.FORMAT_VERSION_STR}; readers ignore it")

    def _unknown_files(self) -> None:
        known = set(self.m.files) | {F.MANIFEST, F.PACKS_DIR}
        for p in sorted(self.root.iterdir()):
            if p.name not in known:
                self.out.add(p.name, None, severity=WARNING, detail="unknown file, not listed in manifest.json")

    def binding(self) -> dict:
        """What a pack index of this store must record (V23), as ``Store.index_binding``."""
        files = self.m.files
        return {"dataset": {k: files[k].checksum for k in (F.TOKENS, F.DOC_OFFSETS) if k in files}}

    def array(self, name: str) -> np.ndarray | None:
        """Memmap of a dataset array whose size checked out, else None."""
        if not self.sizes_ok.get(name):
            return None
        dtype, shape = F.expected_layout(self.m)[name]
        return _map_file(self.root / name, dtype, shape)

    def _doc_offsets(self) -> None:
        off = self.array(F.DOC_OFFSETS)
        if off is None:
            return
        self.doc_offsets_ok = _check_offsets(self.out, F.DOC_OFFSETS, off, rule="V13", last=self.m.num_tokens,
                                             last_what="counts.tokens", strict=True,
                                             unit="every document has >= 1 token")

    def _image_offsets(self) -> None:
        off = self.array(F.IMAGE_OFFSETS)
        blob_entry = self.m.files.get(F.IMAGE_BLOBS)
        if off is not None and blob_entry is not None and self.sizes_ok.get(F.IMAGE_BLOBS):
            _check_offsets(self.out, F.IMAGE_OFFSETS, off, rule="V14", last=blob_entry.bytes,
                           last_what=f"size of {F.IMAGE_BLOBS}", strict=True, unit="every image has >= 1 byte in image_blobs.bin")
        dio = self.array(F.DOC_IMAGE_OFFSETS)
        if dio is not None:
            dio_ok = _check_offsets(self.out, F.DOC_IMAGE_OFFSETS, dio, rule="V15", last=self.m.num_images,
                                    last_what="counts.images", strict=False, unit="images per document")
            spans, off = self.array(F.IMAGE_TOKEN_SPANS), self.array(F.DOC_OFFSETS)
            if dio_ok and spans is not None and off is not None and self.doc_offsets_ok:
                self.spans_ok = self.out.findings(checks.image_spans(spans, dio, off, file=F.IMAGE_TOKEN_SPANS))

    # -- deep
    def deep_bytes(self) -> int:
        return sum(e.bytes for e in self.m.files.values()) + self.m.num_tokens * (
            self.m.np_token_dtype.itemsize + (1 if self.m.has_loss_mask else 0))

    def deep(self, bar) -> None:
        for name, entry in sorted(self.m.files.items()):
            _check_checksum(self.out, self.root / name, name, entry, bar)  # V12
        self._token_range(bar)  # V16
        if self.m.has_loss_mask:
            mask = self.array(F.LOSS_MASK)
            if mask is not None:
                _check_mask_values(self.out, F.LOSS_MASK, mask, bar)  # V17
        if self.m.num_images > 0:
            self._image_meta()  # V18 (V19 is structural)
            if self.decode_images:
                self._image_decode(progress=bar is not None)

    def _token_range(self, bar) -> None:
        tokens = self.array(F.TOKENS)
        if tokens is None:
            return
        vocab = self.m.vocab_size
        if vocab >= np.iinfo(tokens.dtype).max + 1:  # every value of the dtype is a valid id
            if bar is not None:
                bar.update(tokens.nbytes)
            return
        first, count, top = None, 0, -1
        for a, b in _chunks(tokens.shape[0], CHUNK_ELEMS * 4):
            chunk = tokens[a:b]
            hi = int(chunk.max()) if chunk.size else -1
            if hi >= vocab:
                bad = np.flatnonzero(chunk >= vocab)
                count += bad.size
                top = max(top, hi)
                if first is None:
                    first = a + int(bad[0])
            if bar is not None:
                bar.update(chunk.nbytes)
        if first is not None:
            doc = self._doc_of_token(first)
            self.out.add(F.TOKENS, "vocab_size", f"every token id < vocab_size {vocab} (manifest.json)",
                         f"{count} ids >= {vocab} (max {top}); first at token {first}{doc}")

    def _doc_of_token(self, t: int) -> str:
        off = self.array(F.DOC_OFFSETS)
        if off is None or not self.doc_offsets_ok:
            return ""
        d = int(np.searchsorted(off, t, side="right")) - 1
        return f" (document {d}, position {t - int(off[d])})"

    def _image_meta(self) -> None:
        meta = self.array(F.IMAGE_META)
        if meta is None:
            return
        meta = np.asarray(meta)
        codes = np.array(sorted(F.CODECS), dtype=np.uint32)
        bad_codec = np.flatnonzero(~np.isin(meta[:, 2], codes))
        if bad_codec.size:  # a newer minor version may add codec ids (spec §8): not checkable here, not an error
            newer = self.m.version > F.KNOWN_VERSION
            self.out.add(F.IMAGE_META, "codec (column 2)", f"one of {dict(sorted(F.CODECS.items()))}",
                         f"unknown codec ids {sorted(set(meta[bad_codec[:MAX_LISTED], 2].tolist()))} at images {_listed(bad_codec)}"
                         + (f" (format {self.m.version[0]}.{self.m.version[1]} may define them; not decoded)" if newer else ""),
                         severity=WARNING if newer else ERROR)
        bad_size = np.flatnonzero((meta[:, 0] < 1) | (meta[:, 1] < 1))
        if bad_size.size:
            self.out.add(F.IMAGE_META, "width/height (columns 0, 1)", ">= 1 pixel", f"0 at images {_listed(bad_size)}")

    def _image_decode(self, progress: bool) -> None:
        """V20: every blob decodes with its codec to exactly width x height pixels (bounded)."""
        from ..images import DEFAULT_MAX_PIXELS, decode_image

        blobs_entry = self.m.files.get(F.IMAGE_BLOBS)
        offsets, meta = self.array(F.IMAGE_OFFSETS), self.array(F.IMAGE_META)
        if blobs_entry is None or offsets is None or meta is None or not self.sizes_ok.get(F.IMAGE_BLOBS, True):
            return
        blobs = _map_file(self.root / F.IMAGE_BLOBS, F.BLOB_DTYPE, (blobs_entry.bytes,))
        offsets, meta = np.asarray(offsets), np.asarray(meta)
        if offsets[0] != 0 or offsets[-1] != blobs.shape[0] or (np.diff(offsets) < 0).any():
            return  # reported structurally
        bad: list[int] = []
        first_reason = ""
        it = range(meta.shape[0])
        if progress:
            from tqdm import tqdm

            it = tqdm(it, desc="decode images", unit="img", file=sys.stderr, leave=False)
        for i in it:
            code = int(meta[i, 2])
            if code not in F.CODECS:
                continue  # reported by _image_meta
            try:
                decode_image(bytes(blobs[offsets[i]:offsets[i + 1]]), F.CODECS[code], int(meta[i, 0]), int(meta[i, 1]),
                             max_pixels=DEFAULT_MAX_PIXELS)
            except Exception as exc:  # any decoder failure is a finding, never a crash
                if not bad:
                    first_reason = f"{type(exc).__name__}: {exc}"
                bad.append(i)
        if bad:
            arr = np.array(bad)
            self.out.add(F.IMAGE_BLOBS, f"image {bad[0]}", "a blob that decodes with its codec to width x height of image_meta",
                         f"{len(bad)} image(s) that do not ({_listed(arr)}); first: {first_reason}")


def _layout_source(m: F.Manifest, name: str) -> str:
    """Which manifest fields imply a file's size (named in size mismatch messages)."""
    by_tokens = f"counts.tokens={m.num_tokens}"
    sources = {
        F.TOKENS: f"{by_tokens}, token_dtype={m.token_dtype!r}",
        F.LOSS_MASK: by_tokens,
        F.DOC_OFFSETS: f"counts.documents={m.num_documents}",
        F.DOC_IMAGE_OFFSETS: f"counts.documents={m.num_documents}",
        F.IMAGE_OFFSETS: f"counts.images={m.num_images}",
        F.IMAGE_META: f"counts.images={m.num_images}",
        F.IMAGE_TOKEN_SPANS: f"counts.images={m.num_images}",
    }
    return sources.get(name, "the counts")


def _check_file_size(out: _Collector, path: Path, label: str, entry: F.FileEntry, layout, source: str) -> bool:
    """The file exists, has its recorded size, and that size is what the counts imply."""
    try:
        size = os.path.getsize(path)
    except FileNotFoundError:
        out.add(label, None, f"{entry.bytes} bytes (listed in the manifest)", "missing")
        return False
    ok = True
    if size != entry.bytes:
        out.add(label, "size", f"{entry.bytes} bytes (recorded in the manifest)", f"{size} bytes on disk")
        ok = False
    if layout is not None:
        dtype, shape = layout
        want = F.nbytes_of(dtype, shape)
        if want != entry.bytes:
            field = source.split("=")[0] if "=" in source else "bytes"
            out.add(label, f"size ({field})", f"{want} bytes = {np.dtype(dtype).str} x {shape} from {source}",
                    f"{entry.bytes} bytes recorded")
            ok = False
        elif size != want:
            ok = False
    return ok


def _check_checksum(out: _Collector, path: Path, label: str, entry: F.FileEntry, bar) -> None:
    if not path.is_file():
        return  # reported structurally
    found = _hash(path, bar)
    if found != entry.checksum:
        out.add(label, "checksum", entry.checksum, found)


def _check_mask_values(out: _Collector, label: str, mask: np.ndarray, bar) -> None:
    first, count = None, 0
    for a, b in _chunks(mask.shape[0], CHUNK_ELEMS * 4):
        chunk = mask[a:b]
        if chunk.size and int(chunk.max()) > 1:
            bad = np.flatnonzero(chunk > 1)
            count += bad.size
            if first is None:
                first = (a + int(bad[0]), int(chunk[bad[0]]))
        if bar is not None:
            bar.update(chunk.nbytes)
    if first is not None:
        out.add(label, "values", "0 or 1", f"{first[1]} at token {first[0]} ({count} values > 1 in all)")
