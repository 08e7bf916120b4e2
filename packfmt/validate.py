"""Check a dataset directory (and its pack indexes) against spec/: ``packfmt validate``.

Two levels:

* **structural** (default): the manifest parses; every listed file exists with its recorded size
  and the size the counts imply; offsets arrays start at 0, end at the right total and are
  monotonic (read in bounded chunks, the only data read); each pack index's ``index.json``
  parses, matches the token store's checksums and lists correctly sized files. Reads no token.
* **deep** (``deep=True``): also every file's xxh3_64 checksum, token ids < vocab_size, loss
  mask values in {0, 1}, image metadata and token spans, and for each pack index the segments
  (inside their documents, packs within capacity and parameters, every document covered as the
  recorded ``oversize`` policy says), the stats in ``index.json``, and materialized tokens.

Every finding is collected (validation does not stop at the first, except when the manifest
itself is unreadable) as a :class:`Problem` naming the file, the field, what was expected and
what was found::

    report = validate("data/ds", deep=True)
    if not report.ok:
        print(report.format())
"""

from __future__ import annotations

import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

from . import checks
from . import format as F
from ._io import checksum_file
from .errors import PackfmtError, UnsupportedVersionError

__all__ = ["Problem", "Report", "validate", "ERROR", "WARNING"]

ERROR, WARNING = "error", "warning"
#: Elements per chunk when scanning offsets / tokens (bounded memory whatever the file size).
CHUNK_ELEMS = 1 << 22
#: Show a progress bar (when asked for) only if the deep pass reads more than this many bytes.
PROGRESS_MIN_BYTES = 256 << 20
#: At most this many individual documents / packs are listed in one message.
MAX_LISTED = 5


@dataclass(frozen=True)
class Problem:
    """One finding. ``file`` is relative to the dataset directory (``packs/<name>/segments.bin``)."""

    file: str
    field: str | None
    expected: str | None
    found: str | None
    message: str
    severity: str = ERROR

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return self.message


@dataclass
class Report:
    """Everything ``validate`` found. ``ok`` is True when there is no error (warnings allowed)."""

    path: str
    deep: bool
    problems: list[Problem] = field(default_factory=list)
    checked: dict = field(default_factory=dict)  # what was looked at: counts, index names, bytes hashed

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == ERROR]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == WARNING]

    @property
    def ok(self) -> bool:
        return not self.errors

    def to_dict(self) -> dict:
        return {"path": self.path, "deep": self.deep, "ok": self.ok, "errors": len(self.errors),
                "warnings": len(self.warnings), "checked": self.checked,
                "problems": [p.to_dict() for p in self.problems]}

    def format(self) -> str:
        """Human report: one line per problem, then a verdict line."""
        level = "deep" if self.deep else "structural"
        lines = [f"{p.severity.upper():7s} {p.message}" for p in self.problems]
        if self.ok:
            what = ", ".join(f"{k.replace('_', ' ')} {v:,}" if isinstance(v, int) else f"{k.replace('_', ' ')} {v}"
                             for k, v in self.checked.items() if k in ("members", "documents", "tokens", "images", "pack_indexes"))
            lines.append(f"OK: {self.path} is a valid packfmt dataset ({level} check; {what})"
                         + (f", {len(self.warnings)} warning(s)" if self.warnings else ""))
        else:
            lines.append(f"INVALID: {self.path}: {len(self.errors)} error(s), {len(self.warnings)} warning(s) ({level} check)")
        return "\n".join(lines)


