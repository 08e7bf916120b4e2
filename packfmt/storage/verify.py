"""What the cache knows about each mirrored file, kept outside the mirror: verified markers, locks, pins.

A file mirrored at ``<cache>/<key>/<bucket>/<path>/NAME`` has its bookkeeping at
``<cache>/.state/<key>/<bucket>/<path>/``: ``NAME.verified`` (its marker), ``NAME.lock`` (the file
lock of its download), download temp files, and the dataset's ``.packfmt-pin``. The mirror holds
dataset files only, so ``packfmt validate`` of a URL sees exactly what the bucket holds.

A marker is one line ``<bytes> <checksum> <dev> <ino> <mtime_ns> <size>``: the manifest entry the
file was hashed against and the file's ``stat`` right after that hash. A file is served without
hashing only while its marker names the current manifest entry and its stat still matches (any
ordinary write changes mtime, a replaced file has another inode). Otherwise it is hashed again.
The honest limit: a write that keeps size and restores mtime (``touch -d``, ``os.utime``) is not
seen without hashing; ``verify="full"`` (``$PACKFMT_CACHE_VERIFY=full``) hashes on every open.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from .. import format as F
from .._io import checksum_file

__all__ = ["STATE", "PIN", "OK", "CHANGED", "ABSENT", "state_dir", "marker", "status", "write_marker", "rehash",
           "forget", "temp_path", "lock_path", "verify_mode"]

STATE, PIN = ".state", ".packfmt-pin"
OK, CHANGED, ABSENT = "ok", "changed", "absent"
MODES = ("stat", "full")


def verify_mode(value=None) -> str:
    """``"stat"`` (default: hash when the stat changed) or ``"full"`` (hash on every open); from ``$PACKFMT_CACHE_VERIFY``."""
    mode = (value or os.environ.get("PACKFMT_CACHE_VERIFY") or "stat").strip().lower()
    if mode not in MODES:
        raise ValueError(f"cache_verify: expected one of {MODES} (or $PACKFMT_CACHE_VERIFY), found {value or mode!r}")
    return mode


def state_dir(root: Path, local_dir: Path) -> Path:
    """The bookkeeping folder of mirror folder ``local_dir`` (``root / .state / <same relative path>``)."""
    return root / STATE / Path(local_dir).relative_to(root)


def marker(root: Path, local: Path) -> Path:
    return state_dir(root, local.parent) / f"{local.name}.verified"


def temp_path(root: Path, local: Path, what: str) -> Path:
    """A fresh temp name for ``local`` in its state folder (same file system: renamed into place)."""
    d = state_dir(root, local.parent)
    d.mkdir(parents=True, exist_ok=True)
    return d / f"{local.name}.{what}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def lock_path(root: Path, local: Path) -> Path:
    """The file lock that serialises fetching ``local`` across the processes of a node."""
    d = state_dir(root, local.parent)
    d.mkdir(parents=True, exist_ok=True)
    return d / f"{local.name}.lock"


def _stat_key(st: os.stat_result) -> str:
    return f"{st.st_dev} {st.st_ino} {st.st_mtime_ns} {st.st_size}"


def status(root: Path, local: Path, entry: F.FileEntry, mode: str = "stat") -> str:
    """``OK``: verified against ``entry`` and unchanged since; ``CHANGED``: verified against ``entry`` once but
    its stat moved (or ``mode == "full"``): hash it again; ``ABSENT``: no file, or no marker for this entry."""
    try:
        words = marker(root, local).read_text().split(" ", 2)
        st = os.stat(local)
    except (OSError, ValueError):
        return ABSENT
    if len(words) != 3 or words[:2] != [str(entry.bytes), entry.checksum]:
        return ABSENT
    if mode == "full" or words[2] != _stat_key(st) or st.st_size != entry.bytes:
        return CHANGED
    os.utime(marker(root, local))  # last use, for LRU eviction
    return OK


def write_marker(root: Path, local: Path, entry: F.FileEntry, st: os.stat_result | None = None) -> None:
    """Record that ``local`` (whose stat was ``st`` when it was hashed) matches ``entry``."""
    st = st or os.stat(local)
    tmp = temp_path(root, local, "verified")
    tmp.write_text(f"{entry.bytes} {entry.checksum} {_stat_key(st)}")
    os.replace(tmp, marker(root, local))


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
