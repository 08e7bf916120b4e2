"""``packfmt cp SRC DST`` / ``copy_dataset``: a dataset copied between local paths and object storage, either way.

What is copied: a store with its pack indexes (every file its ``manifest.json`` and each ``packs/NAME/index.json``
list, and those two); a collection with its own files (``doc_lengths.bin``, a member table), its pack indexes and
every member store (the files its manifest lists; a member's own pack indexes are not the collection's, and stay
behind). Members are resolved as the collection resolves them (spec/COLLECTION.md §2.2), and each must have the
``manifest.json`` the collection records (C3) before anything is copied. Nothing else of a source folder is copied.

How (FORMAT.md §5.1, §5.4; the house's two writers, not a third):

* A remote ``SRC`` is fetched whole into the node-local cache first (``remote.fetch_dataset``: every file
  downloaded hashed and checked against its manifest), then read from there.
* Every data file is copied hashed as it streams and checked against its manifest's size and xxh3_64
  (``collection.verified_copy.copy_verified``): a damaged source fails the copy, naming the file, and is never copied.
* A local ``DST`` is written into a temporary sibling and renamed into place (``_io.staging``, ``publish_dir``);
  a remote one is written where the cache mirrors it and uploaded with the commit points last
  (``storage.remote_output``: ``packs/*/index.json`` and members' manifests, then the top ``manifest.json``).
  A copy that fails or is killed midway leaves nothing that opens at ``DST``.
* ``DST`` must be free: a dataset there, a local path, or objects under a remote prefix are refused without
  ``overwrite`` (before anything is copied).

Members outside the collection's folder (a path with ``..``, as ``packfmt merge`` writes for stores beside it) would
land outside ``DST``: where the same relative path points from ``DST``. That is refused unless ``outside_members=
"copy"``, which copies each there (refused when something else is there; one already there with the recorded
manifest is kept, not copied again), so that the collection's manifest and pack indexes stay byte for byte the
source's. In object storage such a place must be in ``DST``'s bucket (spec/SECURITY.md A17).
"""

from __future__ import annotations

import os
import posixpath
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from xxhash import xxh3_64_hexdigest

from . import format as F
from . import index_format as IF
from ._io import CHUNK_BYTES, HashedFile, publish_dir, remove_stale_temps, staging, write_durably
from .collection.lengths import LENGTHS_FILE
from .collection.manifest import collection_reader, is_collection, parse_collection_manifest
from .collection.verified_copy import VerifiedReader, copy_verified
from .errors import DatasetExistsError, FormatError, WriteError
from .index import list_pack_indexes
from .storage import is_remote, local_file

__all__ = ["copy_dataset", "CopyResult", "OUTSIDE_MEMBERS"]

#: What ``copy_dataset`` does with members outside the collection's folder: refuse (default), or copy them where
#: their paths point from the destination.
OUTSIDE_MEMBERS = ("refuse", "copy")


@dataclass
class Tree:
    """One dataset's files to copy, relative to its folder: the data files with their manifest entries, then the
    commit points' bytes (innermost first, the dataset's own ``manifest.json`` last)."""

    root: Path  # where they are read (a local source, or the cache's mirror of a remote one)
    files: list[tuple[str, F.FileEntry]] = field(default_factory=list)
    commits: list[tuple[str, bytes]] = field(default_factory=list)


@dataclass
class CopyResult:
    """What ``copy_dataset`` did. ``outside``: where members outside the collection's folder went (or were found)."""

    src: str
    dst: str
    kind: str  # "store" or "collection"
    files: int = 0
    bytes: int = 0
    members: int = 0
    pack_indexes: list[str] = field(default_factory=list)
    outside: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # outside members already in place with the recorded manifest


