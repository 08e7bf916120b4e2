"""What the cache knows about each mirrored file, kept outside the mirror: verified markers, locks, pins.

A file mirrored at ``<cache>/<key>/<bucket>/<path>/NAME`` has its bookkeeping at
``<cache>/.packfmt-state/<key>/<bucket>/<path>/``: ``NAME.verified`` (its marker), ``NAME.lock`` (the file
lock of its download), download temp files, and the dataset's ``.packfmt-pin``. The mirror holds
dataset files only, so ``packfmt validate`` of a URL sees exactly what the bucket holds.

A marker is one line ``<bytes> <checksum> <dev> <ino> <mtime_ns> <ctime_ns> <size>``: the manifest
entry the file was hashed against and the file's ``stat`` right after that hash. A file is served
without hashing only while its marker names the current manifest entry and its stat still matches:
any write through the file system changes mtime and ctime, a replaced file has another inode, and
ctime cannot be set back (``touch -d`` / ``os.utime`` restore mtime, and set ctime to now).
Otherwise it is hashed again. The honest limit: bytes that change without the file system knowing
(bit rot on the disk, a raw write to the block device, a file system that does not keep ctime) are
not seen without hashing; ``verify="full"`` (``$PACKFMT_CACHE_VERIFY=full``) hashes on every open.
"""

from __future__ import annotations

import fcntl
import os
import re
import uuid
from contextlib import contextmanager
from pathlib import Path

from .. import format as F
from .._io import checksum_file
from ..errors import ChecksumError

__all__ = ["STATE", "PIN", "OK", "CHANGED", "ABSENT", "state_dir", "marker", "status", "write_marker", "rehash",
           "forget", "temp_path", "lock_path", "locked", "ensure_dir", "verify_mode", "cache_of", "check_dir",
           "check_own_files", "drop_legacy"]

STATE, PIN = ".packfmt-state", ".packfmt-pin"
_KEY = re.compile(r"^[a-z][a-z0-9+.-]*-[0-9a-f]{16}\Z")  # uri.root_key
OK, CHANGED, ABSENT = "ok", "changed", "absent"
MODES = ("stat", "full")
FETCHED = "fetched"  # internal: the mirror open that follows a fetch (its files were just checked)


def verify_mode(value=None) -> str:
    """``"stat"`` (default: hash when the stat changed) or ``"full"`` (hash on every open); from ``$PACKFMT_CACHE_VERIFY``."""
    if value == FETCHED:
        return value
    mode = (value or os.environ.get("PACKFMT_CACHE_VERIFY") or "stat").strip().lower()
    if mode not in MODES:
        raise ValueError(f"cache_verify: expected one of {MODES} (or $PACKFMT_CACHE_VERIFY), found {value or mode!r}")
    return mode


def state_dir(root: Path, local_dir: Path) -> Path:
    """The bookkeeping folder of mirror folder ``local_dir`` (``root / .packfmt-state / <same relative path>``);
    a ValueError when ``local_dir`` is not under ``root``. (Strings, not ``relative_to``: a streamed read of tiny
    members asks this a dozen times a member.)"""
    r, d = os.fspath(root), os.fspath(local_dir)
    if d.startswith(r) and d[len(r):len(r) + 1] == "/" and "/../" not in d and not d.endswith("/.."):
        return Path(f"{r}/{STATE}{d[len(r):]}")
    return Path(root) / STATE / Path(local_dir).relative_to(root)


def ensure_dir(d: Path) -> Path:
    """``d`` made if missing (one system call when it exists, the usual case)."""
    try:
        os.mkdir(d)
    except FileExistsError:
        pass
    except FileNotFoundError:
        os.makedirs(d, exist_ok=True)
    return d


def marker(root: Path, local: Path) -> Path:
    return state_dir(root, local.parent) / f"{local.name}.verified"


def temp_path(root: Path, local: Path, what: str) -> Path:
    """A fresh temp name for ``local`` in its state folder (same file system: renamed into place)."""
    d = ensure_dir(state_dir(root, local.parent))
    return d / f"{local.name}.{what}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def lock_path(root: Path, local: Path) -> Path:
    """The file lock that serialises fetching ``local`` across the processes of a node."""
    return ensure_dir(state_dir(root, local.parent)) / f"{local.name}.lock"


