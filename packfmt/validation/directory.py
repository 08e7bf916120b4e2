"""``packfmt validate`` of one store directory: its manifest, files and pack indexes (spec §6).

``packfmt.validate`` is the front (a URL, a collection or a store); a collection's members are
validated here too, one store at a time (``packfmt.collection.validate``).
"""

from __future__ import annotations

from pathlib import Path

from .. import format as F
from .index import _IndexChecks
from .report import (
    PROGRESS_MIN_BYTES,
    WARNING,
    Report,
    _Collector,
    _minor_version_note,
    parsed_or_reported,
)
from .store import _DatasetChecks

__all__ = ["validate_store", "index_dirs"]


def validate_store(root: Path, *, deep: bool, progress: bool, decode_images: bool, obj: dict | None = None,
                   listed: bool = True) -> Report:
    """Every problem of the store directory ``root`` (see ``packfmt.validate.validate``); ``obj``: its manifest
    already read by the caller (a collection's member check), so it is read once per command. ``listed=False``:
    the directory is not listed, so neither its stray entries (warnings) nor its own pack indexes are checked: what
    a collection's structural check of a member leaves to ``--deep`` (C2 is V1-V11, V13-V15 and V19; C4, deep,
    is the member's every check, its own indexes included)."""
    report = Report(str(root), deep)
    out = _Collector(report)
    if not root.is_dir():
        found = "missing" if not root.exists() else "a file"
        out.add(str(root), None, detail=f"not a packfmt dataset: expected a directory with {F.MANIFEST}, found {found}")
        return report
    manifest = _load_manifest(root, out, obj)
    if manifest is None:
        return report
    report.checked.update(documents=manifest.num_documents, tokens=manifest.num_tokens, images=manifest.num_images)
    ds = _DatasetChecks(root, manifest, out)
    ds.decode_images = decode_images
    ds.structural(listed)
    indexes = [_IndexChecks(ds, name) for name in index_dirs(root, out)] if listed else []
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


def _load_manifest(root: Path, out: _Collector, obj: dict | None = None) -> F.Manifest | None:
    manifest = parsed_or_reported(lambda: F.parse_manifest(F.read_json(root / F.MANIFEST, file=F.MANIFEST)
                                                           if obj is None else obj, file=F.MANIFEST), out, F.MANIFEST)
    if manifest is None:
        return None
    _minor_version_note(manifest.version, F.MANIFEST, out)
    return manifest


def index_dirs(root: Path, out: _Collector) -> list[str]:
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