def copy_dataset(src: str | os.PathLike, dst: str | os.PathLike, *, overwrite: bool = False,
                 outside_members: str = "refuse", storage_options: dict | None = None, cache_dir=None) -> CopyResult:
    """Copy the store or collection at ``src`` to ``dst`` (each a local path or a URL); return what was copied.

    Args:
        overwrite: replace a dataset, or other files or objects, at ``dst`` (and at the places of outside members).
        outside_members: ``"refuse"`` a collection with members outside its folder, or ``"copy"`` them where
            their relative paths point from ``dst`` (module doc).
        storage_options: fsspec options of both URLs (credentials, ``endpoint_url``); ``cache_dir``: the cache.
    """
    if outside_members not in OUTSIDE_MEMBERS:
        raise WriteError(f"outside_members={outside_members!r}: expected one of {OUTSIDE_MEMBERS}",
                         field="outside_members", expected=list(OUTSIDE_MEMBERS), found=outside_members,
                         cli=f"--outside-members {outside_members}: expected one of {', '.join(OUTSIDE_MEMBERS)}")
    src, dst = _where(src), _where(dst)
    _refuse_overlap(src, dst)
    fetched = None
    if is_remote(src):
        from .remote import fetch_dataset

        fetched = fetch_dataset(src, storage_options, cache_dir)  # pinned while ``fetched`` lives
        root = Path(fetched.path)
    else:
        root = Path(src)
    if not (root / F.MANIFEST).is_file():
        raise FormatError(f"{src}: not a packfmt dataset (no {F.MANIFEST} there); check the path, or write one with "
                          "`packfmt build` / `packfmt merge`", file=src, expected="a dataset", found="no manifest.json")
    raw = F.read_json_bytes(root / F.MANIFEST, file=f"{src}/{F.MANIFEST}")
    obj = F.parse_json(raw, file=f"{src}/{F.MANIFEST}")
    result = CopyResult(src, dst, "collection" if is_collection(obj) else "store")
    if result.kind == "store":
        tree, outside = _store_tree(root, raw, obj, src, packs=True), []
    else:
        tree, outside = _collection_tree(root, raw, obj, src, result)
    result.pack_indexes = list_pack_indexes(root)
    if outside and outside_members == "refuse":
        raise _outside_refused(src, dst, outside)
    todo = _check_outside([(_joined(dst, rel), member) for rel, member, _ in outside], overwrite, storage_options,
                          result)
    with _written(dst, overwrite, storage_options, cache_dir) as out:
        for target, member in todo:  # before the collection's manifest: a reader never finds it without them
            with _written(target, overwrite, storage_options, cache_dir) as place:
                _copy_tree(member, place, result)
        _copy_tree(tree, out, result)
    del fetched
    return result


def _where(path) -> str:
    """A URL as given (no trailing ``/``), a ``file://`` URL or path as a local path."""
    text = str(path)
    return text.rstrip("/") if is_remote(text) else str(local_file(text))


def _refuse_overlap(src: str, dst: str) -> None:
    """``dst`` neither is ``src`` nor lies inside it, nor holds it (a copy would read what it writes)."""
    if is_remote(src) != is_remote(dst):
        return
    a, b = (src, dst) if is_remote(src) else (os.path.realpath(src), os.path.realpath(dst))
    if a == b or b.startswith(a.rstrip("/") + "/") or a.startswith(b.rstrip("/") + "/"):
        raise WriteError(f"{dst}: the copy would overlap its source {src}; copy to a place outside it", field="dst",
                         expected="a place neither inside nor holding the source", found=dst)


def _store_tree(root: Path, raw: bytes, obj: dict, label: str, *, packs: bool) -> Tree:
    """The files of the store at ``root`` (its manifest ``raw``/``obj``), with its pack indexes when ``packs``."""
    manifest = F.parse_manifest(obj, file=f"{label}/{F.MANIFEST}")
    tree = Tree(root, sorted(manifest.files.items()))
    if packs:
        _add_packs(tree, root, label)
    tree.commits.append((F.MANIFEST, raw))
    return tree


