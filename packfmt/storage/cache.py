"""The node-local cache of remote datasets: whole files, verified before use, fetched once per node.

Layout: ``<cache>/<root key>/<bucket>/<path>/...`` mirrors the remote tree (``uri.root_key``), so
``packfmt.open`` memory-maps the mirror as it would a local dataset and a collection's relative
member paths resolve there as in the bucket. ``<cache>`` is ``cache_dir=``, else ``$PACKFMT_CACHE``,
else ``~/.cache/packfmt``.

Rules (docs: README "Remote data"):

* Never served unverified. A file is downloaded to ``.NAME.part-PID-RAND``, hashed (xxh3_64) and
  counted while it streams, compared with the ``bytes`` and ``checksum`` its manifest lists, and
  only then renamed into place, followed by ``.NAME.verified`` (``"<bytes> <checksum>"``). A file
  counts as cached only when its ``.verified`` record equals the current manifest's entry and its
  size matches; a mismatch (a bad object, a truncated one) raises and leaves nothing behind.
* Fetched once per node. Each file is fetched under a file lock (``.NAME.lock``, ``filelock``), and
  the check is repeated inside the lock, so N processes opening the same URL download it once.
  Every download is one JSON line in ``<cache>/downloads.log`` (url, bytes, pid).
* Manifests (``manifest.json``, ``index.json``) are re-read from the bucket on every open: they are
  the commit points, and they decide which files are current. They are written into the mirror
  after the files they list.
* Bounded. ``cache_limit=`` bytes (or ``$PACKFMT_CACHE_LIMIT``, e.g. ``200G``): after a download,
  verified files are evicted least recently used first (use = the ``.verified`` record's mtime,
  touched on every open) until the cache fits. Safe rule: every process that opened a dataset
  holds a shared ``flock`` on the dataset's ``.packfmt-pin`` for as long as the opened object
  lives; eviction takes that lock exclusively without waiting and skips any dataset it cannot
  lock. So no file is evicted while any process on the node has its dataset open (and on Linux an
  unlinked file that is still memory-mapped would stay valid anyway). When everything over the
  limit is pinned, a warning says so and the cache stays over the limit.
"""

from __future__ import annotations

import fcntl
import json
import os
import posixpath
import shutil
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import xxhash

from .. import format as F
from .._io import CHUNK_BYTES, fsync_dir
from ..errors import ChecksumError, FormatError
from . import uri

__all__ = ["cache_root", "parse_limit", "fetch_dataset", "Fetched", "Pin", "mark_verified", "evict"]

PIN, LOG = ".packfmt-pin", "downloads.log"


def cache_root(cache_dir=None) -> Path:
    root = cache_dir or os.environ.get("PACKFMT_CACHE") or Path.home() / ".cache" / "packfmt"
    return Path(root).expanduser()


def parse_limit(value) -> int | None:
    """``None``, an int of bytes, or a string like ``"500M"`` / ``"200G"`` (binary units)."""
    if value is None or value == "":
        return None
    if isinstance(value, int):
        return value
    text = str(value).strip().upper().removesuffix("B").removesuffix("I")
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    try:
        return int(float(text[:-1]) * units[text[-1]]) if text[-1:] in units else int(text)
    except ValueError:
        raise ValueError(f"cache_limit: expected bytes like 1000000, '500M' or '200G', found {value!r}") from None


