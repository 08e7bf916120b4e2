"""Physical merge: stores and collections copied into one contiguous store (``packfmt merge --physical``).

Every member file is streamed in bounded chunks (``_io.CHUNK_BYTES``) into hashed files of a
temporary sibling of the target; offset arrays are shifted chunk by chunk by int64 bases, so
memory is O(chunk) whatever the number and size of the members (no per-document Python object,
no member mapped). Each member file's checksum is verified as it streams and its offsets are
checked as they pass (V13-V15, V19), so nothing that breaks a member reaches the merged store.
Pack indexes of a source collection are carried over (``carry.py``); the manifest is written
last and the directory published atomically (spec/COLLECTION.md §7).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from .. import checks
from .. import format as F
from .._io import CHUNK_BYTES, HashedFile, publish_dir, temp_sibling, write_durably
from ..errors import FormatError, WriteError
from ..mapped import check_files_table
from ..reader import Store
from ..report_paths import report_path
from ..version import __version__
from .manifest import is_collection
from .verified_copy import VerifiedReader, bad_offsets, copy_verified
from .writer import check_members_agree, prepare_destination, refuse_laid_out_sources, resolve_members

__all__ = ["merge_physical", "refuse_laid_out_sources"]

#: Offsets (int64) handled per chunk: 8 MiB.
_OFFSET_ROWS = CHUNK_BYTES // 8


@dataclass(frozen=True)
class _Head:
    """A member store known by its manifest only (files listed and sized, nothing mapped)."""

    path: Path
    manifest: F.Manifest
    manifest_bytes: bytes  # what was parsed, and what a collection's recorded checksum is compared with (C3)


def _head(path: str | os.PathLike) -> _Head:
    path = Path(path)
    raw = F.read_json_bytes(path / F.MANIFEST, file=str(path / F.MANIFEST))
    obj = F.parse_json(raw, file=str(path / F.MANIFEST))
    if is_collection(obj):
        raise FormatError(f"{path}: a collection listed as a member of a collection; list its members instead",
                          file=str(path / F.MANIFEST), field="format", expected="'packfmt' (a store)",
                          found="'packfmt-collection'")
    manifest = F.parse_manifest(obj, file=str(path / F.MANIFEST))
    if manifest.version > F.KNOWN_VERSION:  # what it adds (a codec id, a file) has no meaning in the 1.0 store written
        known = "%d.%d" % F.KNOWN_VERSION
        raise WriteError(f"{path / F.MANIFEST}: format_version: a store of format {obj['format_version']}, newer than "
                         f"this packfmt's {known}: a physical merge writes a {F.FORMAT_VERSION_STR} store and cannot "
                         "carry what a newer minor adds (spec/COLLECTION.md §2.2); list it in a collection (`packfmt "
                         "merge` without --physical), or merge with a newer packfmt", file=str(path / F.MANIFEST),
                         field="format_version", expected=f"<= {known}", found=obj["format_version"])
    check_files_table(path, manifest.files, F.expected_layout(manifest), where=f"{path}/")
    return _Head(path, manifest, raw)


def _check_chunk(src: VerifiedReader, rule: str, prev: int, chunk: np.ndarray, *, at: int, strict: bool, top: int,
                 unit: str) -> None:
    """``checks.offsets_chunk`` of one streamed chunk, raised as the member's FormatError."""
    _raise(src, checks.offsets_chunk(chunk, prev=prev, at=at, top=top, rule=rule, file=src.path.name, strict=strict,
                                     unit=unit))


def _raise(src: VerifiedReader, findings: list) -> None:
    for f in findings:
        raise bad_offsets(src.path, f"{f.rule} {f.field}", f.expected, f.found)


