"""Low-level file helpers shared by the writers: hashed streaming files, atomic directory publish."""

from __future__ import annotations

import errno
import os
import shutil
import time
import uuid
import warnings
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import xxhash

from .errors import DatasetExistsError

CHUNK_BYTES = 8 * 1024 * 1024


def checksum_file(path: str | os.PathLike, chunk_bytes: int = CHUNK_BYTES, on_bytes=None) -> str:
    """``"xxh3_64:<hex>"`` of a whole file, read in bounded chunks; ``on_bytes(n)`` after each chunk."""
    h = xxhash.xxh3_64()
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        if size < chunk_bytes:  # a small file (a member's 1 KB manifest): one read, no zeroed chunk buffer
            data = f.read(chunk_bytes)  # a file grown since fstat is still read whole, in the loop below
            h.update(data)
            if on_bytes is not None and data:
                on_bytes(len(data))
            if len(data) < chunk_bytes:
                return "xxh3_64:" + h.hexdigest()
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


#: O_DIRECT wants the buffer's address, the file offset and the length in multiples of the device's
#: logical block (512 or 4096 bytes): 4096 serves both.
DIRECT_ALIGN = 4096


def aligned_empty(shape, dtype, align: int = DIRECT_ALIGN) -> np.ndarray:
    """``np.empty(shape, dtype)`` whose data starts at a multiple of ``align`` bytes (a buffer
    ``HashedFile(direct=True)`` can hand to the disk as it is)."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(nbytes + align, dtype=np.uint8)
    start = -raw.ctypes.data % align
    return raw[start:start + nbytes].view(dtype).reshape(shape)


class HashedFile:
    """An append-only binary file that hashes (xxh3_64) and counts bytes as they are written.

    Writes are buffered up to ``CHUNK_BYTES`` so memory stays bounded whatever the file size.

    ``direct=True``: a large write whose buffer, length and file offset are multiples of
    ``DIRECT_ALIGN`` goes straight from the buffer to the disk (``O_DIRECT``), not through the page
    cache; the rest (a tail, a small write) is written as usual. The file must reach the disk
    before ``close`` returns either way (its fsync), so the page cache's copy only costs memory
    and time: for a file of gigabytes (``segments.bin`` at 10^8 documents) filling and flushing
    the cache takes several times longer than the disk writes. Where the file system refuses
    ``O_DIRECT`` (tmpfs before Linux 6.6, some FUSE mounts) every write is buffered; the bytes are the same.
    """

    def __init__(self, path: Path, *, direct: bool = False) -> None:
        self.path = Path(path)
        self._f = open(self.path, "wb")
        self._h = xxhash.xxh3_64()
        self._buf: list[bytes | memoryview] = []
        self._buffered = 0
        self.nbytes = 0
        self._direct = direct and hasattr(os, "O_DIRECT")  # may still be refused: see _write_direct
        self._o_direct = False  # whether the descriptor has O_DIRECT set now

    def write(self, data) -> None:
        mv = memoryview(data).cast("B") if not isinstance(data, (bytes, bytearray)) else memoryview(data)
        if mv.nbytes == 0:
            return
        self._h.update(mv)
        if mv.nbytes >= CHUNK_BYTES and self._direct:
            head = self._write_direct(mv)
            self.nbytes += head
            mv = mv[head:]
            if mv.nbytes == 0:
                return
        self.nbytes += mv.nbytes
        if mv.nbytes >= CHUNK_BYTES:  # large: write it through, no copy into the buffer
            self.flush()
            self._set_o_direct(False)
            self._f.write(mv)
            return
        self._buf.append(bytes(mv))
        self._buffered += mv.nbytes
        if self._buffered >= CHUNK_BYTES:
            self.flush()

    def _write_direct(self, mv: memoryview) -> int:
        """Write the longest aligned head of ``mv`` with O_DIRECT; return its bytes (0: none written)."""
        head = mv.nbytes - mv.nbytes % DIRECT_ALIGN
        address = np.frombuffer(mv, dtype=np.uint8).ctypes.data
        if self._buffered or self.nbytes % DIRECT_ALIGN or address % DIRECT_ALIGN or not head:
            return 0
        self._f.flush()  # nothing of the buffered writer may be left behind the direct bytes
        fd, done = self._f.fileno(), 0
        try:
            self._set_o_direct(True)
            while done < head:
                done += os.write(fd, mv[done:head])
        except OSError as exc:
            if exc.errno != errno.EINVAL or done:
                raise
            self._direct = False  # refused (file system, alignment): nothing written, buffer from now on
            self._set_o_direct(False)
            return 0
        return head

    def _set_o_direct(self, on: bool) -> None:
        if on != self._o_direct:
            import fcntl  # POSIX only, like O_DIRECT itself

            fd = self._f.fileno()
            flags = fcntl.fcntl(fd, fcntl.F_GETFL)
            fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_DIRECT if on else flags & ~os.O_DIRECT)
            self._o_direct = on

    def write_array(self, arr: np.ndarray, dtype: np.dtype) -> None:
        arr = np.ascontiguousarray(arr, dtype=dtype)
        if arr.size:
            self.write(arr.data)

    def flush(self) -> None:
        if self._buf:
            self._set_o_direct(False)
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


#: Temp directories this process created and has not yet published or removed: ``path -> owner pid``.
#: The CLI's signal handler reads it to decide whether there is anything to unwind.
_LIVE_TEMPS: dict[Path, int] = {}
#: Old copies this process has renamed aside and not yet removed (an ``overwrite`` publish in flight).
_IN_FLIGHT_OLD: set[Path] = set()

TMP_TAG, OLD_TAG = "packfmt-tmp", "packfmt-old"
#: Files whose presence makes a directory a published dataset / pack index (written last, renamed in whole).
_MARKERS = ("manifest.json", "index.json")


def temp_sibling(target: Path, tag: str = TMP_TAG) -> Path:
    """A fresh directory next to ``target`` (same file system, so rename is atomic)."""
    target = Path(target)
    tmp = target.parent / f".{target.name}.{tag}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    _LIVE_TEMPS[tmp] = os.getpid()
    return tmp


def live_temps() -> list[Path]:
    """Temp directories of this process that still exist (they need removing if the process stops now)."""
    pid = os.getpid()
    return [p for p, owner in list(_LIVE_TEMPS.items()) if owner == pid and p.exists()]


def _owner_pid(name: str, prefix: str) -> int | None:
    try:
        return int(name[len(prefix):].split("-")[0])
    except ValueError:
        return None


def _orphaned(path: Path, pid: int, registry) -> bool:
    """Left by a process that is gone: another PID that no longer runs, or ours but not in use by us
    (PIDs are reused, e.g. in containers)."""
    if pid == os.getpid():
        return path not in registry
    return not _pid_alive(pid)


def _looks_published(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink() and any((path / m).is_file() for m in _MARKERS)


def remove_stale_temps(target: Path, tag: str = TMP_TAG) -> int:
    """Clean up what interrupted publishes of ``target`` left next to it; return how many dirs were removed.

    * ``.NAME.packfmt-tmp-PID-*`` of a process that is gone: deleted (never the only copy of anything).
    * ``.NAME.packfmt-old-PID-TIME`` (a kill between the two renames of an overwrite, or during the
      removal of the old copy) of a process that is gone: deleted when ``NAME`` is in place and looks
      published (has its manifest); when ``NAME`` is missing, the newest complete old copy is renamed
      back to ``NAME`` (the overwrite never happened) and a warning says so. An old copy is never
      deleted while ``NAME`` is missing or incomplete.

    Call it before checking whether ``target`` exists, so that a restored copy counts as existing.
    """
    target = Path(target)
    parent = target.parent
    if not parent.is_dir():
        return 0
    tmp_prefix, old_prefix = f".{target.name}.{tag}-", f".{target.name}.{OLD_TAG}-"
    removed = 0
    olds: list[tuple[int, Path]] = []
    for p in parent.iterdir():
        if p.name.startswith(tmp_prefix):
            pid = _owner_pid(p.name, tmp_prefix)
            if pid is not None and _orphaned(p, pid, _LIVE_TEMPS):
                shutil.rmtree(p, ignore_errors=True)
                removed += 1
        elif p.name.startswith(old_prefix):
            pid = _owner_pid(p.name, old_prefix)
            if pid is not None and _orphaned(p, pid, _IN_FLIGHT_OLD):
                stamp = p.name[len(old_prefix):].split("-")[1:2]
                olds.append((int(stamp[0]) if stamp and stamp[0].isdigit() else 0, p))
    if olds and not (target.exists() or target.is_symlink()):
        for _, old in sorted(olds, reverse=True):  # newest first
            if _looks_published(old):
                os.rename(old, target)
                fsync_dir(parent)
                olds.remove((_, old))
                warnings.warn(f"{target}: restored from {old.name}, the copy an interrupted overwrite had renamed "
                              "aside before the new one was in place", stacklevel=2)
                break
    if olds and _looks_published(target):
        for _, old in olds:
            shutil.rmtree(old, ignore_errors=True)
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


@contextmanager
def staging(target: Path):
    """A fresh temp sibling of ``target`` to write into (then ``publish_dir``); removed if the block raises."""
    tmp = temp_sibling(target)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_durably(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` and fsync it (the JSON written last, just before the publishing rename)."""
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def publish_dir(tmp: Path, target: Path, *, overwrite: bool) -> None:
    """Atomically make ``tmp`` appear at ``target``.

    ``os.rename`` of a directory is atomic on POSIX; when ``target`` exists and overwrite is
    asked, the old directory is first renamed aside (readers holding memmaps keep valid
    mappings), then, once the new one is in place, renamed to a temp name and removed: an
    interrupted removal leaves a ``packfmt-tmp`` directory, never a half-deleted ``packfmt-old``
    one that could be restored. See ``remove_stale_temps`` for what a kill leaves behind.
    """
    tmp, target = Path(tmp), Path(target)
    fsync_dir(tmp)
    old = None
    if target.exists() or target.is_symlink():
        if not overwrite:
            raise DatasetExistsError(f"{target}: already exists (pass overwrite=True to replace it)",
                                     file=str(target), expected="no existing path", found="exists",
                                     cli=f"{target}: already exists (pass --overwrite to replace it)")
        old = target.parent / f".{target.name}.{OLD_TAG}-{os.getpid()}-{int(time.time())}"
        _IN_FLIGHT_OLD.add(old)
        os.rename(target, old)
    try:
        os.rename(tmp, target)
    except BaseException:
        if old is not None and not (target.exists() or target.is_symlink()):
            os.rename(old, target)  # put the previous copy back: the overwrite did not happen
        raise
    finally:
        _LIVE_TEMPS.pop(tmp, None)
        _IN_FLIGHT_OLD.discard(old)
    fsync_dir(target.parent)
    if old is not None:
        trash = target.parent / f".{target.name}.{TMP_TAG}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            os.rename(old, trash)
        except OSError:
            trash = old
        shutil.rmtree(trash, ignore_errors=True)