class Pin:
    """A shared lock on a mirrored dataset: eviction skips it while this object is alive."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(directory / PIN, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_SH)  # waits only while an eviction pass holds it

    def close(self, _close=os.close) -> None:  # _close: still bound at interpreter shutdown
        if getattr(self, "fd", None) is not None:
            _close(self.fd)
            self.fd = None

    def __del__(self) -> None:
        self.close()


@dataclass
class Fetched:
    path: Path  # the local mirror
    pins: list = field(default_factory=list)
    downloaded: int = 0  # files downloaded by this call


def _verified_record(path: Path) -> Path:
    return path.parent / f".{path.name}.verified"


def _is_current(path: Path, entry: F.FileEntry) -> bool:
    rec = _verified_record(path)
    try:
        ok = rec.read_text() == f"{entry.bytes} {entry.checksum}" and os.path.getsize(path) == entry.bytes
    except OSError:
        return False
    if ok:
        os.utime(rec)  # last use, for LRU eviction
    return ok


def _write_record(path: Path, entry: F.FileEntry) -> None:
    rec = _verified_record(path)
    tmp = rec.parent / f"{rec.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.write_text(f"{entry.bytes} {entry.checksum}")
    os.replace(tmp, rec)


def _download(fs, rpath: str, url: str, local: Path, entry: F.FileEntry, label: str) -> None:
    """Stream ``rpath`` into ``local`` through a temp name, refusing any byte count or checksum but the manifest's."""
    tmp = local.parent / f".{local.name}.part-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    h, n = xxhash.xxh3_64(), 0
    try:
        try:
            src = fs.open(rpath, "rb", block_size=CHUNK_BYTES)
        except FileNotFoundError:
            raise FormatError(f"{url}: missing (listed in {label} with {entry.bytes} bytes); the upload is incomplete: "
                              "write the dataset again", file=url, expected=f"{entry.bytes} bytes", found="missing") from None
        with src, open(tmp, "wb") as dst:
            while n <= entry.bytes:
                chunk = src.read(CHUNK_BYTES)
                if not chunk:
                    break
                h.update(chunk)
                n += len(chunk)
                dst.write(chunk)
            dst.flush()
            os.fsync(dst.fileno())
        if n != entry.bytes:
            raise FormatError(f"{url}: size: expected {entry.bytes} bytes ({label}), found {'more than ' if n > entry.bytes else ''}"
                              f"{n}; refused by the cache (nothing served). The object is not the one the manifest "
                              "lists: write the dataset again", file=url, field="size", expected=entry.bytes, found=n)
        found = "xxh3_64:" + h.hexdigest()
        if found != entry.checksum:
            raise ChecksumError(f"{url}: checksum: expected {entry.checksum} ({label}), found {found}; refused by the "
                                "cache (nothing served). The object is not the one the manifest lists: write the "
                                "dataset again", file=url, field="checksum", expected=entry.checksum, found=found)
        os.replace(tmp, local)
    finally:
        if tmp.exists():
            tmp.unlink()


class _Fetcher:
    def __init__(self, storage_options, cache_dir, cache_limit) -> None:
        self.so = storage_options
        self.root = cache_root(cache_dir)
        self.limit = parse_limit(cache_limit if cache_limit is not None else os.environ.get("PACKFMT_CACHE_LIMIT"))
        self.result: Fetched | None = None

    def mirror(self, url: str) -> Path:
        _, path = uri.filesystem(url, self.so)
        return self.root / uri.root_key(url, self.so) / path.lstrip("/")

    def file(self, fs, rpath: str, url: str, local: Path, entry: F.FileEntry, label: str) -> None:
        from filelock import FileLock

        local.parent.mkdir(parents=True, exist_ok=True)
        if _is_current(local, entry):
            return
        with FileLock(str(local.parent / f".{local.name}.lock")):
            if _is_current(local, entry):  # another process fetched it while we waited
                return
            _download(fs, rpath, url, local, entry, label)
            _write_record(local, entry)
        self.result.downloaded += 1
        with open(self.root / LOG, "a") as log:
            log.write(json.dumps({"url": url, "bytes": entry.bytes, "pid": os.getpid()}) + "\n")
        if self.limit is not None:
            evict(self.root, self.limit)

    def manifest(self, fs, rpath: str, url: str) -> bytes:
        try:
            return fs.cat_file(rpath)
        except FileNotFoundError:
            raise FormatError(f"{url}: not a packfmt dataset (no {posixpath.basename(rpath)} there); check the URL, "
                              "or write one with packfmt build / merge", file=url, expected="a manifest",
                              found="missing") from None

    def dataset(self, url: str, *, packs: bool = True) -> Path:
        fs, rpath = uri.filesystem(url, self.so)
        local = self.mirror(url)
        self.result.pins.append(Pin(local))
        raw = self.manifest(fs, f"{rpath}/{F.MANIFEST}", url)
        obj = json.loads(raw)
        if obj.get("format") == "packfmt-collection":
            from ..collection.manifest import parse_collection_manifest

            for member in parse_collection_manifest(obj, file=f"{url}/{F.MANIFEST}").members:
                self.dataset(uri.join(url, member.path), packs=False)  # a collection reads its own indexes only
        else:
            for name, entry in F.parse_manifest(obj, file=f"{url}/{F.MANIFEST}").files.items():
                self.file(fs, f"{rpath}/{name}", f"{url}/{name}", local / name, entry, f"{url}/{F.MANIFEST}")
        if packs:
            self.packs(fs, rpath, url, local)
        _write_atomic(local / F.MANIFEST, raw)
        return local

    def packs(self, fs, rpath: str, url: str, local: Path) -> None:
        """Mirror every pack index under ``packs/``; drop mirrored ones the bucket no longer has."""
        remote = f"{rpath}/{F.PACKS_DIR}"
        fs.invalidate_cache(remote)
        try:
            names = sorted(posixpath.basename(p.rstrip("/")) for p in fs.ls(remote, detail=False))
        except FileNotFoundError:
            names = []
        present = set()
        for name in names:
            if name.startswith("."):
                continue
            try:
                raw = fs.cat_file(f"{remote}/{name}/{F.PACK_INDEX_JSON}")
            except FileNotFoundError:  # not a committed index (an upload in flight or a stray folder)
                continue
            present.add(name)
            label = f"{url}/{F.PACKS_DIR}/{name}/{F.PACK_INDEX_JSON}"
            idx = F.parse_pack_index_manifest(json.loads(raw), file=label)
            ldir = local / F.PACKS_DIR / name
            for fname, entry in idx.files.items():
                self.file(fs, f"{remote}/{name}/{fname}", f"{url}/{F.PACKS_DIR}/{name}/{fname}", ldir / fname, entry, label)
            _write_atomic(ldir / F.PACK_INDEX_JSON, raw)
        lpacks = local / F.PACKS_DIR
        if lpacks.is_dir():
            for p in lpacks.iterdir():
                if p.is_dir() and not p.name.startswith(".") and p.name not in present:
                    shutil.rmtree(p, ignore_errors=True)  # gone from the bucket; mapped copies stay valid on Linux


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.write_bytes(data)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fetch_dataset(url: str, storage_options: dict | None = None, cache_dir=None, cache_limit=None) -> Fetched:
    """Mirror the dataset (store or collection, with its pack indexes) at ``url`` into the cache; return it pinned."""
    f = _Fetcher(storage_options, cache_dir, cache_limit)
    f.result = Fetched(path=Path())
    f.result.path = f.dataset(url.rstrip("/"))
    if f.limit is not None and not f.result.downloaded:  # (after a download, ``file`` evicted already)
        evict(f.root, f.limit)
    return f.result


