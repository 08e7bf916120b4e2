"""A remote dataset's pack indexes in the cache's mirror: listed from the bucket, each mirrored when wanted.

A dataset fetched whole (``mirror.mirror_packs``) mirrors every index; a streamed collection (``streamed``,
``members``) lists them at open and mirrors one only when ``pack_index(name)`` first opens it, so a collection
with several indexes (capacities, mixtures) fetches only the one it trains from before its first batch. Each file
is fetched and verified as every cached file is (``storage.cache.Fetcher.file``: hashed while it streams, checked
against ``index.json``), ``index.json`` last. Each ``index.json`` is read bounded and parsed by the one JSON rule
(``storage.remote_json``), and an index's name is checked (FORMAT.md §4) before a folder is made for it.
"""

from __future__ import annotations

import posixpath
import shutil
from pathlib import Path

from .. import format as F
from .. import index_format as IF
from ..errors import FormatError
from ..storage import verify as V
from ..storage.cache import Fetcher
from ..storage.in_flight import together
from ..storage.remote_json import read_json

__all__ = ["remote_pack_manifests", "mirror_pack", "drop_gone", "refuse_materialized"]


def remote_pack_manifests(fs, rpath: str) -> dict[str, bytes]:
    """``index.json`` bytes of every committed pack index under ``rpath/packs/`` (one listing, one small GET each,
    bounded and checked to be a JSON object: ``storage.remote_json.read_json``; a folder without ``index.json`` is an
    upload in flight or a stray folder, and left out). ``fs``: a ``storage.transport.Remote``."""
    remote = f"{rpath}/{F.PACKS_DIR}"
    fs.invalidate_cache(remote)
    try:
        names = sorted(posixpath.basename(p.rstrip("/")) for p in fs.ls(remote, detail=False))
    except FileNotFoundError:
        return {}
    def one(name: str) -> bytes | None:
        path = f"{remote}/{name}/{F.PACK_INDEX_JSON}"
        try:
            return read_json(fs, path, fs.url(path))[0]
        except FileNotFoundError:
            return None

    names = [n for n in names if not n.startswith(".")]
    got = together([lambda name=name: one(name) for name in names])  # (at once: one round trip)
    return {name: raw for name, raw in zip(names, got) if raw is not None}


def mirror_pack(fetcher: Fetcher, fs, rpath: str, url: str, local: Path, name: str, raw: bytes) -> None:
    """Pack index ``name`` (its ``index.json`` bytes ``raw``) mirrored under ``local/packs/name``: each file it lists
    fetched and verified by ``fetcher``, then ``index.json``, so that a listing of the mirror
    never shows an index whose files are not all there."""
    remote = f"{rpath}/{F.PACKS_DIR}"
    label = f"{url}/{F.PACKS_DIR}/{name}/{F.PACK_INDEX_JSON}"
    _check_name(url, name)
    idx = IF.parse_pack_index_manifest(F.parse_json(raw, file=label), file=label)
    ldir = local / F.PACKS_DIR / name
    ldir.mkdir(parents=True, exist_ok=True)
    V.drop_legacy(ldir)
    for fname, entry in idx.files.items():
        fetcher.file(fs, f"{remote}/{name}/{fname}", f"{url}/{F.PACKS_DIR}/{name}/{fname}", ldir / fname, entry, label)
    fetcher.write_atomic(ldir / F.PACK_INDEX_JSON, raw)


def _check_name(url: str, name: str) -> None:
    """A pack index's name as FORMAT.md §4 allows (a plain name: never a path), before anything is made for it."""
    try:
        IF.check_index_name(name)
    except FormatError as exc:
        where = f"{url}/{F.PACKS_DIR}/{name}/"
        raise FormatError(f"{where}: {exc}; a folder of the bucket's packs/ that is no pack index: rename or remove "
                          "it", file=where, field="name", expected=exc.expected, found=exc.found) from None


def drop_gone(root: Path, local: Path, present: set[str]) -> None:
    """Remove the mirrored indexes the bucket no longer has (mapped copies stay valid on Linux)."""
    lpacks = local / F.PACKS_DIR
    if lpacks.is_dir():
        for p in lpacks.iterdir():
            if p.is_dir() and not p.name.startswith(".") and p.name not in present:
                shutil.rmtree(V.state_dir(root, p), ignore_errors=True)
                shutil.rmtree(p, ignore_errors=True)


def refuse_materialized(url: str, name: str, raw: bytes) -> None:
    """A materialized index holds its packs' tokens, one more copy of the collection's: a streamed read would fetch
    them whole (uncounted by ``cache_limit``) before its first batch, and read no member. Refused, naming the way on."""
    label = f"{url}/{F.PACKS_DIR}/{name}/{F.PACK_INDEX_JSON}"
    idx = IF.parse_pack_index_manifest(F.parse_json(raw, file=label), file=label)
    if idx.materialized:
        copy = sum(e.bytes for n, e in idx.files.items() if n not in (F.PACK_OFFSETS, F.SEGMENTS))
        raise FormatError(f"{label}: materialized: expected false for a streamed read, found true: the index holds its "
                          f"packs' tokens ({copy:,} bytes, a second copy of the data), which stream=True would fetch "
                          "whole before the first batch; open it without stream=True (fetched whole, read from the "
                          f"copy), or pack an index without --materialize (`packfmt pack {url} --capacity N`) and "
                          "stream that", file=label, field="materialized", expected="false (stream=True)", found=True)
