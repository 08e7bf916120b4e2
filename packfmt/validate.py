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
from pathlib import Path

from . import format as F
from .errors import PackfmtError, UnsupportedVersionError
from .validation.index import _IndexChecks
from .validation.report import (ERROR, PROGRESS_MIN_BYTES, WARNING, Problem, Report, _Collector, _minor_version_note,
                                _version_problem)
from .validation.store import _DatasetChecks

__all__ = ["Problem", "Report", "validate", "ERROR", "WARNING"]


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


def _progress_bar(ds: "_DatasetChecks", indexes: list["_IndexChecks"], progress: bool):
    total = ds.deep_bytes() + sum(ix.deep_bytes() for ix in indexes)
    if not progress or total < PROGRESS_MIN_BYTES:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc="validate --deep", file=None,
                dynamic_ncols=True, leave=False)
