"""Files mapped read-only with the size the layout gives them (spec §3: every size is derived, never trusted).

The one place a store's or a pack index's file becomes an array: ``map_file`` checks the exact size
first, ``check_files_table`` checks a manifest's ``files`` table against the disk and the layout.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from . import format as F
from .errors import FormatError

__all__ = ["map_file", "map_bytes", "check_files_table"]


def map_file(path: Path, dtype: np.dtype, shape: tuple[int, ...], *, file: str) -> np.ndarray:
    """Read-only memmap of a whole file with an exact expected size (empty files -> empty arrays)."""
    expected = F.nbytes_of(dtype, shape)
    try:
        found = os.path.getsize(path)
    except FileNotFoundError:
        raise FormatError(f"{file}: missing (expected {expected} bytes of {np.dtype(dtype).str} {shape})",
                          file=file, field="file", expected=f"{expected} bytes", found="missing") from None
    if found != expected:
        raise FormatError(f"{file}: size: expected {expected} bytes ({np.dtype(dtype).str} x {shape}), found {found}",
                          file=file, field="size", expected=expected, found=found)
    if expected == 0:
        arr = np.empty(shape, dtype=dtype)
        arr.flags.writeable = False
        return arr
    # a str, not a Path: np.memmap resolves a Path (an lstat per component), ~3/4 of mapping a small file
    return np.memmap(os.fspath(path), dtype=dtype, mode="r", shape=shape)


def map_bytes(path: str | os.PathLike) -> np.ndarray:
    """Read-only uint8 memmap of a whole file, whatever its size (an empty array for an empty file): bytes to
    check and then use in place. Unlike ``read()``, nothing is copied and nothing is held in the process's
    private memory (the pages are the page cache's: 8 GB of ``doc_lengths.bin`` at 10^9 documents stay
    shared by every DataLoader worker). Raises ``FileNotFoundError`` when absent."""
    path = os.fspath(path)
    size = os.path.getsize(path)
    if size == 0:
        arr = np.empty(0, dtype=np.uint8)
        arr.flags.writeable = False
        return arr
    return np.memmap(path, dtype=np.uint8, mode="r", shape=(size,))


def check_files_table(root: str | os.PathLike, files: dict[str, F.FileEntry], layout: dict, *, where: str) -> None:
    """Every listed file exists with its recorded size; the size agrees with the layout."""
    for name, entry in files.items():
        p = os.path.join(root, name)  # a str: a Path join parses its parts (a tenth of a member's open)
        label = f"{where}{name}"
        try:
            size = os.path.getsize(p)
        except FileNotFoundError:
            raise FormatError(f"{label}: missing (listed in the manifest with {entry.bytes} bytes)",
                              file=label, field="file", expected=f"{entry.bytes} bytes", found="missing") from None
        if size != entry.bytes:
            raise FormatError(f"{label}: size: expected {entry.bytes} bytes (manifest), found {size}",
                              file=label, field="size", expected=entry.bytes, found=size)
        if name in layout:
            dtype, shape = layout[name]
            want = F.nbytes_of(dtype, shape)
            if want != entry.bytes:
                raise FormatError(f"{label}: size: expected {want} bytes ({np.dtype(dtype).str} x {shape} from the counts), "
                                  f"found {entry.bytes} recorded", file=label, field="bytes", expected=want, found=entry.bytes)