class _Collector:
    """Accumulates problems with one uniform message shape: ``file: field: expected X, found Y``."""

    def __init__(self, report: Report) -> None:
        self.report = report

    def add(self, file: str, field: str | None, expected=None, found=None, detail: str | None = None,
            severity: str = ERROR) -> None:
        where = ": ".join(str(x) for x in (file, field) if x)
        if detail is not None:
            message = f"{where}: {detail}"
        else:
            message = f"{where}: expected {expected}, found {found}"
        self.report.problems.append(Problem(file, field, None if expected is None else str(expected),
                                            None if found is None else str(found), message, severity))

    def findings(self, found: list[checks.Finding]) -> bool:
        """Add the findings of ``packfmt.checks``; True when there were none."""
        for f in found:
            self.add(f.file, f.field, f.expected, f.found)
        return not found

    def from_error(self, exc: PackfmtError, default_file: str) -> None:
        file = exc.file or default_file
        message = str(exc)
        if not message.startswith(file):
            message = f"{file}: {message}"
        self.report.problems.append(Problem(file, exc.field, None if exc.expected is None else str(exc.expected),
                                            None if exc.found is None else str(exc.found), message, ERROR))


# ----------------------------------------------------------------------------- entry point
def validate(path: str | os.PathLike, deep: bool = False, progress: bool = False, decode_images: bool = True,
             *, storage_options: dict | None = None) -> Report:
    """Validate the dataset at ``path``; return a :class:`Report` with every problem found.

    Args:
        path: dataset directory.
        deep: also read every byte (checksums, token range, mask values, pack coverage).
        progress: show tqdm progress bars on stderr for a deep pass over more than 256 MiB.
        decode_images: with ``deep``, decode every image and compare its size with image_meta (V20);
            the one deep check whose cost grows with pixels rather than bytes.
    """
    from .storage import is_remote, local_file

    if is_remote(path):  # fetched whole into the cache; a file that fails the cache's check is reported, not served
        from .errors import PackfmtError
        from .storage import fetch_dataset

        try:
            fetched = fetch_dataset(path, storage_options)
        except PackfmtError as exc:
            report = Report(str(path), deep)
            where, msg = exc.file or str(path), str(exc)
            _Collector(report).add(where, None, detail=msg.removeprefix(f"{where}: "))
            return report
        report = validate(fetched.path, deep=deep, progress=progress, decode_images=decode_images)
        report.path = str(path)
        return report
    root = Path(local_file(path))
    report = Report(str(root), deep)
    out = _Collector(report)
    if not root.is_dir():
        found = "missing" if not root.exists() else "a file"
        out.add(str(root), None, detail=f"not a packfmt dataset: expected a directory with {F.MANIFEST}, found {found}")
        return report
    if _is_collection(root):  # spec/COLLECTION.md §3: C1-C5, each member as a store
        from .collection.validate import validate_collection

        return validate_collection(root, report, deep=deep, progress=progress, decode_images=decode_images)
    manifest = _load_manifest(root, out)
    if manifest is None:
        return report
    report.checked.update(documents=manifest.num_documents, tokens=manifest.num_tokens, images=manifest.num_images)
    ds = _DatasetChecks(root, manifest, out)
    ds.decode_images = decode_images
    ds.structural()
    indexes = [_IndexChecks(ds, name) for name in _index_dirs(root, out)]
    for ix in indexes:
        ix.structural()
    report.checked["pack_indexes"] = len(indexes)
    if deep:
        bar = _progress_bar(ds, indexes, progress)
        try:
            ds.deep(bar)
            for ix in indexes:
                ix.deep(bar)
        finally:
            if bar is not None:
                bar.close()
    return report


def _is_collection(root: Path) -> bool:
    from .collection.manifest import is_collection

    try:
        return is_collection(F.read_json(root / F.MANIFEST, file=F.MANIFEST))
    except PackfmtError:
        return False  # _load_manifest reports it


def _load_manifest(root: Path, out: _Collector) -> F.Manifest | None:
    try:
        obj = F.read_json(root / F.MANIFEST, file=F.MANIFEST)
        manifest = F.parse_manifest(obj, file=F.MANIFEST)
    except UnsupportedVersionError as exc:
        _version_problem(exc, out, F.MANIFEST)
        return None
    except PackfmtError as exc:
        out.from_error(exc, F.MANIFEST)
        return None
    _minor_version_note(manifest.version, F.MANIFEST, out)
    return manifest


