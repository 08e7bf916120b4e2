"""JSON Lines files (optionally .gz/.zst compressed): one record per non-blank line."""

from __future__ import annotations

import gzip
import io
import json
import os
from pathlib import Path
from typing import Iterator

from ..errors import InputError
from .record import Raw


def open_binary(path: Path):
    name = path.name.lower()
    if name.endswith(".gz"):
        return gzip.open(path, "rb")
    if name.endswith(".zst"):
        import zstandard

        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), closefd=True))
    return open(path, "rb")


def parse_line(raw: bytes, file: str, line: int) -> dict | InputError:
    """One JSONL line -> dict, or the InputError describing why not (never raises)."""
    try:
        obj = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        return InputError(f"{file}:{line}: malformed JSON ({exc})", reason="malformed_json", file=file, line=line,
                          expected="one JSON object per line", found="unparseable line")
    if not isinstance(obj, dict):
        return InputError(f"{file}:{line}: expected a JSON object, found {type(obj).__name__}", reason="not_an_object",
                          file=file, line=line, expected="JSON object", found=type(obj).__name__)
    return obj


def iter_jsonl(path: str | os.PathLike) -> Iterator[Raw]:
    """Stream one record per non-blank line (blank lines separate nothing and are not records)."""
    p = Path(path)
    file = str(p)
    with open_binary(p) as f:
        for line, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            yield Raw(file, line, parse_line(raw, file, line))


def read(path: str | os.PathLike, opts) -> Iterator[Raw]:
    return iter_jsonl(path)


def count(path: str | os.PathLike, opts) -> None:
    return None  # known only by reading the file
