"""Writing to a URL: write locally, then upload with the commit points last.

A dataset's commit point is its ``manifest.json`` (a pack index's: ``packs/NAME/index.json``): a
reader that sees it sees every file it lists. So an upload (1) removes the commit points it will
replace, outermost first (readers then see no dataset rather than a mix of two), (2) removes remote
files the new tree does not have, (3) puts the data files, (4) puts the commit points, innermost
first and the top one last. A failure before (4) leaves nothing that opens; rerun the command.
The local copy is written where the cache mirrors ``url`` and marked verified after the upload, so
the writer's node reads it back without downloading. Every request (the listing, each PUT and DELETE; a large
file's multipart upload) is ``transport``'s: a deadline, retries, one ``StorageError`` when they are spent, and a
rerun puts everything again.
"""

from __future__ import annotations

import shutil
from contextlib import contextmanager
from pathlib import Path

from .. import format as F
from ..errors import DatasetExistsError
from .cache import Origin, cache_root, mark_verified, mirror_path
from .errors import require_bucket, storage_errors
from .transport import remote

__all__ = ["remote_output", "upload_tree", "exists", "refuse_occupied"]

_COMMITS = (F.MANIFEST, F.PACK_INDEX_JSON)


def exists(url: str, storage_options: dict | None = None, commit: str = F.MANIFEST) -> bool:
    fs, rpath = remote(url, storage_options)
    fs.invalidate_cache(rpath)
    return fs.exists(f"{rpath}/{commit}")


def upload_tree(local: Path, url: str, storage_options: dict | None = None, subdir: str = "") -> int:
    """Upload ``local/subdir`` to ``url/subdir`` (commit points last; stale remote files removed); return files put."""
    fs, rpath = remote(url, storage_options)
    base = Path(local) / subdir if subdir else Path(local)
    rbase = f"{rpath}/{subdir}" if subdir else rpath
    rels = sorted(p.relative_to(base).as_posix() for p in base.rglob("*")
                  if p.is_file() and not any(part.startswith(".") for part in p.relative_to(base).parts))
    fs.invalidate_cache(rbase)
    try:
        old = sorted(p[len(rbase) + 1:] for p in fs.find(rbase))
    except FileNotFoundError:
        old = []
    depth = lambda rel: rel.count("/")  # noqa: E731
    for rel in sorted((r for r in old if r.rsplit("/", 1)[-1] in _COMMITS), key=depth):
        fs.rm_file(f"{rbase}/{rel}")
    keep = set(rels)
    for rel in old:
        if rel not in keep and rel.rsplit("/", 1)[-1] not in _COMMITS:
            fs.rm_file(f"{rbase}/{rel}")
    data = [r for r in rels if r.rsplit("/", 1)[-1] not in _COMMITS]
    commits = sorted((r for r in rels if r.rsplit("/", 1)[-1] in _COMMITS), key=depth, reverse=True)
    for rel in data + commits:
        fs.put_file(str(base / rel), f"{rbase}/{rel}")
    fs.invalidate_cache(rbase)
    return len(rels)


def _objects_under(url: str, storage_options: dict | None) -> int:
    """How many objects lie under the prefix ``url`` (0 when none)."""
    fs, rpath = remote(url, storage_options)
    fs.invalidate_cache(rpath)
    try:
        return len(fs.find(rpath))
    except FileNotFoundError:
        return 0


def refuse_occupied(url: str, storage_options: dict | None = None, *, overwrite: bool = False) -> None:
    """Unless ``overwrite``, ``DatasetExistsError`` when the prefix ``url`` holds a dataset (its manifest) or any other
    object; a missing bucket is a ``StorageError`` either way (checked before any work is done, not at the upload)."""
    with storage_errors(url, storage_options):
        taken = exists(url, storage_options)
        others = 0
        if not taken:
            require_bucket(remote(url, storage_options)[0], url, storage_options)
            others = _objects_under(url, storage_options)
    if overwrite:
        return
    if taken:
        raise DatasetExistsError(f"{url}: already exists (pass overwrite=True to replace it)", file=url,
                                 expected="no existing dataset", found="exists",
                                 cli=f"{url}: already exists (pass --overwrite to replace it)")
    if others:  # the upload removes what the new tree lacks: never someone else's objects
        what = f"{url}: holds {others} object(s) but is not a packfmt dataset (no {F.MANIFEST})"
        raise DatasetExistsError(f"{what}; write to an empty prefix, or pass overwrite=True to replace them",
                                 file=url, expected="an empty prefix", found=f"{others} object(s)",
                                 cli=f"{what}; write to an empty prefix, or pass --overwrite to replace them")


@contextmanager
def remote_output(url: str, storage_options: dict | None = None, *, overwrite: bool = False, cache_dir=None):
    """Yield the local directory to write the dataset at ``url`` into; upload it when the block succeeds.

    Refuses an existing remote dataset unless ``overwrite`` (checked before any work is done).
    """
    url = url.rstrip("/")
    refuse_occupied(url, storage_options, overwrite=overwrite)
    local = mirror_path(url, storage_options, cache_dir)
    root = cache_root(cache_dir)
    with storage_errors(url, storage_options, root):
        if local.exists():
            shutil.rmtree(local)  # a stale mirror; processes that mapped its files keep valid mappings
        local.parent.mkdir(parents=True, exist_ok=True)
    try:
        yield local
        with storage_errors(url, storage_options, root):
            upload_tree(local, url, storage_options)
    except BaseException:
        shutil.rmtree(local, ignore_errors=True)  # never uploaded (nor marked verified): leave nothing behind
        raise
    with storage_errors(url, storage_options, root):
        mark_verified(local, root)


def upload_index(local: Path, origin: Origin, name: str) -> None:
    """Upload pack index ``name`` just written into ``local``, the mirror of a dataset opened from ``origin``
    (index.json last)."""
    sub = f"{F.PACKS_DIR}/{name}"
    so, root = origin.storage_options, origin.cache_root
    with storage_errors(origin.url, so, root):
        upload_tree(local, origin.url, so, subdir=sub)
        mark_verified(Path(local), root)
