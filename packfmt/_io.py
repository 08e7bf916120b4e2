"""Low-level file helpers shared by the writers: hashed streaming files, atomic directory publish."""

from __future__ import annotations

import os
import shutil
import time
import uuid
from pathlib import Path

import numpy as np
import xxhash

from .errors import DatasetExistsError

CHUNK_BYTES = 8 * 1024 * 1024


def checksum_file(path: str | os.PathLike, chunk_bytes: int = CHUNK_BYTES, on_bytes=None) -> str:
    """``"xxh3_64:<hex>"`` of a whole file, read in bounded chunks; ``on_bytes(n)`` after each chunk."""
    h = xxhash.xxh3_64()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(chunk_bytes)
        view = memoryview(buf)
        while True:
            n = f.readinto(buf)
            if not n:
                break
            h.update(view[:n])
            if on_bytes is not None:
                on_bytes(n)
    return "xxh3_64:" + h.hexdigest()


class HashedFile:
    """An append-only binary file that hashes (xxh3_64) and counts bytes as they are written.

    Writes are buffered up to ``CHUNK_BYTES`` so memory stays bounded whatever the file size.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._f = open(self.path, "wb")
        self._h = xxhash.xxh3_64()
        self._buf: list[bytes | memoryview] = []
        self._buffered = 0
        self.nbytes = 0

    def write(self, data) -> None:
        mv = memoryview(data).cast("B") if not isinstance(data, (bytes, bytearray)) else memoryview(data)
        if mv.nbytes == 0:
            return
        self._h.update(mv)
        self.nbytes += mv.nbytes
        if mv.nbytes >= CHUNK_BYTES:  # large: write it through, no copy into the buffer
            self.flush()
            self._f.write(mv)
            return
        self._buf.append(bytes(mv))
        self._buffered += mv.nbytes
        if self._buffered >= CHUNK_BYTES:
            self.flush()

    def write_array(self, arr: np.ndarray, dtype: np.dtype) -> None:
        arr = np.ascontiguousarray(arr, dtype=dtype)
        if arr.size:
            self.write(arr.data)

    def flush(self) -> None:
        if self._buf:
            self._f.write(b"".join(self._buf))
            self._buf.clear()
            self._buffered = 0

    def close(self) -> dict:
        """Flush, fsync, close; return the manifest ``files`` entry."""
        self.flush()
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()
        return {"bytes": self.nbytes, "checksum": "xxh3_64:" + self._h.hexdigest()}

    def abort(self) -> None:
        try:
            self._f.close()
        except Exception:
            pass


def temp_sibling(target: Path, tag: str = "packfmt-tmp") -> Path:
    """A fresh directory next to ``target`` (same file system, so rename is atomic)."""
    target = Path(target)
    tmp = target.parent / f".{target.name}.{tag}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    return tmp


def remove_stale_temps(target: Path, tag: str = "packfmt-tmp") -> int:
    """Remove temp directories left next to ``target`` by builds whose process is gone."""
    target = Path(target)
    removed = 0
    if not target.parent.exists():
        return 0
    prefix = f".{target.name}.{tag}-"
    for p in target.parent.iterdir():
        if not p.name.startswith(prefix):
            continue
        try:
            pid = int(p.name[len(prefix):].split("-")[0])
        except ValueError:
            continue
        if pid != os.getpid() and not _pid_alive(pid):
            shutil.rmtree(p, ignore_errors=True)
            removed += 1
    return removed


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def publish_dir(tmp: Path, target: Path, *, overwrite: bool) -> None:
    """Atomically make ``tmp`` appear at ``target``.

    ``os.rename`` of a directory is atomic on POSIX; when ``target`` exists and overwrite is
    asked, the old directory is first renamed aside (readers holding memmaps keep valid
    mappings) and removed after the new one is in place.
    """
    tmp, target = Path(tmp), Path(target)
    fsync_dir(tmp)
    old = None
    if target.exists() or target.is_symlink():
        if not overwrite:
            raise DatasetExistsError(f"{target}: already exists (pass overwrite=True / --overwrite to replace it)",
                                     file=str(target), expected="no existing path", found="exists")
        old = target.parent / f".{target.name}.packfmt-old-{os.getpid()}-{int(time.time())}"
        os.rename(target, old)
    os.rename(tmp, target)
    fsync_dir(target.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