def _add_packs(tree: Tree, root: Path, label: str) -> None:
    for name in list_pack_indexes(root):
        rel = f"{F.PACKS_DIR}/{name}"
        raw = F.read_json_bytes(root / rel / F.PACK_INDEX_JSON, file=f"{label}/{rel}/{F.PACK_INDEX_JSON}")
        index = IF.parse_pack_index_manifest(F.parse_json(raw, file=f"{label}/{rel}/{F.PACK_INDEX_JSON}"),
                                             file=f"{label}/{rel}/{F.PACK_INDEX_JSON}")
        tree.files += [(f"{rel}/{f}", entry) for f, entry in sorted(index.files.items())]
        tree.commits.append((f"{rel}/{F.PACK_INDEX_JSON}", raw))


def _collection_tree(root: Path, raw: bytes, obj: dict, label: str, result: CopyResult):
    """The collection's own tree (its files, indexes, and the members inside its folder under their paths), and
    ``(relative path, member tree, name)`` of each member outside it. Every member's manifest is checked (C3)."""
    cm = parse_collection_manifest(obj, file=f"{label}/{F.MANIFEST}", read=collection_reader(root))
    own = F.parse_files_table(obj, file=f"{label}/{F.MANIFEST}") if "files" in obj else {}
    tree = Tree(root, [(n, e) for n, e in sorted(own.items()) if n != LENGTHS_FILE or (root / n).is_file()])
    outside, seen = [], set()
    for m, entry in enumerate(cm.members):
        rel = posixpath.normpath(entry.path)
        if rel in seen:
            continue
        seen.add(rel)
        member_raw = F.read_json_bytes(root / entry.path / F.MANIFEST, file=f"{label}/{entry.path}/{F.MANIFEST}")
        found = "xxh3_64:" + xxh3_64_hexdigest(member_raw)
        if found != entry.manifest:  # C3: the collection binds every byte of the member through this checksum
            from .collection.member_checks import changed_member

            raise changed_member(cm, m, found, root / entry.path / F.MANIFEST)
        member = _store_tree(root / entry.path, member_raw, F.parse_json(member_raw, file=entry.path),
                             f"{label}/{entry.path}", packs=False)
        if rel == ".." or rel.startswith("../"):
            outside.append((entry.path, member, entry.name))
        else:
            tree.files += [(f"{rel}/{n}", e) for n, e in member.files]
            tree.commits += [(f"{rel}/{n}", b) for n, b in member.commits]
        result.members += 1
    _add_packs(tree, root, label)
    tree.commits.append((F.MANIFEST, raw))
    return tree, outside


def _joined(dst: str, rel: str) -> str:
    """Where member path ``rel`` points from the collection at ``dst`` (lexically, as object storage resolves it)."""
    if is_remote(dst):
        from .storage.uri import member_url

        try:
            return member_url(dst, rel, file=f"{dst}/{F.MANIFEST}")
        except FormatError as exc:
            raise WriteError(f"{exc}: a member there could not be read (spec/SECURITY.md A17); copy the collection "
                             "into a prefix whose bucket the member paths stay in", field="dst",
                             expected=exc.expected, found=exc.found) from None
    return os.path.normpath(os.path.join(dst, rel))


def _outside_refused(src: str, dst: str, outside: list) -> WriteError:
    shown = ", ".join(f"{name!r} ({rel} -> {_joined(dst, rel)})" for rel, _, name in outside[:5])
    more = f" and {len(outside) - 5} more" if len(outside) > 5 else ""
    what = (f"{src}: {len(outside)} member(s) lie outside the collection's folder, so their copies would lie outside "
            f"{dst}, where their paths point from it: {shown}{more}")
    return WriteError(f"{what}; pass outside_members='copy' to copy them there, or make one self-contained store "
                      f"first (merge_physical) and copy that", field="outside_members",
                      expected="members inside the collection's folder, or outside_members='copy'",
                      found=f"{len(outside)} outside",
                      cli=f"{what}; pass --outside-members copy to copy them there, or copy one self-contained store: "
                          f"`packfmt merge --physical {src} -o STORE`, then `packfmt cp STORE {dst}`")


