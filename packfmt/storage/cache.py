"""The node-local cache of remote datasets: whole files, verified before use, fetched once per node.

Layout: ``<cache>/<root key>/<bucket>/<path>/...`` mirrors the remote tree (``uri.root_key``), so
``packfmt.open`` memory-maps the mirror as it would a local dataset and a collection's relative
member paths resolve there as in the bucket. ``<cache>`` is ``cache_dir=``, else ``$PACKFMT_CACHE``,
else ``~/.cache/packfmt``. The cache's own bookkeeping (verified markers, locks, pins, temp files)
lives under ``<cache>/.packfmt-state/`` (``verify``), never inside a mirrored dataset.

Rules (docs: README "Remote data"; spec/SECURITY.md A16):

* Never served unverified. A file is downloaded to a temp name, hashed (xxh3_64) and counted while
  it streams, compared with the ``bytes`` and ``checksum`` its manifest lists, and only then renamed
  into place; then its marker records that entry and the file's stat. On every open each file is
  served only if its marker names the current manifest entry and its stat (device, inode, mtime_ns,
  size) is unchanged; a file whose stat moved is hashed again, and re-downloaded if that fails (an
  error if the bucket's object is bad too). ``cache_verify="full"`` / ``$PACKFMT_CACHE_VERIFY=full``
  hashes every file on every open (a write that restores mtime is otherwise not seen).
* Fetched once per node. Each file is fetched under a file lock, and the check is repeated inside
  the lock, so N processes opening the same URL download it once. Every download is one JSON line
  in ``<cache>/downloads.log`` (url, bytes, pid, why).
* Manifests (``manifest.json``, ``index.json``) are re-read from the bucket on every open: they are
  the commit points, and they decide which files are current. They are written into the mirror
  after the files they list.
* Bounded. ``cache_limit=`` bytes (or ``$PACKFMT_CACHE_LIMIT``, e.g. ``200G``): after a download,
  verified files are evicted least recently used first (use = the marker's mtime, touched on every
  open) until the cache fits. Safe rule: every process that opened a dataset holds a shared
  ``flock`` on the dataset's pin for as long as the opened object lives; a pin covers its folder's tree
  (a collection opened whole pins the folder holding it and its members: one descriptor, not one a
  member). Eviction removes a file only while it holds every pin over it exclusively (taken without
  waiting, let go after the file), and skips any file it cannot lock so. So no file is evicted while any
  process on the node has its dataset open (and on Linux an unlinked file that is still
  memory-mapped would stay valid anyway). When everything over the limit is pinned, a warning says
  so and the cache stays over the limit.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from .. import format as F
from .. import index_format as IF
from . import uri
from . import verify as V
from .download import download
from .errors import evicting, eviction_error
from .remote_json import read_manifest
from .transport import as_remote, remote

__all__ = ["LOG", "LOG_CAP", "log_download", "Fetched", "Fetcher", "Origin", "Pin", "cache_root", "evict", "mark_verified", "mirror_path", "parse_limit"]

LOG = "downloads.log"
#: ``downloads.log`` is rotated past this size (its one older copy, ``downloads.log.1``, replaced): the log is inside
#: the cache's bound too (two of these at most).
LOG_CAP = 64 << 10


def log_download(root: Path, record: dict) -> None:
    """One JSON line in ``<root>/downloads.log`` (what was downloaded, how many bytes, by which process, why),
    rotated to ``downloads.log.1`` when it passes ``LOG_CAP``."""
    path = root / LOG
    line = (json.dumps(record) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)  # one write of an O_APPEND file: lines of several processes never interleave
        size = os.fstat(fd).st_size
    finally:
        os.close(fd)
    if size > LOG_CAP:
        try:
            os.replace(path, root / f"{LOG}.1")  # (processes rotating at once may drop a few lines: it is a log)
        except FileNotFoundError:
            pass


def cache_root(cache_dir=None) -> Path:
    root = cache_dir or os.environ.get("PACKFMT_CACHE") or Path.home() / ".cache" / "packfmt"
    return Path(root).expanduser().absolute()


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
    """A shared lock on a mirrored dataset (its file in the state folder): eviction skips it while this object lives."""

    def __init__(self, root: Path, directory: Path) -> None:
        state = V.state_dir(root, directory)
        V.ensure_dir(directory)
        V.ensure_dir(state)
        self.fd = os.open(state / V.PIN, os.O_RDWR | os.O_CREAT, 0o644)
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
    root: Path | None = None  # the cache folder


@dataclass(frozen=True, eq=False)
class Origin:
    """Where a dataset opened from a URL came from: handed to its constructor, kept while the object lives (its pins
    keep the cache from evicting its files), not pickled (a process that unpickles it opens the mirror by path)."""

    url: str  # the URL it was opened from, without a trailing slash
    storage_options: dict | None  # fsspec's options for it (credentials, endpoint_url ...)
    cache_root: Path  # the cache folder that mirrors it
    pins: list = field(default_factory=list)  # the pins held on its mirror (``Pin``)


class Fetcher:
    """Files at URLs into the cache's mirror, each verified against its manifest entry (the module doc's rules).

    It knows bytes, manifest entries and the cache, never a dataset: which files a dataset at a URL has, and in what
    order they are fetched, is ``packfmt.remote``'s. ``result`` collects what one fetch did: the pins it took and the
    files it downloaded."""

    def __init__(self, storage_options, cache_dir, cache_limit, verify=None) -> None:
        self.so = storage_options
        self.root = cache_root(cache_dir)
        self.limit = parse_limit(cache_limit if cache_limit is not None else os.environ.get("PACKFMT_CACHE_LIMIT"))
        self.mode = V.verify_mode(verify)
        self.result = Fetched(path=Path(), root=self.root)
        self.count_lock = threading.Lock()

    def mirror(self, url: str) -> Path:
        """Where the cache mirrors ``url`` (``<cache>/<root key>/<bucket>/<path>``)."""
        _, path = remote(url, self.so)  # (the back end of every request: no request here)
        return self.root / uri.root_key(url, self.so) / path.lstrip("/")

    def file(self, fs, rpath: str, url: str, local: Path, entry: F.FileEntry, label: str) -> None:
        """The object ``rpath`` (``url``) at ``local``, verified against ``entry`` (listed by manifest ``label``):
        served from the cache when its marker is current, else hashed again or downloaded under its file lock.
        ``fs``: a ``transport.Remote`` (a back end from ``uri.filesystem`` is put under the same rules)."""
        if V.status(self.root, local, entry, self.mode) == V.OK:
            return
        with V.locked(self.root, local):
            why = V.status(self.root, local, entry, self.mode)
            if why == V.OK:  # another process fetched it while we waited
                return
            if why == V.CHANGED:  # verified once, changed since (or cache_verify="full"): hash it again
                if V.rehash(self.root, local, entry):
                    return
                why = "changed in the cache"
            V.forget(self.root, local)  # a file without a current marker is never served, even if the download fails
            st = download(as_remote(fs, self.so), rpath, url, local, V.temp_path(self.root, local, "part"), entry,
                          label)
            V.write_marker(self.root, local, entry, st)
        with self.count_lock:  # members are fetched in threads (``in_flight``)
            self.result.downloaded += 1
        log_download(self.root, {"url": url, "bytes": entry.bytes, "pid": os.getpid(), "why": why})
        if self.limit is not None:
            evict(self.root, self.limit)

    def manifest(self, fs, rpath: str, url: str) -> bytes:
        """The bytes of the manifest at ``rpath``, read from the bucket (a commit point: never from the cache), of a
        JSON object (``manifest_json``)."""
        return self.manifest_json(fs, rpath, url)[0]

    def manifest_json(self, fs, rpath: str, url: str) -> tuple[bytes, dict]:
        """``(bytes, object)`` of the manifest at ``rpath`` of the dataset at ``url``, read from the bucket
        (``remote_json.read_json``: its size bounded before its bytes are read, then ``format.parse_json``'s rules);
        a ``FormatError`` naming the URL when it is missing, too large or not a JSON object."""
        return read_manifest(as_remote(fs, self.so), rpath, url, self.so)

    def write_atomic(self, path: Path, data: bytes) -> None:
        """``data`` at ``path`` through a rename: a killed process leaves the old file or none, never part of one.
        Not fsync'd (it was, one call of three a member): this is a manifest or an ``index.json``, re-read from the
        bucket on every open of the URL (the commit point is there), so one a power loss takes costs a request, not
        data; the files it lists are fsync'd before their markers are written (``download``)."""
        V.ensure_dir(path.parent)
        tmp = V.temp_path(self.root, path, "tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)


def mirror_path(url: str, storage_options: dict | None = None, cache_dir=None) -> Path:
    return Fetcher(storage_options, cache_dir, None).mirror(url.rstrip("/"))


def mark_verified(local: Path, cache_dir=None) -> int:
    """Hash every file the manifests under ``local`` (a mirror our writer just filled and uploaded) list and
    record the ones that match as verified; return the count. A file that does not match gets no marker
    (it is fetched from the bucket on the next open)."""
    root = cache_root(cache_dir)
    n = 0
    for man in [local / F.MANIFEST, *sorted(local.glob(f"{F.PACKS_DIR}/*/{F.PACK_INDEX_JSON}"))]:
        if not man.is_file():
            continue
        obj = json.loads(man.read_bytes())
        if obj.get("format") == "packfmt-collection":
            continue
        parse = F.parse_manifest if man.name == F.MANIFEST else IF.parse_pack_index_manifest
        for name, entry in parse(obj, file=str(man)).files.items():
            path = man.parent / name
            if path.is_file() and V.status(root, path, entry) != V.OK:
                n += V.rehash(root, path, entry)
    return n


def _pins_over(folder: Path, state: Path, known: set) -> list[Path]:
    """The pins that cover files of ``folder`` (a state folder): its own and every enclosing folder's up to ``state``
    (a pin covers its folder's tree: a collection's one pin covers its members). ``known``: the folders seen to have
    one (a pin file is never removed while its dataset is mirrored; one missing is looked for again, since a process
    may be pinning that folder right now)."""
    out = []
    for d in (folder, *folder.parents):
        if d == state:
            break
        if d in known or (d / V.PIN).exists():
            known.add(d)
            out.append(d)
    return out


def _lock_all(pins: list[Path]) -> list[int] | None:
    """Exclusive locks on every pin of ``pins``, not waiting (their descriptors), or None when some process holds one."""
    fds: list[int] = []
    for d in pins:
        fd = os.open(d / V.PIN, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            for f in fds:
                os.close(f)
            return None
        fds.append(fd)
    return fds


def _held(d: Path) -> bool:
    """Whether some process holds pin ``d`` (shared or exclusive) now."""
    fds = _lock_all([d])
    if fds is None:
        return True
    os.close(fds[0])
    return False


def evict(root: Path, limit: int) -> int:
    """Evict least recently used verified files of unpinned datasets until the cache holds <= ``limit`` bytes.

    A file is removed only while this pass holds an exclusive lock on every pin over it (``_pins_over``): none is
    held by a process that has its dataset open. The locks are taken per file and let go after it (a few descriptors
    at a time, whatever the number of datasets): a process that pins the dataset afterwards fetches the file again.
    A file that cannot be removed (a folder turned read-only) is passed over for the next; if the cache is still
    over its limit after them all because of one, that is a ``StorageError`` naming the folder (``eviction_error``),
    not a bound silently broken."""
    from filelock import FileLock

    lock = FileLock(str(root / V.STATE / ".evict.lock"))
    with evicting(root):
        lock.acquire()
    try:
        freed, total, failed = _evict_pass(root, limit)
    finally:
        lock.release()
    if total > limit and failed is not None:
        raise eviction_error(failed, root, total, limit)
    if total > limit:
        warnings.warn(f"{root}: the cache holds {total:,} bytes, over its limit of {limit:,}: the rest belongs to "
                      "datasets open in some process on this node (raise cache_limit= / $PACKFMT_CACHE_LIMIT)",
                      stacklevel=2)
    return freed


def _evict_pass(root: Path, limit: int) -> tuple[int, int, OSError | None]:
    """``evict``'s pass, under its lock: ``(bytes freed, bytes the cache holds after, the first OSError met)``."""
    state = root / V.STATE
    files = []
    for rec in state.rglob("*.verified"):
        data = root / rec.relative_to(state).with_name(rec.name[:-len(".verified")])
        try:
            files.append((rec.stat().st_mtime, os.path.getsize(data), data, rec))
        except OSError:
            continue
    total, freed, failed = sum(f[1] for f in files), 0, None
    known: set[Path] = set()  # folders with a pin file
    busy: set[Path] = set()  # pins some process held during this pass
    for _, size, data, rec in sorted(files, key=lambda f: f[0]):
        if total <= limit:
            break
        pins = _pins_over(rec.parent, state, known)
        if busy.intersection(pins):
            continue
        try:
            fds = _lock_all(pins)
        except OSError as exc:
            failed = failed or exc
            continue
        if fds is None:
            busy.update(d for d in pins if _held(d))  # which one: remembered for this pass
            continue
        try:  # (the file first: one that cannot be removed keeps its marker, and is counted by the next pass)
            data.unlink(missing_ok=True)
            rec.unlink(missing_ok=True)
        except OSError as exc:
            failed = failed or exc
            continue
        finally:
            for fd in fds:
                os.close(fd)
        total -= size
        freed += size
    return freed, total, failed
