"""A dataset at a URL mirrored whole into the node-local cache (README "Remote data"; spec/SECURITY.md A16, A17).

Which files a store or a collection at a URL has, and in what order they are fetched: a store's files as its
manifest lists them; a collection's own files first (its member table lists the members: spec/COLLECTION.md §2.5),
then every member's files (``in_flight``: several members at once), then every pack index (``pack_mirror``), then
the manifest, last. Each file goes through ``storage.cache.Fetcher.file`` (hashed while it streams, checked against
its manifest entry, stat-bound markers, a file lock per file); this module decides what is fetched, storage how.

``check_mirror`` is the other direction: a mirror re-opened by its local path (a DataLoader worker re-opening what its
parent fetched) has every file whose stat moved since it was verified hashed again (``storage.verify``).

Containment (spec/SECURITY.md A17): a collection's member paths are resolved lexically inside its bucket
(``storage.uri.check_member_paths``: every member at once) before anything of a member is fetched or a folder made
for it, and a mirror re-opened by its local path has its member paths checked against the mirror of its bucket
(``check_mirror``) before the reader resolves any of them on the local disk.
"""

from __future__ import annotations

import os
from pathlib import Path

from .. import format as F
from ..collection.lengths import LENGTHS_FILE, parse_collection_files
from ..collection.manifest import collection_reader, parse_collection_manifest
from ..collection.member_table import NAMES_FILE, listed_paths
from ..collection.versions import parse_collection_version
from ..errors import FormatError
from ..storage import uri
from ..storage.uri import escapes
from ..storage import verify as V
from ..storage.cache import Fetched, Fetcher, Pin, evict
from ..storage.errors import storage_errors
from ..storage.in_flight import in_order, members_in_flight, together
from ..storage.transport import remote
from .pack_mirror import drop_gone, mirror_pack, remote_pack_manifests

__all__ = ["fetch_dataset", "mirror_dataset", "mirror_collection_manifest", "mirror_collection_files",
           "mirror_packs", "check_mirror"]


def fetch_dataset(url: str, storage_options: dict | None = None, cache_dir=None, cache_limit=None,
                  verify: str | None = None) -> Fetched:
    """Mirror the dataset (store or collection, with its pack indexes) at ``url`` into the cache; return it pinned.

    ``verify``: ``"stat"`` (default) hashes a cached file again when its stat changed since it was verified,
    ``"full"`` on every call (also ``$PACKFMT_CACHE_VERIFY``).
    """
    url = url.rstrip("/")
    f = Fetcher(storage_options, cache_dir, cache_limit, verify)
    try:
        with storage_errors(url, storage_options, f.root):
            f.result.path = mirror_dataset(f, url)
            if f.limit is not None and not f.result.downloaded:  # (after a download, ``file`` evicted already)
                evict(f.root, f.limit)
    except BaseException:
        for pin in f.result.pins:  # nothing was opened: hold nothing (an error's traceback may live long)
            pin.close()
        raise
    return f.result


def mirror_dataset(f: Fetcher, url: str, *, packs: bool = True, raw: bytes | None = None, pin: bool = True) -> Path:
    """Mirror the dataset at ``url`` through ``f``; ``raw``: its ``manifest.json`` as the caller just read it from the
    bucket (None: read here). ``pin``: hold a pin on its mirror folder (a collection's members are covered by the one
    pin on the folder that holds them all: one descriptor, not one a member, which at 10^5 members would pass the
    process's limit on open files)."""
    fs, rpath = remote(url, f.so)
    local = f.mirror(url)
    label = f"{url}/{F.MANIFEST}"
    if raw is None:
        raw, obj = f.manifest_json(fs, f"{rpath}/{F.MANIFEST}", url)
    else:
        obj = F.parse_json(raw, file=label)
    if pin:
        f.result.pins.append(Pin(f.root, local))
    else:
        V.ensure_dir(local)
    V.drop_legacy(local)
    if obj.get("format") == "packfmt-collection":
        # its own files first (a member table lists the members)
        cm = mirror_collection_manifest(f, fs, rpath, url, local, obj)
        # every member path inside the bucket, before anything of a member is fetched (A17)
        uri.check_member_paths(url, cm.members.paths, file=label, name_of=lambda i: cm.members[i].name)
        urls = [uri.member_url(url, p, file=label, field=f"members[{i}].path") for i, p in enumerate(cm.members.paths)]
        if pin and urls:  # before any member is fetched: another process's eviction skips them from now on
            common = Path(os.path.commonpath([local, *{f.mirror(u).parent for u in urls}]))
            if common != local:
                f.result.pins.append(Pin(f.root, common))
        # a collection reads its own indexes only (packs=False)
        in_order(lambda i: mirror_dataset(f, urls[i], packs=False, pin=False), len(urls), members_in_flight())
    else:
        for name, entry in F.parse_manifest(obj, file=label).files.items():
            f.file(fs, f"{rpath}/{name}", f"{url}/{name}", local / name, entry, label)
    if packs:
        mirror_packs(f, fs, rpath, url, local)
    f.write_atomic(local / F.MANIFEST, raw)
    return local