def _check_outside(targets: list, overwrite: bool, storage_options, result: CopyResult) -> list:
    """Of ``(target, member tree)``, the outside members still to copy; one already at its target with the recorded
    manifest is kept. Anything else at a target is refused unless ``overwrite``, before anything is copied."""
    todo = []
    for target, member in targets:
        result.outside.append(target)
        recorded = member.commits[-1][1]
        if _manifest_at(target, storage_options) == recorded:
            result.kept.append(target)
            continue
        if not overwrite:
            _refuse_taken(target, storage_options)
        todo.append((target, member))
    return todo


def _manifest_at(where: str, storage_options) -> bytes | None:
    """The bytes of the ``manifest.json`` at ``where`` (a path or a URL), or None."""
    if is_remote(where):
        from .storage.uri import filesystem

        fs, rpath = filesystem(where, storage_options)
        try:
            return fs.cat_file(f"{rpath}/{F.MANIFEST}")
        except (FileNotFoundError, OSError):
            return None
    try:
        return Path(where, F.MANIFEST).read_bytes()
    except OSError:
        return None


def _refuse_taken(where: str, storage_options) -> None:
    if is_remote(where):
        from .storage.upload import refuse_occupied

        refuse_occupied(where, storage_options)
        return
    target = Path(where)
    remove_stale_temps(target)  # it may restore a copy an interrupted overwrite had moved aside
    if target.exists() or target.is_symlink():
        raise DatasetExistsError(f"{target}: already exists (pass overwrite=True to replace it)", file=str(target),
                                 expected="no existing path", found="exists",
                                 cli=f"{target}: already exists (pass --overwrite to replace it)")


@contextmanager
def _written(dst: str, overwrite: bool, storage_options, cache_dir):
    """A local folder to write the dataset at ``dst`` into; published when the block succeeds (a local ``dst`` by a
    rename, a URL by an upload with the commit points last), nothing left at ``dst`` when it fails."""
    if is_remote(dst):
        from .storage import remote_output

        with remote_output(dst, storage_options, overwrite=overwrite, cache_dir=cache_dir) as local:
            yield local
        return
    if not overwrite:
        _refuse_taken(dst, storage_options)
    target = Path(dst)
    target.parent.mkdir(parents=True, exist_ok=True)
    with staging(target) as tmp:
        yield tmp
        publish_dir(tmp, target, overwrite=overwrite)


def _copy_tree(tree: Tree, out: Path, result: CopyResult) -> None:
    """Every data file of ``tree`` copied verified into ``out``, then its commit points, the manifest last."""
    buf = bytearray(CHUNK_BYTES)
    for rel, entry in tree.files:
        _copy_file(tree.root / rel, out / rel, entry, buf)
        result.files += 1
        result.bytes += entry.bytes
    for rel, data in tree.commits:
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        write_durably(path, data)
        result.files += 1
        result.bytes += len(data)


def _copy_file(src: Path, dst: Path, entry: F.FileEntry, buf: bytearray) -> None:
    """``src`` copied to ``dst``, hashed as it streams; refused (``ChecksumError``) unless it is ``entry``'s bytes."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        reader = VerifiedReader(src, entry)
    except FileNotFoundError:
        raise FormatError(f"{src}: missing (listed with {entry.bytes} bytes); the source is incomplete: run "
                          f"`packfmt validate {src.parent}`", file=str(src), expected=f"{entry.bytes} bytes",
                          found="missing") from None
    out = HashedFile(dst)
    try:
        copy_verified(reader, out, buf, lambda n: None)
    except BaseException:
        out.abort()
        raise
    out.close()