def mirror_path(url: str, storage_options: dict | None = None, cache_dir=None) -> Path:
    return _Fetcher(storage_options, cache_dir, None).mirror(url.rstrip("/"))


def mark_verified(local: Path) -> int:
    """Record every file the manifests under ``local`` list as verified (our own writer's output); return the count."""
    n = 0
    for man in [local / F.MANIFEST, *sorted(local.glob(f"{F.PACKS_DIR}/*/{F.PACK_INDEX_JSON}"))]:
        if not man.is_file():
            continue
        obj = json.loads(man.read_bytes())
        if obj.get("format") == "packfmt-collection":
            continue
        parse = F.parse_manifest if man.name == F.MANIFEST else F.parse_pack_index_manifest
        for name, entry in parse(obj, file=str(man)).files.items():
            if (man.parent / name).is_file():
                _write_record(man.parent / name, entry)
                n += 1
    return n


def _pin_dir(path: Path, root: Path) -> Path | None:
    for d in path.parents:
        if (d / PIN).exists():
            return d
        if d == root:
            return None
    return None


def evict(root: Path, limit: int) -> int:
    """Evict least recently used verified files of unpinned datasets until the cache holds <= ``limit`` bytes."""
    from filelock import FileLock

    freed = 0
    with FileLock(str(root / ".evict.lock")):
        files = []
        for rec in root.rglob(".*.verified"):
            data = rec.parent / rec.name[1:-len(".verified")]
            try:
                files.append((rec.stat().st_mtime, os.path.getsize(data), data, rec))
            except OSError:
                continue
        total = sum(f[1] for f in files)
        if total <= limit:
            return 0
        locks: dict[Path, int | None] = {}
        try:
            for _, size, data, rec in sorted(files, key=lambda f: f[0]):
                if total <= limit:
                    break
                d = _pin_dir(data, root)
                if d is not None and d not in locks:
                    fd = os.open(d / PIN, os.O_RDWR)
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        locks[d] = fd
                    except BlockingIOError:
                        os.close(fd)
                        locks[d] = None
                if d is not None and locks[d] is None:
                    continue  # some process has this dataset open
                rec.unlink(missing_ok=True)
                data.unlink(missing_ok=True)
                total -= size
                freed += size
        finally:
            for fd in locks.values():
                if fd is not None:
                    os.close(fd)
        if total > limit:
            warnings.warn(f"{root}: the cache holds {total:,} bytes, over its limit of {limit:,}: the rest belongs to "
                          "datasets open in some process on this node (raise cache_limit= / $PACKFMT_CACHE_LIMIT)",
                          stacklevel=2)
    return freed