def _version_problem(exc: UnsupportedVersionError, out: _Collector, file: str) -> None:
    """A clear message for a newer (or older) major version; other format mismatches as they are."""
    if exc.field == "format_version" and isinstance(exc.found, str):
        major = int(exc.found.split(".")[0])
        if major > F.FORMAT_VERSION[0]:
            out.add(file, "format_version", f"{F.FORMAT_VERSION[0]}.x", exc.found,
                    detail=f"written by a newer major version of the format ({exc.found}); this packfmt reads "
                           f"{F.FORMAT_VERSION[0]}.x. Upgrade packfmt to read it.")
            return
    out.from_error(exc, file)


def _minor_version_note(version: tuple[int, int], file: str, out: _Collector) -> None:
    if version > F.KNOWN_VERSION:
        out.add(file, "format_version", severity=WARNING,
                detail=f"newer minor version {version[0]}.{version[1]} (this packfmt knows {F.KNOWN_VERSION[0]}."
                       f"{F.KNOWN_VERSION[1]}); "
                       "readable, fields added since are not checked")


def _index_dirs(root: Path, out: _Collector) -> list[str]:
    """Names of pack index directories; stale temp dirs and strays are warnings."""
    packs = root / F.PACKS_DIR
    if not packs.exists():
        return []
    if not packs.is_dir():
        out.add(F.PACKS_DIR, None, detail="expected a directory of pack indexes, found a file")
        return []
    names = []
    for p in sorted(packs.iterdir()):
        label = f"{F.PACKS_DIR}/{p.name}"
        if p.name.startswith("."):
            if ".packfmt-tmp-" in p.name or ".packfmt-old-" in p.name:
                out.add(label, None, severity=WARNING, detail=_leftover_detail(packs, p.name))
            else:
                out.add(label, None, severity=WARNING, detail="unknown hidden entry in packs/")
            continue
        if not p.is_dir() or not (p / F.PACK_INDEX_JSON).exists():
            out.add(label, None, severity=WARNING, detail=f"not a pack index (no {F.PACK_INDEX_JSON}); ignored by readers")
            continue
        names.append(p.name)
    return names


def _leftover_detail(packs: Path, entry: str) -> str:
    """What a ``.NAME.packfmt-tmp-*`` / ``.NAME.packfmt-old-*`` dir is and what removes it (see _io.remove_stale_temps)."""
    name = entry[1:].split(".packfmt-")[0]
    rerun = f"the next `packfmt pack --name {name}` on this dataset"
    if ".packfmt-tmp-" in entry:
        return (f"temporary directory of a pack build of {name!r} that is running or was interrupted; nothing reads "
                f"it; {rerun} removes it once its process has exited (or delete it)")
    if (packs / name / F.PACK_INDEX_JSON).is_file():
        return (f"previous copy of pack index {name!r}, left by an interrupted --overwrite; packs/{name} is in place, "
                f"so {rerun} deletes it (or delete it)")
    return (f"previous copy of pack index {name!r}, left by an interrupted --overwrite before the new copy was in "
            f"place; packs/{name} is missing: {rerun} restores it as packs/{name} (or rename it back yourself)")


# ----------------------------------------------------------------------------- chunked helpers
def _chunks(n: int, size: int = CHUNK_ELEMS) -> Iterator[tuple[int, int]]:
    for start in range(0, n, size):
        yield start, min(n, start + size)


def _map_file(path: Path, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    if F.nbytes_of(dtype, shape) == 0:
        return np.empty(shape, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=shape)


def _check_offsets(out: _Collector, file: str, arr: np.ndarray, *, rule: str, last: int, last_what: str, strict: bool,
                   unit: str) -> bool:
    """Offsets array (``packfmt.checks.offsets``): findings go to ``out``; True when all hold."""
    return out.findings(checks.offsets(arr, rule=rule, file=file, last=last, last_what=last_what, strict=strict, unit=unit))


_listed = checks.listed


def _distinct(ids: np.ndarray, n: int) -> np.ndarray:
    """Sorted distinct values of ``ids`` (each in ``[0, n)``), in O(len(ids) + n) (no sort, no hash)."""
    seen = np.zeros(n, dtype=bool)
    seen[ids] = True
    return np.flatnonzero(seen)


def _progress_bar(ds: "_DatasetChecks", indexes: list["_IndexChecks"], progress: bool):
    total = ds.deep_bytes() + sum(ix.deep_bytes() for ix in indexes)
    if not progress or total < PROGRESS_MIN_BYTES:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc="validate --deep", file=None,
                dynamic_ncols=True, leave=False)