@contextmanager
def locked(root: Path, local: Path):
    """Hold the file lock of ``local`` (``lock_path``): an exclusive ``flock`` on its own descriptor, so that the
    processes of a node, and the threads of one (each open is its own lock owner), fetch a file one at a time."""
    fd = os.open(lock_path(root, local), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # (closing lets go of the lock)


def _stat_key(st: os.stat_result) -> str:
    return f"{st.st_dev} {st.st_ino} {st.st_mtime_ns} {st.st_ctime_ns} {st.st_size}"


def status(root: Path, local: Path, entry: F.FileEntry, mode: str = "stat") -> str:
    """``OK``: verified against ``entry`` and unchanged since; ``CHANGED``: verified against ``entry`` once but
    its stat moved (or ``mode == "full"``): hash it again; ``ABSENT``: no file, or no marker for this entry."""
    rec = marker(root, local)
    try:
        fd = os.open(rec, os.O_RDONLY)
        try:
            words = os.read(fd, 4096).decode().split(" ", 2)
        finally:
            os.close(fd)
        st = os.stat(local)
    except (OSError, ValueError):
        return ABSENT
    if len(words) != 3 or words[:2] != [str(entry.bytes), entry.checksum]:
        return ABSENT
    if mode == "full" or words[2] != _stat_key(st) or st.st_size != entry.bytes:
        return CHANGED
    os.utime(rec)  # last use, for LRU eviction
    return OK


def write_marker(root: Path, local: Path, entry: F.FileEntry, st: os.stat_result | None = None) -> None:
    """Record that ``local`` (whose stat was ``st`` when it was hashed) matches ``entry``."""
    st = st or os.stat(local)
    tmp = temp_path(root, local, "verified")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, f"{entry.bytes} {entry.checksum} {_stat_key(st)}".encode())
    finally:
        os.close(fd)
    os.replace(tmp, tmp.with_name(f"{local.name}.verified"))


def rehash(root: Path, local: Path, entry: F.FileEntry) -> bool:
    """Hash ``local`` again; True (marker renewed) when it still matches ``entry``, else False (file and marker removed)."""
    before = os.stat(local)
    ok = before.st_size == entry.bytes and checksum_file(local) == entry.checksum
    if ok and _stat_key(os.stat(local)) == _stat_key(before):  # not written to while we hashed
        write_marker(root, local, entry, before)
        return True
    forget(root, local)
    return False


def forget(root: Path, local: Path) -> None:
    """Remove a mirrored file and its marker (marker first: a file without one is never served)."""
    marker(root, local).unlink(missing_ok=True)
    local.unlink(missing_ok=True)


def cache_of(path: Path) -> Path | None:
    """The cache folder whose mirror holds ``path`` (``<cache>/<key>/...`` beside ``<cache>/.packfmt-state/<key>``)."""
    path = Path(path).absolute()
    for a in path.parents:
        rel = path.relative_to(a).parts
        if _KEY.match(rel[0]) and (a / STATE / rel[0]).is_dir():
            return a
    return None


def check_own_files(root: Path, d: str, mode: str) -> None:
    """``check_dir`` of mirror folder ``d``'s own files (not its pack indexes: a collection reads no member's), as
    strings and ``os`` calls: at 10^5 members of a collection this runs once a member on every local open of the
    mirror. A file whose stat moved (or every file, ``mode == "full"``) takes ``check_dir``'s path."""
    rel = os.path.relpath(d, root)
    if rel == os.pardir or rel.startswith(os.pardir + os.sep):  # outside this cache: no marker of it here
        return
    sd = f"{root}/{STATE}/{rel}/"
    try:
        names = [n for n in os.listdir(sd) if n.endswith(".verified")]
    except OSError:
        return
    for name in names:
        rec, local = sd + name, f"{d}/{name[:-9]}"  # 9: len(".verified")
        try:
            fd = os.open(rec, os.O_RDONLY)
            try:
                words = os.read(fd, 4096).decode().split(" ", 2)
            finally:
                os.close(fd)
            st = os.stat(local)
            same = mode != "full" and len(words) == 3 and words[2] == _stat_key(st) and st.st_size == int(words[0])
        except (OSError, ValueError):
            continue  # no file or an unreadable marker: never served (the reader finds the file missing)
        if same:
            os.utime(rec)  # last use, for LRU eviction
        else:
            check_dir(root, Path(d), mode, only=name)


def check_dir(root: Path, d: Path, mode: str, only: str | None = None) -> None:
    """Every verified file of mirror folder ``d`` (and of its pack indexes) hashed again if its stat moved."""
    try:
        sd = state_dir(root, Path(os.path.normpath(d)))
    except ValueError:  # a member outside this cache holds no marker of it
        return
    recs = [sd / only] if only else [*sd.glob("*.verified"), *sd.glob(f"{F.PACKS_DIR}/*/*.verified")]
    for rec in recs:
        local = root / rec.relative_to(root / STATE).with_name(rec.name[:-len(".verified")])
        try:
            size, checksum = rec.read_text().split(" ")[:2]
            entry = F.FileEntry(local.name, int(size), checksum)
        except (OSError, ValueError):
            continue
        if status(root, local, entry, mode) != CHANGED:
            continue
        with locked(root, local):
            if status(root, local, entry, mode) == CHANGED and not rehash(root, local, entry):
                raise ChecksumError(f"{local}: changed in the cache after it was verified (checksum no longer "
                                    f"{checksum}); removed, nothing served. Open the dataset's URL again to fetch "
                                    "it anew", file=str(local), field="checksum", expected=checksum,
                                    found="another checksum")


def drop_legacy(d: Path) -> None:
    """Remove the bookkeeping files packfmt <= 0.1 kept inside the mirror (``.NAME.verified``, ``.NAME.lock``,
    ``.packfmt-pin``): dataset file names never start with a dot, and validate would report them."""
    for p in d.glob(".*"):
        if p.is_file() and (p.name == PIN or p.name.endswith((".verified", ".lock"))):
            p.unlink(missing_ok=True)