def mirror_collection_manifest(f: Fetcher, fs, rpath: str, url: str, local: Path, obj: dict,
                               leave: tuple[str, ...] = ()):
    """The parsed manifest ``obj`` of the collection at ``url``, with the files it lists of its own mirrored and
    verified first (``mirror_collection_files``): a member table (§2.5) is read from the mirror. ``leave``: names of
    those files left in the bucket for now (a streamed open, which reads no ``doc_lengths.bin``)."""
    label = f"{url}/{F.MANIFEST}"
    try:  # the files table alone (C1 of the whole manifest follows, from the mirrored files)
        version = parse_collection_version(obj.get("format_version"), file=label)
        files = parse_collection_files(obj, version, int(obj["counts"]["documents"]), file=label,
                                       table=obj.get("members") == "table")
    except (FormatError, KeyError, TypeError, ValueError):
        files = {}  # malformed: parse_collection_manifest names the field
    mirror_collection_files(f, fs, rpath, url, local, {k: v for k, v in files.items() if k not in leave})
    return parse_collection_manifest(obj, file=label, read=collection_reader(local))


def mirror_collection_files(f: Fetcher, fs, rpath: str, url: str, local: Path, files: dict) -> None:
    """Mirror the files a collection's manifest lists of its own (``files``, spec/COLLECTION.md §2.4, §2.5),
    verified as every file, so that packing and opening it read its lengths, not every member. A
    ``doc_lengths.bin`` missing from the bucket is left out (readers then take the members' own lengths, as the
    spec allows; validate warns); a member table missing is an error (it is the member list); one that fails
    its size or checksum is refused like any listed file. The files are requested at once."""
    def one(name: str, entry) -> None:
        try:
            f.file(fs, f"{rpath}/{name}", f"{url}/{name}", local / name, entry, f"{url}/{F.MANIFEST}")
        except FormatError as exc:
            if exc.found != "missing" or name != LENGTHS_FILE:
                raise
            V.forget(f.root, local / name)
            (local / name).unlink(missing_ok=True)  # an earlier copy is not this manifest's evidence

    together([lambda name=name, entry=entry: one(name, entry) for name, entry in files.items()])


def mirror_packs(f: Fetcher, fs, rpath: str, url: str, local: Path) -> None:
    """Mirror every pack index under ``packs/``; drop mirrored ones the bucket no longer has."""
    found = remote_pack_manifests(fs, rpath)
    for name, raw in found.items():
        mirror_pack(f, fs, rpath, url, local, name, raw)
    drop_gone(f.root, local, set(found))


def check_mirror(path: Path, mode: str | None = None) -> None:
    """A local open of a mirrored dataset (a DataLoader worker re-opening what its parent fetched): a collection's
    member paths must stay inside the mirror of its bucket (``FormatError`` otherwise: the reader would resolve them
    on the local disk); every file verified there whose stat changed since is hashed again; one that no longer
    matches is removed and refused. A collection's own files first, then every member's (listed in its manifest, or
    in its member table, which has just been checked). Paths outside a cache: nothing to do (a few ``stat`` calls)."""
    mode = V.verify_mode(mode)
    root = None if mode == V.FETCHED else V.cache_of(path)
    if root is None:
        return
    top = Path(path).absolute()
    try:
        obj = F.read_json(top / F.MANIFEST, file=F.MANIFEST)
    except FormatError:
        return  # the reader reports an unreadable manifest
    V.check_dir(root, top, mode)
    if obj.get("format") == "packfmt-collection":
        paths = _member_paths(top, obj.get("members"))
        _contained(root, top, paths)
        for rel in paths:
            V.check_own_files(root, os.path.normpath(os.path.join(top, rel)), mode)


def _contained(root: Path, top: Path, paths: list[str]) -> None:
    """Refuse the first member path of the mirrored collection ``top`` that leaves the mirror of its bucket
    (``<cache>/<key>/<bucket>/``): the lexical rule of a URL's members (``storage.uri.escapes``), on the mirror."""
    rel = os.path.relpath(os.path.normpath(top), root).split(os.sep)
    base = "/".join(rel[1:])  # bucket/path, below the file system's key
    i = escapes(base, paths) if base else (0 if paths else None)
    if i is None:
        return
    bucket = root / rel[0] / (rel[1] if len(rel) > 1 else "")
    label = str(top / F.MANIFEST)
    raise FormatError(f"{label}: members[{i}].path: expected a member inside the cache's mirror of its bucket "
                      f"({bucket}), found {paths[i]!r}; nothing of it was read. This mirror's manifest is not one "
                      f"packfmt checked (an older packfmt, or a hand edit): remove {top} and open the dataset's URL "
                      "again", file=label, field=f"members[{i}].path", expected=f"a path inside {bucket}",
                      found=paths[i])


def _member_paths(top: Path, members) -> list[str]:
    """The member paths of a collection's manifest or member table (read leniently: the reader checks both next)."""
    def names() -> bytes | None:
        try:
            return (top / NAMES_FILE).read_bytes()
        except OSError:
            return None  # the reader names the missing table

    return listed_paths(members, names)