class _Merger:
    """The output files and the running int64 bases (tokens, image bytes, images) of the members so far."""

    def __init__(self, tmp: Path, loss_mask: bool, images: bool, on_bytes: Callable[[int], None] | None) -> None:
        names = [F.TOKENS, F.DOC_OFFSETS] + ([F.LOSS_MASK] if loss_mask else [])
        if images:
            names += [F.IMAGE_BLOBS, F.IMAGE_OFFSETS, F.IMAGE_META, F.DOC_IMAGE_OFFSETS, F.IMAGE_TOKEN_SPANS]
        self.out = {name: HashedFile(tmp / name) for name in names}
        for name in (F.DOC_OFFSETS, F.IMAGE_OFFSETS, F.DOC_IMAGE_OFFSETS):
            if name in self.out:
                self.out[name].write_array(np.zeros(1), F.OFFSET_DTYPE)
        self.images = images
        self.tokens = self.blob_bytes = self.num_images = self.copied = 0
        self.bufs = [bytearray(CHUNK_BYTES) for _ in range(3)]
        self._on_bytes = on_bytes

    def tick(self, n: int) -> None:
        self.copied += n
        if self._on_bytes is not None:
            self._on_bytes(n)

    def _copy(self, head: _Head, name: str) -> None:
        copy_verified(VerifiedReader(head.path / name, head.manifest.files[name]), self.out[name], self.bufs[0], self.tick)

    def add(self, head: _Head) -> None:
        """Append one member: its bytes copied, its offsets shifted by the bases, then the bases advanced."""
        m = head.manifest
        self._copy(head, F.TOKENS)
        if F.LOSS_MASK in self.out:
            if m.has_loss_mask:
                self._copy(head, F.LOSS_MASK)
            else:
                self._ones(m.num_tokens)
        if m.num_images:
            self._copy(head, F.IMAGE_BLOBS)
            self._copy(head, F.IMAGE_META)
            self._image_offsets(head)
        self._documents(head)
        self.tokens += m.num_tokens
        if m.num_images:
            self.blob_bytes += m.files[F.IMAGE_BLOBS].bytes
            self.num_images += m.num_images

    def _ones(self, n: int) -> None:
        """A member without a loss mask, in a merge with one: ``n`` ones, written a chunk at a time (§7.1)."""
        ones = np.ones(min(n, CHUNK_BYTES), dtype=F.MASK_DTYPE)
        while n:
            k = min(n, ones.shape[0])
            self.out[F.LOSS_MASK].write_array(ones[:k], F.MASK_DTYPE)
            n -= k
            self.tick(k)

    def _image_offsets(self, head: _Head) -> None:
        """V14, chunk by chunk: 0, strictly increasing, ending at the blob size; shifted by the bytes before."""
        m = head.manifest
        src, blobs = VerifiedReader(head.path / F.IMAGE_OFFSETS, m.files[F.IMAGE_OFFSETS]), m.files[F.IMAGE_BLOBS].bytes
        prev = int(src.array(self.bufs[0], 1)[0])
        if prev != 0:
            raise bad_offsets(src.path, "V14 [0]", 0, prev)
        left = m.num_images
        while left:
            n = min(left, _OFFSET_ROWS)
            chunk = src.array(self.bufs[0], n)
            _check_chunk(src, "V14", prev, chunk, at=m.num_images + 1 - left, strict=True, top=blobs,
                         unit="every image has >= 1 byte")
            self.out[F.IMAGE_OFFSETS].write_array(chunk + self.blob_bytes, F.OFFSET_DTYPE)
            prev, left = int(chunk[-1]), left - n
            self.tick(8 * n)
        if prev != blobs:
            raise bad_offsets(src.path, "V14 last", f"{blobs} (size of {F.IMAGE_BLOBS})", prev)
        src.close()

    def _documents(self, head: _Head) -> None:
        """doc_offsets (V13) and, with images, doc_image_offsets (V15) and image_token_spans (V19) in lockstep."""
        m = head.manifest
        do = VerifiedReader(head.path / F.DOC_OFFSETS, m.files[F.DOC_OFFSETS])
        dio = VerifiedReader(head.path / F.DOC_IMAGE_OFFSETS, m.files[F.DOC_IMAGE_OFFSETS]) if m.num_images else None
        spans = VerifiedReader(head.path / F.IMAGE_TOKEN_SPANS, m.files[F.IMAGE_TOKEN_SPANS]) if m.num_images else None
        prev_do = int(do.array(self.bufs[0], 1)[0])
        if prev_do != 0:
            raise bad_offsets(do.path, "V13 [0]", 0, prev_do)
        prev_dio = int(dio.array(self.bufs[1], 1)[0]) if dio else 0
        if prev_dio != 0:
            raise bad_offsets(dio.path, "V15 [0]", 0, prev_dio)
        left = m.num_documents
        while left:
            n = min(left, _OFFSET_ROWS)
            ends, at = do.array(self.bufs[0], n), m.num_documents + 1 - left
            _check_chunk(do, "V13", prev_do, ends, at=at, strict=True, top=m.num_tokens,
                         unit="every document has >= 1 token")
            self.out[F.DOC_OFFSETS].write_array(ends + self.tokens, F.OFFSET_DTYPE)
            if dio is not None:
                img_ends = dio.array(self.bufs[1], n)
                _check_chunk(dio, "V15", prev_dio, img_ends, at=at, strict=False, top=m.num_images,
                             unit="images per document")
                self.out[F.DOC_IMAGE_OFFSETS].write_array(img_ends + self.num_images, F.OFFSET_DTYPE)
                self._spans(spans, np.concatenate(([prev_do], ends)), np.concatenate(([prev_dio], img_ends)), at - 1)
                prev_dio = int(img_ends[-1])
            elif self.images:  # a member without images: its documents have none
                self.out[F.DOC_IMAGE_OFFSETS].write_array(np.full(n, self.num_images), F.OFFSET_DTYPE)
            prev_do, left = int(ends[-1]), left - n
            self.tick(8 * n)
        if prev_do != m.num_tokens:
            raise bad_offsets(do.path, "V13 last", f"{m.num_tokens} (counts.tokens)", prev_do)
        if dio is not None and prev_dio != m.num_images:
            raise bad_offsets(dio.path, "V15 last", f"{m.num_images} (counts.images)", prev_dio)
        for src in (do, dio, spans):
            if src is not None:
                src.close()

    def _spans(self, src: VerifiedReader, doc_off: np.ndarray, img_off: np.ndarray, first_doc: int) -> None:
        """V19 for the images of one chunk of documents (the first is ``first_doc``), read in bounded sub-chunks of rows."""
        first, stop, step = int(img_off[0]), int(img_off[-1]), _OFFSET_ROWS // 2
        last_doc, last_end = -1, 0  # the previous image (none: a chunk of documents starts a new document)
        for a in range(first, stop, step):
            k = min(step, stop - a)
            rows = src.array(self.bufs[2], 2 * k).reshape(k, 2)
            doc = np.searchsorted(img_off, np.arange(a, a + k), side="right") - 1
            _raise(src, checks.image_span_rows(rows, doc, doc_off, file=src.path.name, at=a,
                                               prev=(last_doc, last_end), doc_base=first_doc))
            self.out[F.IMAGE_TOKEN_SPANS].write_array(rows + self.tokens, F.OFFSET_DTYPE)
            last_doc, last_end = int(doc[-1]), int(rows[-1, 1])
            self.tick(16 * k)

    def close(self) -> dict:
        return {name: f.close() for name, f in sorted(self.out.items())}

    def abort(self) -> None:
        for f in self.out.values():
            f.abort()


