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
import posixpath
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from .. import format as F
from .. import index_format as IF
from ..errors import FormatError
from . import uri
from . import verify as V
from .download import download
from .errors import require_bucket, storage_errors
from .in_flight import in_order, members_in_flight

__all__ = ["Fetched", "Pin", "cache_root", "evict", "fetch_dataset", "mark_verified", "parse_limit"]

LOG = "downloads.log"


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


class _Fetcher:
    def __init__(self, storage_options, cache_dir, cache_limit, verify=None) -> None:
        self.so = storage_options
        self.root = cache_root(cache_dir)
        self.limit = parse_limit(cache_limit if cache_limit is not None else os.environ.get("PACKFMT_CACHE_LIMIT"))
        self.mode = V.verify_mode(verify)
        self.result: Fetched | None = None
        self.count_lock = threading.Lock()

    def mirror(self, url: str) -> Path:
        _, path = uri.filesystem(url, self.so)
        return self.root / uri.root_key(url, self.so) / path.lstrip("/")

    def file(self, fs, rpath: str, url: str, local: Path, entry: F.FileEntry, label: str) -> None:
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
            st = download(fs, rpath, url, local, V.temp_path(self.root, local, "part"), entry, label)
            V.write_marker(self.root, local, entry, st)
        with self.count_lock:  # members are fetched in threads (``in_flight``)
            self.result.downloaded += 1
        with open(self.root / LOG, "a") as log:
            log.write(json.dumps({"url": url, "bytes": entry.bytes, "pid": os.getpid(), "why": why}) + "\n")
        if self.limit is not None:
            evict(self.root, self.limit)

    def manifest(self, fs, rpath: str, url: str) -> bytes:
        try:
            return fs.cat_file(rpath)
        except FileNotFoundError:
            require_bucket(fs, url, self.so)
            raise FormatError(f"{url}: not a packfmt dataset (no {posixpath.basename(rpath)} there); check the URL, "
                              "or write one with packfmt build / merge", file=url, expected="a manifest",
                              found="missing") from None

    def dataset(self, url: str, *, packs: bool = True, raw: bytes | None = None, pin: bool = True) -> Path:
        """Mirror the dataset at ``url``; ``raw``: its ``manifest.json`` as the caller just read it from the bucket
        (None: read here). ``pin``: hold a pin on its mirror folder (a collection's members are covered by the one
        pin on the folder that holds them all: one descriptor, not one a member, which at 10^5 members would pass
        the process's limit on open files)."""
        fs, rpath = uri.filesystem(url, self.so)
        local = self.mirror(url)
        if raw is None:
            raw = self.manifest(fs, f"{rpath}/{F.MANIFEST}", url)
        if pin:
            self.result.pins.append(Pin(self.root, local))
        else:
            V.ensure_dir(local)
        V.drop_legacy(local)
        obj = json.loads(raw)
        if obj.get("format") == "packfmt-collection":
            label = f"{url}/{F.MANIFEST}"
            cm = self.collection_manifest(fs, rpath, url, local, obj)  # its own files first: a member table lists the members
            urls = [uri.member_url(url, p, file=label, field=f"members[{i}].path") for i, p in enumerate(cm.members.paths)]
            if pin and urls:  # before any member is fetched: another process's eviction skips them from now on
                common = Path(os.path.commonpath([local, *{self.mirror(u).parent for u in urls}]))
                if common != local:
                    self.result.pins.append(Pin(self.root, common))
            # a collection reads its own indexes only (packs=False)
            in_order(lambda i: self.dataset(urls[i], packs=False, pin=False), len(urls), members_in_flight())
        else:
            for name, entry in F.parse_manifest(obj, file=f"{url}/{F.MANIFEST}").files.items():
                self.file(fs, f"{rpath}/{name}", f"{url}/{name}", local / name, entry, f"{url}/{F.MANIFEST}")
        if packs:
            self.packs(fs, rpath, url, local)
        self.write_atomic(local / F.MANIFEST, raw)
        return local

    def collection_manifest(self, fs, rpath: str, url: str, local: Path, obj: dict, leave: tuple[str, ...] = ()):
        """The parsed manifest ``obj`` of the collection at ``url``, with the files it lists of its own mirrored and
        verified first (``collection_files``): a member table (§2.5) is read from the mirror. ``leave``: names of
        those files left in the bucket for now (a streamed open, which reads no ``doc_lengths.bin``)."""
        from ..collection.lengths import parse_collection_files
        from ..collection.manifest import collection_reader, parse_collection_manifest
        from ..collection.versions import parse_collection_version

        label = f"{url}/{F.MANIFEST}"
        try:  # the files table alone (C1 of the whole manifest follows, from the mirrored files)
            version = parse_collection_version(obj.get("format_version"), file=label)
            files = parse_collection_files(obj, version, int(obj["counts"]["documents"]), file=label,
                                           table=obj.get("members") == "table")
        except (FormatError, KeyError, TypeError, ValueError):
            files = {}  # malformed: parse_collection_manifest names the field
        self.collection_files(fs, rpath, url, local, {k: v for k, v in files.items() if k not in leave})
        return parse_collection_manifest(obj, file=label, read=collection_reader(local))

    def collection_files(self, fs, rpath: str, url: str, local: Path, files: dict) -> None:
        """Mirror the files a collection's manifest lists of its own (``files``, spec/COLLECTION.md §2.4, §2.5),
        verified as every file, so that packing and opening it read its lengths, not every member. A
        ``doc_lengths.bin`` missing from the bucket is left out (readers then take the members' own lengths, as the
        spec allows; validate warns); a member table missing is an error (it is the member list); one that fails
        its size or checksum is refused like any listed file."""
        from ..collection.lengths import LENGTHS_FILE

        for name, entry in files.items():
            try:
                self.file(fs, f"{rpath}/{name}", f"{url}/{name}", local / name, entry, f"{url}/{F.MANIFEST}")
            except FormatError as exc:
                if exc.found != "missing" or name != LENGTHS_FILE:
                    raise
                V.forget(self.root, local / name)
                (local / name).unlink(missing_ok=True)  # an earlier copy is not this manifest's evidence

    def packs(self, fs, rpath: str, url: str, local: Path) -> None:
        """Mirror every pack index under ``packs/``; drop mirrored ones the bucket no longer has."""
        from .pack_mirror import drop_gone, mirror_pack, remote_pack_manifests

        found = remote_pack_manifests(fs, rpath)
        for name, raw in found.items():
            mirror_pack(self, fs, rpath, url, local, name, raw)
        drop_gone(self.root, local, set(found))

    def write_atomic(self, path: Path, data: bytes) -> None:
        """``data`` at ``path`` through a rename: a killed process leaves the old file or none, never part of one.
        Not fsync'd (it was, one call of three a member): this is a manifest or an ``index.json``, re-read from the
        bucket on every open of the URL (the commit point is there), so one a power loss takes costs a request, not
        data; the files it lists are fsync'd before their markers are written (``download``)."""
        V.ensure_dir(path.parent)
        tmp = V.temp_path(self.root, path, "tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)


def fetch_dataset(url: str, storage_options: dict | None = None, cache_dir=None, cache_limit=None,
                  verify: str | None = None) -> Fetched:
    """Mirror the dataset (store or collection, with its pack indexes) at ``url`` into the cache; return it pinned.

    ``verify``: ``"stat"`` (default) hashes a cached file again when its stat changed since it was verified,
    ``"full"`` on every call (also ``$PACKFMT_CACHE_VERIFY``).
    """
    url = url.rstrip("/")
    f = _Fetcher(storage_options, cache_dir, cache_limit, verify)
    f.result = Fetched(path=Path(), root=f.root)
    try:
        with storage_errors(url, storage_options, f.root):
            f.result.path = f.dataset(url)
            if f.limit is not None and not f.result.downloaded:  # (after a download, ``file`` evicted already)
                evict(f.root, f.limit)
    except BaseException:
        for pin in f.result.pins:  # nothing was opened: hold nothing (an error's traceback may live long)
            pin.close()
        raise
    return f.result


def mirror_path(url: str, storage_options: dict | None = None, cache_dir=None) -> Path:
    return _Fetcher(storage_options, cache_dir, None).mirror(url.rstrip("/"))


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
    at a time, whatever the number of datasets): a process that pins the dataset afterwards fetches the file again."""
    from filelock import FileLock

    freed = 0
    state = root / V.STATE
    with FileLock(str(state / ".evict.lock")):
        files = []
        for rec in state.rglob("*.verified"):
            data = root / rec.relative_to(state).with_name(rec.name[:-len(".verified")])
            try:
                files.append((rec.stat().st_mtime, os.path.getsize(data), data, rec))
            except OSError:
                continue
        total = sum(f[1] for f in files)
        if total <= limit:
            return 0
        known: set[Path] = set()  # folders with a pin file
        busy: set[Path] = set()  # pins some process held during this pass
        for _, size, data, rec in sorted(files, key=lambda f: f[0]):
            if total <= limit:
                break
            pins = _pins_over(rec.parent, state, known)
            if busy.intersection(pins):
                continue
            fds = _lock_all(pins)
            if fds is None:
                busy.update(d for d in pins if _held(d))  # which one: remembered for this pass
                continue
            try:
                rec.unlink(missing_ok=True)
                data.unlink(missing_ok=True)
            finally:
                for fd in fds:
                    os.close(fd)
            total -= size
            freed += size
        if total > limit:
            warnings.warn(f"{root}: the cache holds {total:,} bytes, over its limit of {limit:,}: the rest belongs to "
                          "datasets open in some process on this node (raise cache_limit= / $PACKFMT_CACHE_LIMIT)",
                          stacklevel=2)
    return freed