def _hash(path: Path, bar) -> str:
    """xxh3_64 of a file, advancing the progress bar (if any) as bytes are read."""
    return checksum_file(path, on_bytes=None if bar is None else bar.update)


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
    def structural(self) -> None:
        self._files_table()  # V9 (the "only if" half), V10, V11
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
        from .images import DEFAULT_MAX_PIXELS, decode_image

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


# ----------------------------------------------------------------------------- pack indexes
class _IndexChecks:
    """Checks of one ``packs/<name>/`` directory against its ``index.json`` and the token store."""

    def __init__(self, ds: _DatasetChecks, name: str) -> None:
        self.ds, self.name, self.out = ds, name, ds.out
        self.dir = ds.root / F.PACKS_DIR / name
        self.label = f"{F.PACKS_DIR}/{name}/"
        self.pm: F.PackIndexManifest | None = None
        self.layout: dict = {}
        self.sizes_ok: dict[str, bool] = {}
        self.offsets_ok = False
        self.segments_ok = False  # V27 and V29 hold (structural)

    def file(self, name: str) -> str:
        return self.label + name

    # -- structural
    def structural(self) -> None:
        json_label = self.file(F.PACK_INDEX_JSON)
        try:
            self.pm = F.parse_pack_index_manifest(F.read_json(self.dir / F.PACK_INDEX_JSON, file=json_label), file=json_label)
        except UnsupportedVersionError as exc:
            _version_problem(exc, self.out, json_label)
            return
        except PackfmtError as exc:
            self.out.from_error(exc, json_label)
            return
        _minor_version_note(self.pm.version, json_label, self.out)
        if self.pm.name != self.name:  # V22 (the rest of V21/V22: format.parse_pack_index_manifest)
            self.out.add(json_label, "name", repr(self.name) + " (its directory name)", repr(self.pm.name))
        m = self.ds.m
        self._binding(json_label)  # V23 (a collection's index: COLLECTION C5)
        n_packed = self.pm.raw.get("counts", {}).get("packed_tokens")
        if self.pm.materialized and not (isinstance(n_packed, int) and n_packed >= 0):
            self.out.add(json_label, "counts.packed_tokens", "an integer >= 0 (materialized index)", repr(n_packed))
            n_packed = None
        self.layout = F.pack_index_layout(self.pm, m.np_token_dtype, m.has_loss_mask, n_packed)
        for fname, entry in sorted(self.pm.files.items()):  # V24
            source = "counts.packs" if fname in (F.PACK_OFFSETS, F.PACK_TOKEN_OFFSETS) else (
                "counts.segments" if fname == F.SEGMENTS else "counts.packed_tokens")
            self.sizes_ok[fname] = _check_file_size(self.out, self.dir / fname, self.file(fname), entry,
                                                    self.layout.get(fname), f"{source}={self.pm.raw['counts'].get(source.split('.')[1])}")
        for fname in self.layout:
            if fname not in self.pm.files:
                self.sizes_ok[fname] = False
                self.out.add(json_label, f"files.{fname}", "an entry", "missing")
        for fname in sorted(set(self.pm.files) - set(self.layout)):
            if fname == F.PACKED_LOSS_MASK and self.pm.materialized and not m.has_loss_mask:
                self.out.add(json_label, f"files.{fname}", "absent (the dataset has no loss mask)", "listed")
            elif fname in (F.PACK_TOKEN_OFFSETS, F.PACKED_TOKENS, F.PACKED_LOSS_MASK) and not self.pm.materialized:
                self.out.add(json_label, "materialized", f"true (files lists {fname})", "false")
            elif fname not in (F.PACKED_TOKENS, F.PACKED_LOSS_MASK):
                self.out.add(self.file(fname), None, severity=WARNING,
                             detail="listed in index.json but not a file of a pack index; readers ignore it")
        known = set(self.pm.files) | {F.PACK_INDEX_JSON}
        for p in sorted(self.dir.iterdir()):
            if p.name not in known:
                self.out.add(self.file(p.name), None, severity=WARNING, detail="unknown file, not listed in index.json")
        self._offsets(n_packed)  # V25

    def _binding(self, json_label: str) -> None:
        want, have = self.ds.binding(), self.pm.binding
        if set(want) != set(have):
            self.out.add(json_label, sorted(have)[0], f"{sorted(want)[0]!r} (this index must bind to "
                         f"{'a collection' if 'collection' in want else 'a single store'})",
                         f"{sorted(have)[0]!r} (built for {'a collection' if 'collection' in have else 'a store'}; "
                         "pack it again here)")
            return
        if "collection" in want:
            if have["collection"] != want["collection"]:
                self.out.add(json_label, "collection", f"{want['collection']} (manifest.json: the member list this "
                             "index must describe)", f"{have['collection']} (built for another member list? pack it again)")
            return
        for key, expected in want["dataset"].items():
            if have["dataset"][key] != expected:
                self.out.add(json_label, f"dataset.{key}", f"{expected} (manifest.json: the token store "
                             "this index must describe)", f"{have['dataset'][key]} (built for another token store?)")

    def array(self, fname: str) -> np.ndarray | None:
        if not self.sizes_ok.get(fname) or fname not in self.layout:
            return None
        dtype, shape = self.layout[fname]
        return _map_file(self.dir / fname, dtype, shape)

    def _offsets(self, n_packed: int | None) -> None:
        po = self.array(F.PACK_OFFSETS)
        if po is not None:
            self.offsets_ok = _check_offsets(self.out, self.file(F.PACK_OFFSETS), po, rule="V25",
                                             last=self.pm.num_segments, last_what="counts.segments", strict=True,
                                             unit="every pack has >= 1 segment")
        pto = self.array(F.PACK_TOKEN_OFFSETS)
        pto_ok = pto is not None and n_packed is not None and _check_offsets(
            self.out, self.file(F.PACK_TOKEN_OFFSETS), pto, rule="V25", last=n_packed,
            last_what="counts.packed_tokens", strict=False, unit="tokens per pack")
        self._segments(pto if pto_ok else None)

    def _segments(self, pto: np.ndarray | None) -> None:
        """V27, V29: what the reader checks when it opens the index."""
        segs, po, off = self.array(F.SEGMENTS), self.array(F.PACK_OFFSETS), self.ds.array(F.DOC_OFFSETS)
        if segs is None or po is None or off is None or not (self.offsets_ok and self.ds.doc_offsets_ok):
            return
        found, lengths = checks.segments(segs, off, po, file=self.file(F.SEGMENTS))
        if not self.out.findings(found):
            return
        found = checks.packs(lengths, self.pm.capacity, self.pm.raw["counts"]["packed_tokens"],
                             file=self.file(F.SEGMENTS), pack_token_offsets=pto,
                             pto_file=self.file(F.PACK_TOKEN_OFFSETS))
        self.segments_ok = self.out.findings(found)

    # -- deep
    def deep_bytes(self) -> int:
        if self.pm is None:
            return 0
        return sum(e.bytes for e in self.pm.files.values())

    def deep(self, bar) -> None:
        if self.pm is None:
            return
        for fname, entry in sorted(self.pm.files.items()):
            _check_checksum(self.out, self.dir / fname, self.file(fname), entry, bar)  # V26
        if not self.segments_ok:
            return  # reported structurally
        segs, po = np.asarray(self.array(F.SEGMENTS)), np.asarray(self.array(F.PACK_OFFSETS))
        seg_len = segs[:, 2] - segs[:, 1]
        self._max_docs(po)  # V30 (segments)
        off = np.asarray(self.ds.array(F.DOC_OFFSETS))
        doc_len = np.diff(off)
        self._images_per_pack(segs, po, off)  # V28, V30 (images)
        length = doc_len[segs[:, 0]]  # every segment lies inside its document (V27, structural)
        per_doc = np.bincount(segs[:, 0], minlength=doc_len.shape[0])  # segments of each document
        self._coverage_and_stats(segs, po, seg_len, length, doc_len, per_doc)  # V31, V33
        if self.pm.materialized:
            self._materialized(segs, po, seg_len, off, bar)  # V32

    def _max_docs(self, po) -> None:
        """V30: each pack holds at most ``params.max_docs_per_pack`` segments."""
        per_pack = np.diff(po)
        max_docs = self.pm.params.get("max_docs_per_pack")
        if isinstance(max_docs, int) and per_pack.size and int(per_pack.max()) > max_docs:
            bad = np.flatnonzero(per_pack > max_docs)
            self.out.add(self.file(F.PACK_OFFSETS), "params.max_docs_per_pack", f"<= {max_docs} segments per pack",
                         f"{int(per_pack[bad[0]])} in pack {int(bad[0])} ({bad.size} pack(s): {_listed(bad)})")

    def _images_per_pack(self, segs, po, off) -> None:
        """Images inside each segment (by their global token spans); no segment cuts through an image."""
        if self.ds.m.num_images == 0 or not self.ds.spans_ok:
            return
        spans = np.asarray(self.ds.array(F.IMAGE_TOKEN_SPANS))
        g_begin = off[segs[:, 0]] + segs[:, 1]
        g_end = off[segs[:, 0]] + segs[:, 2]
        # spans are sorted and disjoint, so ends are sorted too: count by binary search
        starts_before_begin = np.searchsorted(spans[:, 0], g_begin, side="left")
        ends_by_begin = np.searchsorted(spans[:, 1], g_begin, side="right")
        starts_before_end = np.searchsorted(spans[:, 0], g_end, side="left")
        ends_by_end = np.searchsorted(spans[:, 1], g_end, side="right")
        straddling = (starts_before_begin - ends_by_begin) + (starts_before_end - ends_by_end)
        n_starting = starts_before_end - starts_before_begin  # images that start inside the segment
        cut = np.flatnonzero(straddling > 0)
        if cut.size:
            k = int(cut[0])
            self.out.add(self.file(F.SEGMENTS), f"[{k}]", "segment boundaries outside image token spans",
                         f"segment (doc {int(segs[k, 0])}, [{int(segs[k, 1])}, {int(segs[k, 2])})) cuts through an image "
                         f"({cut.size} segment(s): {_listed(cut)})")
        max_images = self.pm.params.get("max_images_per_pack")
        if isinstance(max_images, int):
            cum = np.concatenate([[0], np.cumsum(n_starting)])
            per_pack = cum[po[1:]] - cum[po[:-1]]
            bad = np.flatnonzero(per_pack > max_images)
            if bad.size:
                self.out.add(self.file(F.SEGMENTS), "params.max_images_per_pack", f"<= {max_images} images per pack",
                             f"{int(per_pack[bad[0]])} in pack {int(bad[0])} ({bad.size} pack(s): {_listed(bad)})")

    def _coverage_and_stats(self, segs, po, seg_len, length, doc_len, per_doc) -> None:
        """V31 and V33 (a collection's index with a mixture checks them per round, see collection.validate)."""
        self._coverage(segs, length, doc_len, per_doc)  # V31
        self._stats(segs, po, seg_len, doc_len, per_doc)  # V33

    def _coverage(self, segs: np.ndarray, length: np.ndarray, doc_len: np.ndarray, per_doc: np.ndarray,
                  wanted: np.ndarray | None = None, where: str = "") -> None:
        """Every document covered as the ``oversize`` policy says (``length``: each segment's document length).

        ``wanted``: only these documents (bool per document) may appear, each once as the policy
        says (a mixture round); ``where`` names the part of the index checked, in messages.
        O(n_segments): a document with one segment is checked on that row; only the segments of
        documents with several (the split ones, or duplicates) are put in (doc, begin) order.
        """
        label, policy, cap = self.file(F.SEGMENTS), self.pm.oversize, self.pm.capacity
        n_docs = doc_len.shape[0]
        present = per_doc > 0
        must_be_absent = doc_len > cap if policy == "drop" else np.zeros(n_docs, dtype=bool)
        if wanted is not None:
            unwanted = np.flatnonzero(present & ~wanted)
            if unwanted.size:
                self.out.add(label, "coverage", f"only the documents with more copies than the round{where}",
                             f"{unwanted.size} other document(s) present: {_listed(unwanted)}")
            must_be_absent = must_be_absent | ~wanted
        missing = np.flatnonzero(~present & ~must_be_absent)
        if missing.size:
            self.out.add(label, "coverage", f"every document in the index (oversize={policy!r}){where}",
                         f"{missing.size} document(s) missing from the index: {_listed(missing)}")
        dropped_present = np.flatnonzero(present & (doc_len > cap) & (policy == "drop"))
        if dropped_present.size:
            self.out.add(label, "coverage", f"documents longer than capacity {cap} absent (oversize='drop'){where}",
                         f"{dropped_present.size} present: {_listed(dropped_present)}")
        doc, begin, end = segs[:, 0], segs[:, 1], segs[:, 2]
        if policy == "split":
            once = per_doc[doc] == 1 if per_doc.size and per_doc.max() > 1 else np.ones(doc.shape[0], dtype=bool)
            bad = [doc[once & ((begin != 0) | (end != length))]]  # a lone segment must be [0, length)
            several = np.flatnonzero(~once)
            if several.size:
                s = segs[several]
                s = s[np.lexsort((s[:, 1], s[:, 0]))]
                sd, sb, se = s[:, 0], s[:, 1], s[:, 2]
                new_doc = np.ones(s.shape[0], dtype=bool)
                new_doc[1:] = sd[1:] != sd[:-1]
                prev_end = np.concatenate([[0], se[:-1]])
                last_of_doc = np.ones(s.shape[0], dtype=bool)
                last_of_doc[:-1] = new_doc[1:]
                bad.append(sd[(sb != np.where(new_doc, 0, prev_end)) | (last_of_doc & (se != doc_len[sd]))])
            bad = _distinct(np.concatenate(bad), n_docs)
            if bad.size:
                self.out.add(label, "coverage", f"the segments of each document tile [0, length) exactly once (oversize='split'){where}",
                             f"gaps, overlaps or duplicates in {bad.size} document(s): {_listed(bad)}")
        else:
            dup = np.flatnonzero(per_doc > 1)
            if dup.size:
                self.out.add(label, "coverage", f"each document at most once (oversize={policy!r}){where}",
                             f"{dup.size} document(s) appear more than once: {_listed(dup)}")
            if policy == "truncate":
                want_ok = (begin == 0) & np.where(length <= cap, end == length, end <= cap)
                rule = f"[0, length) when length <= {cap}, else [0, k) with k <= {cap}"
            else:
                want_ok = (begin == 0) & (end == length)
                rule = "[0, length)"
            bad = np.flatnonzero(~want_ok)
            if bad.size:
                self.out.add(label, "coverage", f"each document as {rule} (oversize={policy!r}){where}",
                             f"{bad.size} segment(s) differ, documents {_listed(_distinct(doc[bad], n_docs))}")

    def _stats(self, segs, po, seg_len, doc_len, per_doc, copies: np.ndarray | None = None) -> None:
        """Counts in index.json (counts, stats) agree with the segments. O(n_segments + n_docs).

        ``copies``: a mixture's copies of each document (spec/COLLECTION.md §5): the document
        stats then count copies (``per_doc`` holds the segments of all copies).
        """
        label = self.file(F.PACK_INDEX_JSON)
        cap = self.pm.capacity
        c = np.ones(doc_len.shape[0], dtype=np.int64) if copies is None else copies
        per_copy = per_doc // np.maximum(c, 1)
        n_docs = int(c.sum())
        packed = int(seg_len.sum())
        docs_packed = int(c[per_doc > 0].sum())
        expected = {
            "counts.packed_tokens": packed,
            "stats.packs": int(po.shape[0] - 1),
            "stats.segments": int(segs.shape[0]),
            "stats.documents": n_docs,
            "stats.documents_packed": docs_packed,
            "stats.split_documents": int(c[per_copy > 1].sum()),
            "stats.dropped_documents": n_docs - docs_packed,
            "stats.dropped_tokens": int((doc_len * c)[per_doc == 0].sum()),
        }
        if self.pm.oversize == "truncate":
            covered_len = np.bincount(segs[:, 0], weights=seg_len, minlength=doc_len.shape[0]).astype(np.int64)
            truncated = (doc_len > cap) & (per_doc > 0)
            expected["stats.truncated_documents"] = int(c[truncated].sum())
            expected["stats.truncated_tokens"] = int((doc_len * c - covered_len)[truncated].sum())
        for key, want in expected.items():
            section, name = key.split(".")
            table = self.pm.raw.get(section, {})
            if name in table and isinstance(table[name], (int, float)) and table[name] != want:
                self.out.add(label, key, want, table[name])
        fill = self.pm.stats.get("fill_efficiency")
        if isinstance(fill, (int, float)) and po.shape[0] > 1:
            want = packed / ((po.shape[0] - 1) * cap)
            if abs(fill - want) > 1e-6:
                self.out.add(label, "stats.fill_efficiency", f"{want:.6f} (packed tokens / (packs x capacity))", fill)

    def _materialized(self, segs, po, seg_len, off, bar) -> None:
        """pack_token_offsets follow the segments; packed tokens (and mask) equal the gathered segments."""
        cum = np.concatenate([[0], np.cumsum(seg_len)])
        pto = self.array(F.PACK_TOKEN_OFFSETS)
        if pto is not None and not np.array_equal(np.asarray(pto), cum[po]):
            k = int(np.flatnonzero(np.asarray(pto) != cum[po])[0])
            self.out.add(self.file(F.PACK_TOKEN_OFFSETS), f"[{k}]", f"{int(cum[po][k])} (sum of segment lengths)", int(pto[k]))
        pairs = [(F.PACKED_TOKENS, self.ds.array(F.TOKENS))]
        if self.ds.m.has_loss_mask:
            pairs.append((F.PACKED_LOSS_MASK, self.ds.array(F.LOSS_MASK)))
        starts = off[segs[:, 0]] + segs[:, 1]
        for fname, src in pairs:
            packed = self.array(fname)
            if packed is None or src is None or packed.shape[0] != int(cum[-1]):
                continue
            bad = _first_gather_mismatch(packed, src, starts, seg_len, cum)
            if bad is not None:
                self.out.add(self.file(fname), f"token {bad}", "the tokens of the segments gathered in pack order",
                             f"a different value (first difference at packed token {bad})")


def _first_gather_mismatch(packed, src, starts, seg_len, cum) -> int | None:
    """Compare ``packed`` with ``src`` gathered segment by segment, in chunks of ~16M tokens."""
    n = starts.shape[0]
    i = 0
    budget = CHUNK_ELEMS * 4
    while i < n:
        j = int(np.searchsorted(cum, cum[i] + budget, side="right")) - 1
        j = min(max(j, i + 1), n)
        lens = seg_len[i:j]
        total = int(lens.sum())
        idx = np.repeat(starts[i:j] - cum[i:j] + cum[i], lens) + np.arange(total, dtype=np.int64)
        got = np.asarray(packed[cum[i]:cum[i] + total])
        diff = np.flatnonzero(got != np.asarray(src[idx]))
        if diff.size:
            return int(cum[i] + diff[0])
        i = j
    return None
