"""Record readers for ``packfmt build``: each source streams ``Raw(file, line, obj)`` records.

``obj`` is the record as a dict, or an :class:`~packfmt.errors.InputError` when the record
itself could not be read (malformed JSON line, undecodable text file): sources never raise for
one bad record, they hand it to the build's error policy. ``line`` is 1-based: the line of a
JSONL file, the row of a Parquet/Arrow table, the element of a JSON array (1 for a text file).

Formats (``detect_format`` picks one from the path):

- ``jsonl``: ``*.jsonl`` / ``*.ndjson`` (optionally ``.gz`` / ``.zst``), one JSON object per line.
- ``json``: ``*.json`` holding one JSON array of objects (LLaVA style; read whole).
- ``parquet``: ``*.parquet`` files, streamed batch by batch (pyarrow).
- ``hf_disk``: a folder written by ``datasets.save_to_disk`` (``state.json`` + ``data-*.arrow``),
  read with pyarrow directly (``datasets`` is not needed).
- ``text_dir``: a folder of ``*.txt`` files, one record ``{"text": ...}`` per file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator, NamedTuple, Sequence

from ..errors import InputError

__all__ = ["Raw", "FORMATS", "detect_format", "iter_records", "count_records", "missing_columns"]

FORMATS = ("jsonl", "json", "parquet", "hf_disk", "text_dir")


class Raw(NamedTuple):
    """One source record: where it came from and what it holds."""

    file: str
    line: int
    obj: dict | InputError


def detect_format(path: str | os.PathLike) -> str:
    """The source format of ``path`` from its layout and suffix (see module docstring)."""
    p = Path(path)
    if p.is_dir():
        if (p / "state.json").is_file() or (p / "dataset_dict.json").is_file():
            return "hf_disk"
        return "text_dir"
    if not p.exists():
        raise InputError(f"{p}: input not found", reason="missing_input", file=str(p), expected="a file or folder", found="missing")
    name = p.name.lower()
    for suffix in (".gz", ".zst"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    if name.endswith((".jsonl", ".ndjson")):
        return "jsonl"
    if name.endswith(".json"):
        return "json"
    if name.endswith(".parquet"):
        return "parquet"
    raise InputError(f"{p}: cannot tell the format from the name (pass fmt= one of {list(FORMATS)})",
                     reason="unknown_format", file=str(p), expected=f"one of {list(FORMATS)}", found=p.suffix or "no suffix",
                     cli=f"{p}: cannot tell the format from the name (pass --format {{{','.join(FORMATS)}}})")


def missing_columns(file: str, columns: Sequence[str] | None, names: Sequence[str]) -> InputError | None:
    """The ``missing_field`` error of every row of a table lacking requested ``columns`` (None if it has them all).

    A column absent from a table's schema is absent from every row, so the error lists the
    table's columns (a per-row "record keys" list would only show the columns that were read).
    """
    missing = [c for c in columns or () if c not in names]
    if not missing:
        return None
    what = f"{file}: no column {', '.join(map(repr, missing))}; the columns are {list(names)}"
    return InputError(f"{what}: pick one with field= or template=", reason="missing_field", file=file,
                      field=missing[0], expected=f"one of {list(names)}", found=missing[0],
                      cli=f"{what}: pick one with --field or --template")


def iter_records(paths: Sequence[str | os.PathLike], fmt: str | None = None, *, columns: Sequence[str] | None = None,
                 split: str | None = None, glob: str = "*.txt") -> Iterator[Raw]:
    """Stream the records of every input in order. ``columns`` restricts table reads to those columns."""
    from . import hf_disk, jsonl, parquet, textdir

    for path in paths:
        kind = fmt or detect_format(path)
        if kind == "jsonl":
            yield from jsonl.iter_jsonl(path)
        elif kind == "json":
            yield from jsonl.iter_json_array(path)
        elif kind == "parquet":
            yield from parquet.iter_parquet(path, columns=columns)
        elif kind == "hf_disk":
            yield from hf_disk.iter_hf_disk(path, columns=columns, split=split)
        elif kind == "text_dir":
            yield from textdir.iter_text_dir(path, glob=glob)
        else:
            raise InputError(f"{path}: unknown format {kind!r}", reason="unknown_format", file=str(path),
                             expected=f"one of {list(FORMATS)}", found=kind)


def count_records(paths: Sequence[str | os.PathLike], fmt: str | None = None, *, split: str | None = None,
                  glob: str = "*.txt") -> int | None:
    """The number of records when it is known without reading the data (tables, folders), else None."""
    from . import hf_disk, parquet, textdir

    total = 0
    for path in paths:
        kind = fmt or detect_format(path)
        if kind == "parquet":
            total += parquet.count_rows(path)
        elif kind == "hf_disk":
            total += hf_disk.count_rows(path, split=split)
        elif kind == "text_dir":
            total += textdir.count_files(path, glob=glob)
        else:
            return None
    return total
