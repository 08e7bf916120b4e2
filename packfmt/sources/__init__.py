"""Record readers for ``packfmt build``: each source streams ``Raw(file, line, obj)`` records.

``obj`` is the record as a dict, or an :class:`~packfmt.errors.InputError` when the record
itself could not be read (malformed JSON line, undecodable text file): sources never raise for
one bad record, they hand it to the build's error policy. ``line`` is 1-based: the line of a
JSONL file, the row of a Parquet/Arrow table, the element of a JSON array, the sample of a tar
shard (1 for a text file).

One interface: a source is one module of this package (named in ``SOURCES``) with

- ``read(input, opts: ReadOptions) -> Iterator[Raw]``: the records, streamed (bounded memory);
- ``count(input, opts) -> int | None``: the number of records when known without reading the data;
- ``describe(input, opts) -> dict`` (optional): extra build-report keys (e.g. the split read).

Every source's records reach the writer the same way (``pipeline.run_build``), so adding a source
is adding one module and one ``SOURCES`` entry. Formats (``detect_format`` picks one from the path):

- ``jsonl``: ``*.jsonl`` / ``*.ndjson`` (optionally ``.gz`` / ``.zst``), one JSON object per line.
- ``json``: ``*.json`` holding one JSON array of objects (LLaVA style), parsed incrementally.
- ``parquet``: ``*.parquet`` files, streamed batch by batch (pyarrow).
- ``hf_disk``: a folder written by ``datasets.save_to_disk`` (``state.json`` + ``data-*.arrow``),
  read with pyarrow directly (``datasets`` is not needed).
- ``text_dir``: a folder of ``*.txt`` files, one record ``{"text": ...}`` per file.
- ``webdataset``: ``*.tar`` shards of ``{key.json, key.jpg|png|...}`` samples (``sources.wds``).
- ``hf``: a dataset already in the local Hugging Face cache, by name (never downloaded), or an
  in-memory ``datasets.Dataset`` / ``IterableDataset`` / ``DatasetDict`` (Python API only).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Iterator, Sequence

from ..errors import InputError
from .record import Raw, ReadOptions, is_path, missing_columns

__all__ = ["Raw", "ReadOptions", "FORMATS", "SOURCES", "detect_format", "remote_format", "iter_records", "count_records",
           "describe_sources", "missing_columns"]

#: format name -> module of this package implementing it (``read`` / ``count`` / ``describe``).
SOURCES = {"jsonl": "jsonl", "json": "jsonarray", "parquet": "parquet", "hf_disk": "hf_disk",
           "text_dir": "textdir", "webdataset": "wds", "hf": "hf"}
FORMATS = tuple(SOURCES)


def detect_format(path: Any) -> str:
    """The source format of ``path`` from its layout and suffix (see module docstring)."""
    if not is_path(path):
        from . import hf

        if hf.is_dataset_object(path):
            return "hf"
        raise InputError(f"input {type(path).__name__}: expected a path or a datasets.Dataset / IterableDataset / "
                         "DatasetDict", reason="unknown_format", expected="a path or a datasets object",
                         found=type(path).__name__)
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
    if name.endswith(".tar"):
        return "webdataset"
    raise InputError(f"{p}: cannot tell the format from the name (pass fmt= one of {list(FORMATS)})",
                     reason="unknown_format", file=str(p), expected=f"one of {list(FORMATS)}", found=p.suffix or "no suffix",
                     cli=f"{p}: cannot tell the format from the name (pass --format {{{','.join(FORMATS)}}})")


def remote_format(url: str) -> str:
    """The source format of a file in object storage, from its name (a remote folder is refused)."""
    name = url.rstrip("/").rsplit("/", 1)[-1].lower()
    for suffix in (".gz", ".zst"):
        name = name.removesuffix(suffix)
    for ends, kind in ((".jsonl", "jsonl"), (".ndjson", "jsonl"), (".json", "json"), (".parquet", "parquet"),
                       (".tar", "webdataset")):
        if name.endswith(ends):
            return kind
    raise InputError(f"{url}: cannot tell the format from the name; with --engine ray an input in object storage is "
                     "a .jsonl/.ndjson/.json/.parquet/.tar file (a folder: list its files, or build with --engine "
                     "local)", reason="unknown_format", file=url, expected="a .jsonl, .json, .parquet or .tar object",
                     found=name)


def source_module(kind: str, inp: Any = None):
    """The module implementing format ``kind`` (InputError naming the formats for an unknown one)."""
    if kind not in SOURCES:
        file = str(inp) if is_path(inp) else None
        raise InputError(f"{inp}: unknown format {kind!r}; the formats are {list(FORMATS)}", reason="unknown_format",
                         file=file, expected=f"one of {list(FORMATS)}", found=kind)
    return importlib.import_module(f"{__name__}.{SOURCES[kind]}")


def _sources(inputs: Sequence[Any], fmt: str | None):
    for inp in inputs:
        kind = "hf" if not is_path(inp) else fmt or detect_format(inp)
        yield inp, kind, source_module(kind, inp)


def iter_records(inputs: Sequence[Any], fmt: str | None = None, *, columns: Sequence[str] | None = None,
                 split: str | None = None, glob: str = "*.txt") -> Iterator[Raw]:
    """Stream the records of every input in order. ``columns`` restricts table reads to those columns."""
    opts = ReadOptions(columns, split, glob)
    for inp, _, module in _sources(inputs, fmt):
        yield from module.read(inp, opts)


def count_records(inputs: Sequence[Any], fmt: str | None = None, *, split: str | None = None,
                  glob: str = "*.txt") -> int | None:
    """The number of records when it is known without reading the data (tables, folders), else None."""
    opts = ReadOptions(None, split, glob)
    total = 0
    for inp, _, module in _sources(inputs, fmt):
        n = module.count(inp, opts)
        if n is None:
            return None
        total += n
    return total


def describe_sources(inputs: Sequence[Any], fmt: str | None, split: str | None = None) -> list[dict]:
    """``{path, format}`` of each input for the build report, plus what the source adds (``split`` read)."""
    opts = ReadOptions(None, split)
    out = []
    for inp, kind, module in _sources(inputs, fmt):
        entry = {"path": module.label(inp) if kind == "hf" else str(Path(inp).resolve()), "format": kind}
        describe = getattr(module, "describe", None)
        if describe is not None:
            entry.update(describe(inp, opts))
        out.append(entry)
    return out
