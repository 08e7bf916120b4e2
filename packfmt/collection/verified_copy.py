"""Member files read front to back in bounded chunks, hashed as they go and checked at the end.

What a physical merge (``collection.physical``) and the carried pack indexes (``collection.carry``)
both copy with: nothing is trusted until its size and checksum match the member's manifest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import xxhash

from .. import format as F
from .._io import HashedFile
from ..errors import ChecksumError, FormatError

__all__ = ["VerifiedReader", "copy_verified", "bad_offsets"]


class VerifiedReader:
    """A file read front to back in chunks, hashed as it goes; ``close`` checks its size and checksum."""

    def __init__(self, path: Path, entry: F.FileEntry) -> None:
        self.path, self.entry = path, entry
        self._f = open(path, "rb", buffering=0)
        self._h = xxhash.xxh3_64()
        self.done = 0

    def read_into(self, buf: bytearray, n: int) -> memoryview:
        view = memoryview(buf)[:n]
        got = 0
        while got < n:
            k = self._f.readinto(view[got:])
            if not k:
                raise bad_offsets(self.path, "size", f"{self.entry.bytes} bytes (its manifest)", f"{self.done + got}")
            got += k
        self._h.update(view)
        self.done += n
        return view

    def array(self, buf: bytearray, count: int) -> np.ndarray:
        return np.frombuffer(self.read_into(buf, count * 8), dtype=F.OFFSET_DTYPE)

    def close(self) -> None:
        self._f.close()
        found = "xxh3_64:" + self._h.hexdigest()
        if self.done != self.entry.bytes or found != self.entry.checksum:
            raise ChecksumError(f"{self.path}: checksum: expected {self.entry.checksum} (its manifest), found {found}: "
                                f"the file is damaged; run `packfmt validate {self.path.parent}`",
                                file=str(self.path), field="checksum", expected=self.entry.checksum, found=found)


def copy_verified(src: VerifiedReader, out: HashedFile, buf: bytearray, on_bytes: Callable[[int], None]) -> None:
    """Stream ``src`` into ``out`` in chunks of ``len(buf)``; its checksum is checked at the end."""
    left = src.entry.bytes
    while left:
        n = min(left, len(buf))
        out.write(src.read_into(buf, n))
        left -= n
        on_bytes(n)
    src.close()


def bad_offsets(path: Path, rule: str, expected, found) -> FormatError:
    return FormatError(f"{path}: {rule}: expected {expected}, found {found}; run `packfmt validate {path.parent}`",
                       file=str(path), field=rule, expected=expected, found=found)