def _normalize(sources: Iterable) -> list[tuple[str | None, Path]]:
    out = []
    for s in sources:
        name, path = s if isinstance(s, tuple) else (None, s)
        out.append((name, Path(path)))
    return out


def merge_physical(sources: Iterable, dst: str | os.PathLike, *, overwrite: bool = False,
                   on_bytes: Callable[[int], None] | None = None, storage_options: dict | None = None) -> Store:
    """Write the stores of ``sources`` (stores and collections, in order) as one contiguous store at ``dst``.

    Args:
        sources: paths, or ``(name, path)`` pairs as ``write_collection`` takes them.
        overwrite: replace ``dst`` if it exists (atomically, at the end).
        on_bytes: called with the number of bytes after each chunk streamed (progress).

    The result's binary files equal those a single ``DatasetWriter`` would write from the members'
    documents in order; its manifest equals that writer's except ``build_report``, which lists the
    members and the pack indexes carried (spec/COLLECTION.md §7). Memory is O(chunk): independent
    of the number and size of the members. Returns the new store, opened.
    """
    from ..storage import is_url
    from .carry import carry_indexes

    sources = [s if isinstance(s, tuple) else (None, s) for s in sources]
    if is_url(str(dst)) or any(is_url(str(p)) for _, p in sources):  # object storage: packfmt.storage
        from ..opening import open_dataset
        from ..remote.merge import merge_remote

        refuse_laid_out_sources(sources, storage_options)  # from the manifests, before any source is fetched (§9.2)
        done = merge_remote(lambda s, d, **kw: merge_physical(s, d, **kw), sources, dst, overwrite=overwrite,
                            physical=True, storage_options=storage_options, on_bytes=on_bytes)
        return done if done is not None else open_dataset(str(dst), storage_options=storage_options)
    t0 = time.perf_counter()
    dst = Path(dst)
    pairs = _normalize(sources)
    refuse_laid_out_sources(pairs)  # its lookahead tokens would read as inputs in the merged store (§9.2)
    members = resolve_members(pairs, opener=_head)
    shared, _ = check_members_agree(members, unique_names=False)
    prepare_destination(dst, overwrite)
    first = _head(members[0][1]).manifest
    tmp = temp_sibling(dst)
    merger = _Merger(tmp, shared["loss_mask"], any(m.images for m, _, _ in members), on_bytes)
    try:
        extra, same_extra = first.raw.get("extra"), True
        for _, path, _ in members:  # one member's manifest in memory at a time
            head = _head(path)
            merger.add(head)
            same_extra = same_extra and head.manifest.raw.get("extra") == extra
        files = merger.close()
        binding = {F.TOKENS: files[F.TOKENS]["checksum"], F.DOC_OFFSETS: files[F.DOC_OFFSETS]["checksum"]}
        carried, not_carried = carry_indexes(pairs, tmp, binding, merger.bufs[0], merger.tick)
        manifest = {
            "format": F.FORMAT_NAME, "format_version": F.FORMAT_VERSION_STR,
            "producer": {"name": "packfmt", "version": __version__},
            "tokenizer": first.tokenizer, "vocab_size": first.vocab_size, "token_dtype": first.token_dtype,
            "special_tokens": shared["special_tokens"],
            "counts": {"documents": sum(m.documents for m, _, _ in members), "tokens": merger.tokens,
                       "images": merger.num_images},
            "loss_mask": shared["loss_mask"], "checksum_algorithm": F.CHECKSUM_ALGORITHM, "files": files,
            "build_report": {
                "source": "merge --physical",
                "members": [{**m.to_json(), "path": report_path(m.path, dst)} for m, _, _ in members],  # A15
                "pack_indexes": {"carried": carried, "not_carried": not_carried},
                "bytes_copied": merger.copied,
                "seconds": round(time.perf_counter() - t0, 3),
            },
        }
        if extra and same_extra:  # free-form metadata every member agrees on stays; otherwise it is left out
            manifest["extra"] = extra
        F.parse_manifest(json.loads(F.canonical_json(manifest)), file=F.MANIFEST)  # self-check before publishing
        write_durably(tmp / F.MANIFEST, F.canonical_json(manifest))
        publish_dir(tmp, dst, overwrite=overwrite)
    except BaseException:
        merger.abort()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Store(dst)
