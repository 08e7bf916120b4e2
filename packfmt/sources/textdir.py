"""A folder of plain-text files: one record ``{"text": <file content>, "path": <relative path>}`` per file.

Files are visited recursively in bytewise order of their relative paths. Files ending in ``.gz``
are decompressed (at most ``MAX_TEXT_BYTES`` of text per file). A file that is not UTF-8 is a bad
record (``undecodable_text``), not a crash.
"""

from __future__ import annotations

import gzip
import os
import zlib
from pathlib import Path
from typing import Iterator

from ..errors import InputError
from .record import Raw

#: Largest text taken from one file (bytes, after decompression).
MAX_TEXT_BYTES = 256 * 1024 * 1024


def text_files(root: str | os.PathLike, glob: str = "*.txt") -> list[Path]:
    return sorted((p for p in Path(root).rglob(glob) if p.is_file()), key=lambda p: str(p.relative_to(root)).encode())


def count_files(root: str | os.PathLike, glob: str = "*.txt") -> int:
    return len(text_files(root, glob))


def _read(path: Path) -> bytes:
    if path.suffix != ".gz":
        if path.stat().st_size > MAX_TEXT_BYTES:
            raise InputError(f"{path}: larger than {MAX_TEXT_BYTES} bytes", reason="text_too_large", file=str(path),
                             expected=f"<= {MAX_TEXT_BYTES} bytes", found=path.stat().st_size)
        return path.read_bytes()
    try:
        with gzip.open(path, "rb") as f:
            data = f.read(MAX_TEXT_BYTES + 1)
    except (OSError, EOFError, zlib.error) as exc:
        raise InputError(f"{path}: cannot decompress ({exc})", reason="undecodable_text", file=str(path),
                         expected="gzip text", found=type(exc).__name__) from None
    if len(data) > MAX_TEXT_BYTES:
        raise InputError(f"{path}: more than {MAX_TEXT_BYTES} bytes once decompressed", reason="text_too_large",
                         file=str(path), expected=f"<= {MAX_TEXT_BYTES} bytes", found="more")
    return data


def iter_text_dir(root: str | os.PathLike, *, glob: str = "*.txt") -> Iterator[Raw]:
    for path in text_files(root, glob):
        file = str(path)
        try:
            text = _read(path).decode("utf-8")
        except InputError as exc:
            exc.line = 1
            yield Raw(file, 1, exc)
            continue
        except UnicodeDecodeError as exc:
            yield Raw(file, 1, InputError(f"{file}: not valid UTF-8 ({exc})", reason="undecodable_text", file=file,
                                          line=1, expected="UTF-8 text", found="invalid bytes"))
            continue
        yield Raw(file, 1, {"text": text, "path": str(path.relative_to(root))})


def read(root: str | os.PathLike, opts) -> Iterator[Raw]:
    return iter_text_dir(root, glob=opts.glob)


def count(root: str | os.PathLike, opts) -> int:
    return count_files(root, opts.glob)
