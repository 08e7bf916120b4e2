"""A JSON file holding one array of objects (LLaVA style, e.g. a 665k-record ``llava_v1_5_mix665k.json``).

Parsed incrementally with ``ijson`` (its C backend when built): one element at a time, so memory
stays bounded by the largest element, not the file. Element ``k`` (1-based) is the record's
``line``. A file holding one JSON object is one record. A syntax error ends the file: the elements
before it are records, the error is one bad record (``malformed_json``) at the element it hit.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Iterator

from ..errors import InputError
from .record import Raw
from .jsonl import open_binary


def _first_byte(f) -> bytes:
    """The first non-whitespace byte of a binary stream (consumed from a peekable prefix)."""
    head = f.peek(64) if hasattr(f, "peek") else b""
    stripped = head.lstrip()
    return stripped[:1] if stripped else b""


def _malformed(file: str, k: int, exc: Exception) -> InputError:
    return InputError(f"{file}: element {k}: malformed JSON ({exc})", reason="malformed_json", file=file, line=k,
                      expected="a JSON array of objects", found="unparseable text")


def iter_json_array(path: str | os.PathLike) -> Iterator[Raw]:
    import ijson

    p = Path(path)
    file = str(p)
    with open_binary(p) as f:
        f = f if hasattr(f, "peek") else io.BufferedReader(f)
        first = _first_byte(f)
        if first == b"{":  # one object: one record
            try:
                obj = next(ijson.items(f, "", use_float=True))
            except (ijson.JSONError, StopIteration, UnicodeDecodeError) as exc:
                yield Raw(file, 1, _malformed(file, 1, exc))
                return
            yield Raw(file, 1, obj)
            return
        if first != b"[":
            found = first.decode("latin-1") or "an empty file"
            yield Raw(file, 1, InputError(f"{file}: expected a JSON array, found {found!r} first", reason="not_an_object",
                                          file=file, line=1, expected="JSON array", found=found))
            return
        k = 0
        try:
            for obj in ijson.items(f, "item", use_float=True):
                k += 1
                if isinstance(obj, dict):
                    yield Raw(file, k, obj)
                else:
                    yield Raw(file, k, InputError(f"{file}: element {k}: expected a JSON object, found "
                                                  f"{type(obj).__name__}", reason="not_an_object", file=file, line=k,
                                                  expected="JSON object", found=type(obj).__name__))
        except (ijson.JSONError, UnicodeDecodeError) as exc:
            yield Raw(file, k + 1, _malformed(file, k + 1, exc))


def read(path: str | os.PathLike, opts) -> Iterator[Raw]:
    return iter_json_array(path)


def count(path: str | os.PathLike, opts) -> None:
    return None  # known only by parsing the file
