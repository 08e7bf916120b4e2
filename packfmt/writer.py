"""Streaming dataset writer with bounded memory and atomic publish (spec §5).

Usage::

    with packfmt.DatasetWriter("out/ds", vocab_size=32000, tokenizer={"name": "gpt2", "hash": None}) as w:
        w.add_document([1, 2, 3])
    # the directory appears at out/ds only when the block exits without an exception

Every file is written into a hidden sibling directory (``.ds.packfmt-tmp-<pid>-<rand>``),
hashed while it is written, fsynced, and the manifest is written last; only then is the
directory renamed onto the target. A process killed at any moment leaves at most that hidden
directory, never something at the target path.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from . import format as F
from ._io import HashedFile, publish_dir, remove_stale_temps, temp_sibling
from .errors import TokenRangeError, WriteError
from .version import __version__

__all__ = ["DatasetWriter", "ImageRecord"]


@dataclass(frozen=True)
class ImageRecord:
    """One image of a document.

    Attributes:
        data: the encoded bytes as stored (e.g. the original PNG/JPEG file bytes).
        width, height: pixels, >= 1.
        codec: a codec name from ``format.CODECS`` (``"png"``, ``"jpeg"``, ...).
        token_begin, token_end: the image's run of tokens, relative to the document start,
            half-open ``[begin, end)``; ``end - begin`` is the image's token count.
    """

    data: bytes
    width: int
    height: int
    codec: str
    token_begin: int
    token_end: int


class DatasetWriter:
    """Append documents (tokens, optional loss mask, optional images) and publish atomically.

    Args:
        path: target dataset directory (must not exist unless ``overwrite``).
        vocab_size: number of token ids; fixes the token dtype (uint16 if <= 65,536, else uint32).
        tokenizer: ``{"name": str, "hash": "sha256:..." | None, ...}`` identity of the tokenizer. No
            ``path``: a path names a file on this host only (spec §2.2), so it is refused.
        special_tokens: ids for ``bos``, ``eos``, ``pad``, ``image`` (missing keys are null).
        loss_mask: whether every document carries a per-token loss mask.
        overwrite: replace an existing dataset at ``path`` (atomically, at finalize).
        extra: free-form JSON object stored under the manifest's ``extra`` key.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        vocab_size: int,
        tokenizer: Mapping[str, Any] | None = None,
        special_tokens: Mapping[str, int | None] | None = None,
        loss_mask: bool = False,
        overwrite: bool = False,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        self.path = Path(path)
        self.vocab_size = int(vocab_size)
        self.token_dtype_name = F.token_dtype_for_vocab(self.vocab_size)
        self.token_dtype = F.TOKEN_DTYPES[self.token_dtype_name]
        self.tokenizer = dict(tokenizer or {"name": "unknown", "hash": None})
        self.tokenizer.setdefault("hash", None)
        if not isinstance(self.tokenizer.get("name"), str):
            raise WriteError(field="tokenizer.name", expected="string", found=repr(self.tokenizer.get("name")))
        if "path" in self.tokenizer:
            raise WriteError(f"tokenizer.path: {self.tokenizer['path']!r} names a file on this host only and readers must not "
                             "open it (spec/FORMAT.md §2.2); leave it out of tokenizer= (decode later with "
                             "`packfmt inspect --show-pack N --tokenizer DIR`)",
                             field="tokenizer.path", expected="absent", found=repr(self.tokenizer["path"]))
        th = self.tokenizer["hash"]
        if th is not None and not (isinstance(th, str) and re.fullmatch(r"sha256:[0-9a-f]{64}", th)):
            raise WriteError(field="tokenizer.hash", expected='null or "sha256:" + 64 hex digits', found=repr(th))
        self.special_tokens = {k: None for k in F.SPECIAL_TOKEN_KEYS}
        for key, value in (special_tokens or {}).items():
            if key not in self.special_tokens:
                raise WriteError(field=f"special_tokens.{key}", expected=f"one of {F.SPECIAL_TOKEN_KEYS}", found=repr(key))
            if value is not None and not 0 <= int(value) < self.vocab_size:
                raise TokenRangeError(field=f"special_tokens.{key}", expected=f"id in [0, {self.vocab_size})", found=value)
            self.special_tokens[key] = None if value is None else int(value)
        self.has_loss_mask = bool(loss_mask)
        self.overwrite = overwrite
        self.extra = dict(extra or {})
        self.build_report: dict | None = None
        remove_stale_temps(self.path)  # first: it may restore a copy an interrupted overwrite had moved aside
        if self.path.exists() and not overwrite:
            from .errors import DatasetExistsError

            raise DatasetExistsError(f"{self.path}: already exists (pass overwrite=True to replace it)",
                                     file=str(self.path), expected="no existing path", found="exists",
                                     cli=f"{self.path}: already exists (pass --overwrite to replace it)")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = temp_sibling(self.path)
        self._files: dict[str, HashedFile] = {}
        self._open(F.TOKENS)
        self._open(F.DOC_OFFSETS).write_array(np.zeros(1), F.OFFSET_DTYPE)
        if self.has_loss_mask:
            self._open(F.LOSS_MASK)
        self.num_documents = 0
        self.num_tokens = 0
        self.num_images = 0
        self._image_bytes = 0
        self._image_files_open = False
        self._closed = False

    # ------------------------------------------------------------------ appending
    def _open(self, name: str) -> HashedFile:
        f = HashedFile(self._tmp / name)
        self._files[name] = f
        return f

    def _open_image_files(self) -> None:
        """Image files are created on the first image; earlier documents get zero images."""
        self._open(F.IMAGE_BLOBS)
        self._open(F.IMAGE_OFFSETS).write_array(np.zeros(1), F.OFFSET_DTYPE)
        self._open(F.IMAGE_META)
        self._open(F.IMAGE_TOKEN_SPANS)
        f = self._open(F.DOC_IMAGE_OFFSETS)
        remaining = self.num_documents + 1
        while remaining:  # earlier documents have zero images; bounded chunks keep memory flat
            n = min(remaining, 1 << 20)
            f.write_array(np.zeros(n), F.OFFSET_DTYPE)
            remaining -= n
        self._image_files_open = True

    def add_document(
        self,
        tokens: Sequence[int] | np.ndarray,
        loss_mask: Sequence[int] | np.ndarray | None = None,
        images: Iterable[ImageRecord] | None = None,
    ) -> int:
        """Append one document; return its index. Raises before writing anything invalid."""
        self._check_open()
        doc = self.num_documents
        arr = np.asarray(tokens)
        if arr.ndim != 1 or arr.size == 0:
            raise WriteError(f"document {doc}: tokens: expected a non-empty 1-D sequence, found shape {arr.shape}",
                             field="tokens", expected="non-empty 1-D", found=arr.shape)
        if arr.dtype.kind not in "iu":
            if arr.dtype.kind == "b" or not np.all(np.equal(np.mod(arr, 1), 0)):
                raise WriteError(field=f"document {doc}: tokens dtype", expected="integers", found=str(arr.dtype))
            arr = arr.astype(np.int64)
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi >= self.vocab_size:
            bad = int(np.flatnonzero((arr < 0) | (arr >= self.vocab_size))[0])
            raise TokenRangeError(
                f"document {doc}, token {bad}: expected id in [0, {self.vocab_size}) (vocab_size), found {int(arr[bad])}; "
                f"refusing to wrap it into {self.token_dtype_name}",
                field=f"document {doc} token {bad}", expected=f"[0, {self.vocab_size})", found=int(arr[bad]))
        mask = None
        if self.has_loss_mask:
            if loss_mask is None:
                raise WriteError(field=f"document {doc}: loss_mask", expected="a mask (writer has loss_mask=True)", found="None")
            mask = np.asarray(loss_mask)
            if mask.shape != arr.shape:
                raise WriteError(field=f"document {doc}: loss_mask shape", expected=arr.shape, found=mask.shape)
            if not np.all((mask == 0) | (mask == 1)):
                raise WriteError(field=f"document {doc}: loss_mask values", expected="0 or 1", found=f"[{mask.min()}, {mask.max()}]")
        elif loss_mask is not None:
            raise WriteError(field=f"document {doc}: loss_mask", expected="None (writer created with loss_mask=False)", found="a mask")
        image_list = list(images) if images is not None else []
        self._check_images(doc, image_list, arr.size)
        # All checks passed: write.
        self._files[F.TOKENS].write_array(arr, self.token_dtype)
        if mask is not None:
            self._files[F.LOSS_MASK].write_array(mask, F.MASK_DTYPE)
        if image_list and not self._image_files_open:
            self._open_image_files()
        if self._image_files_open:
            for img in image_list:
                self._files[F.IMAGE_BLOBS].write(img.data)
                self._image_bytes += len(img.data)
                self._files[F.IMAGE_OFFSETS].write_array(np.array([self._image_bytes]), F.OFFSET_DTYPE)
                self._files[F.IMAGE_META].write_array(
                    np.array([img.width, img.height, F.CODEC_IDS[img.codec]]), F.IMAGE_META_DTYPE)
                self._files[F.IMAGE_TOKEN_SPANS].write_array(
                    np.array([self.num_tokens + img.token_begin, self.num_tokens + img.token_end]), F.OFFSET_DTYPE)
            self.num_images += len(image_list)
            self._files[F.DOC_IMAGE_OFFSETS].write_array(np.array([self.num_images]), F.OFFSET_DTYPE)
        self.num_tokens += arr.size
        self._files[F.DOC_OFFSETS].write_array(np.array([self.num_tokens]), F.OFFSET_DTYPE)
        self.num_documents += 1
        return doc

    def add_documents(
        self,
        tokens: np.ndarray,
        doc_lengths: np.ndarray,
        loss_mask: np.ndarray | None = None,
    ) -> range:
        """Append many image-free documents at once (vectorised checks); return their indices.

        Args:
            tokens: 1-D integer array, the documents' tokens concatenated.
            doc_lengths: 1-D integer array of document lengths (each >= 1), summing to ``len(tokens)``.
            loss_mask: 0/1 array of ``len(tokens)`` (required iff the writer has ``loss_mask=True``).
        """
        self._check_open()
        first = self.num_documents
        toks = np.asarray(tokens)
        lengths = np.asarray(doc_lengths, dtype=np.int64)
        if toks.ndim != 1 or lengths.ndim != 1 or toks.dtype.kind not in "iu":
            raise WriteError(field="add_documents", expected="1-D integer tokens and 1-D lengths",
                             found=f"tokens {toks.dtype} {toks.shape}, lengths {lengths.shape}")
        if lengths.size and lengths.min() < 1:
            bad = int(np.flatnonzero(lengths < 1)[0])
            raise WriteError(field=f"document {first + bad}: length", expected=">= 1", found=int(lengths[bad]))
        if int(lengths.sum()) != toks.size:
            raise WriteError(field="doc_lengths", expected=f"sum == {toks.size} (len(tokens))", found=int(lengths.sum()))
        if toks.size:
            bad_mask = (toks < 0) | (toks >= self.vocab_size)
            if bad_mask.any():
                pos = int(np.flatnonzero(bad_mask)[0])
                doc = first + int(np.searchsorted(np.cumsum(lengths), pos, side="right"))
                raise TokenRangeError(
                    f"document {doc}: expected id in [0, {self.vocab_size}) (vocab_size), found {int(toks[pos])}; "
                    f"refusing to wrap it into {self.token_dtype_name}",
                    field=f"document {doc}", expected=f"[0, {self.vocab_size})", found=int(toks[pos]))
        if self.has_loss_mask != (loss_mask is not None):
            raise WriteError(field="loss_mask", expected="a mask" if self.has_loss_mask else "None", found=type(loss_mask).__name__)
        if loss_mask is not None:
            mask = np.asarray(loss_mask)
            if mask.shape != toks.shape or not np.all((mask == 0) | (mask == 1)):
                raise WriteError(field="loss_mask", expected=f"0/1 values of shape {toks.shape}", found=f"shape {mask.shape}")
            self._files[F.LOSS_MASK].write_array(mask, F.MASK_DTYPE)
        self._files[F.TOKENS].write_array(toks, self.token_dtype)
        ends = self.num_tokens + np.cumsum(lengths)
        self._files[F.DOC_OFFSETS].write_array(ends, F.OFFSET_DTYPE)
        if self._image_files_open:
            self._files[F.DOC_IMAGE_OFFSETS].write_array(np.full(lengths.size, self.num_images), F.OFFSET_DTYPE)
        self.num_tokens += toks.size
        self.num_documents += lengths.size
        return range(first, self.num_documents)

    def _check_images(self, doc: int, images: list[ImageRecord], doc_len: int) -> None:
        prev_end = 0
        for k, img in enumerate(images):
            where = f"document {doc}, image {k}"
            if img.codec not in F.CODEC_IDS:
                raise WriteError(field=f"{where}: codec", expected=f"one of {sorted(F.CODEC_IDS)}", found=repr(img.codec))
            if not (1 <= img.width < 2**32 and 1 <= img.height < 2**32):
                raise WriteError(field=f"{where}: size", expected="width, height in [1, 2^32)", found=(img.width, img.height))
            if img.width * img.height > F.MAX_IMAGE_PIXELS:
                raise WriteError(field=f"{where}: size", expected=f"width x height <= {F.MAX_IMAGE_PIXELS:,} pixels (spec §3.4)",
                                 found=f"{img.width}x{img.height} = {img.width * img.height:,} pixels")
            if not (prev_end <= img.token_begin < img.token_end <= doc_len):
                raise WriteError(field=f"{where}: token span", expected=f"{prev_end} <= begin < end <= {doc_len}, in order, not overlapping",
                                 found=(img.token_begin, img.token_end))
            if len(img.data) == 0:
                raise WriteError(field=f"{where}: data", expected="non-empty encoded bytes", found="0 bytes")
            prev_end = img.token_end

    # ------------------------------------------------------------------ finishing
    def _check_open(self) -> None:
        if self._closed:
            raise WriteError(field="writer", expected="open", found="finalized or aborted")

    def manifest(self) -> dict:
        """The manifest this writer will publish (files filled in at finalize)."""
        obj = {
            "format": F.FORMAT_NAME,
            "format_version": F.FORMAT_VERSION_STR,
            "producer": {"name": "packfmt", "version": __version__},
            "tokenizer": self.tokenizer,
            "vocab_size": self.vocab_size,
            "token_dtype": self.token_dtype_name,
            "special_tokens": self.special_tokens,
            "counts": {"documents": self.num_documents, "tokens": self.num_tokens, "images": self.num_images},
            "loss_mask": self.has_loss_mask,
            "checksum_algorithm": F.CHECKSUM_ALGORITHM,
            "files": {},
        }
        if self.build_report is not None:
            obj["build_report"] = self.build_report
        if self.extra:
            obj["extra"] = self.extra
        return obj

    def finalize(self) -> Path:
        """Close every file, write ``manifest.json`` last, and rename into place atomically."""
        self._check_open()
        if self.num_images == 0 and self._image_files_open:  # cannot happen, kept for clarity
            raise WriteError(field="images", expected="consistent image files", found="opened without images")
        manifest = self.manifest()
        for name, f in sorted(self._files.items()):
            manifest["files"][name] = f.close()
        F.parse_manifest(json.loads(F.canonical_json(manifest)), file=F.MANIFEST)  # self-check before publishing
        with open(self._tmp / F.MANIFEST, "wb") as fh:
            fh.write(F.canonical_json(manifest))
            fh.flush()
            os.fsync(fh.fileno())
        self._closed = True
        try:
            publish_dir(self._tmp, self.path, overwrite=self.overwrite)
        except BaseException:
            shutil.rmtree(self._tmp, ignore_errors=True)
            raise
        return self.path

    def abort(self) -> None:
        """Discard everything written so far; nothing appears at the target."""
        if self._closed:
            return
        for f in self._files.values():
            f.abort()
        shutil.rmtree(self._tmp, ignore_errors=True)
        self._closed = True

    def __enter__(self) -> "DatasetWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.finalize()
        else:
            self.abort()

    def __del__(self) -> None:  # a writer dropped without finalize leaves no half-dataset
        try:
            if not self._closed:
                self.abort()
        except Exception:
            pass
