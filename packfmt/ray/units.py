"""Work units of a Ray build: explicit slices of the inputs, enumerated on the driver.

A unit names a slice of one input file by content, never by what Ray does with it: an
uncompressed JSONL file is cut at line boundaries into byte ranges of about ``records`` lines
(the first line number is carried, so skip messages say ``file:line`` as a local build does);
a Parquet file into row ranges; any other input (JSON array, compressed JSONL, HF folder, text
folder) is one unit. Units are read by packfmt's own source readers, so every record (a
malformed line included) is read and accounted for exactly as in a local build, and the units
concatenated in order are the input records in input order.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Iterator, Sequence

from ..sources import Raw, detect_format, iter_records

__all__ = ["plan_units", "read_unit"]

_SCAN = 8 * 1024 * 1024


def _jsonl_ranges(path: str, records: int) -> list[dict]:
    """Byte ranges of about ``records`` lines each, cut after a newline (one pass at memory speed)."""
    units, start, start_line, lines, pos = [], 0, 1, 0, 0
    with open(path, "rb") as f:
        while chunk := f.read(_SCAN):
            base, at = pos, 0
            while True:
                nl = chunk.find(b"\n", at)
                if nl < 0:
                    break
                lines += 1
                at = nl + 1
                if lines == records:
                    end = base + at
                    units.append({"path": path, "kind": "jsonl_range", "begin": start, "end": end, "line": start_line})
                    start, start_line, lines = end, start_line + records, 0
            pos += len(chunk)
    if pos > start:
        units.append({"path": path, "kind": "jsonl_range", "begin": start, "end": pos, "line": start_line})
    return units


def plan_units(inputs: Sequence[str], fmt: str | None, records: int) -> list[dict]:
    """The units of ``inputs`` in input order; ``records`` is the target records (lines, rows) per unit."""
    from ..sources.parquet import count_rows

    units: list[dict] = []
    for path in inputs:
        kind = fmt or detect_format(path)
        name = Path(path).name.lower()
        if kind == "jsonl" and name.endswith((".jsonl", ".ndjson")) and Path(path).is_file():
            units.extend(_jsonl_ranges(str(path), records))
        elif kind == "parquet":
            n = count_rows(path)
            units.extend({"path": str(path), "kind": "rows", "fmt": kind, "begin": b, "end": min(b + records, n)}
                         for b in range(0, n, records))
        else:
            units.append({"path": str(path), "kind": "rows", "fmt": kind, "begin": 0, "end": None})
    return units


def read_unit(unit: dict, *, columns: Sequence[str] | None, split: str | None, glob: str) -> Iterator[Raw]:
    """The records of one unit, in order, as the local build's source readers give them."""
    from ..sources.jsonl import parse_line

    if unit["kind"] == "jsonl_range":
        file, line = unit["path"], unit["line"]
        with open(file, "rb") as f:
            f.seek(unit["begin"])
            data = f.read(unit["end"] - unit["begin"])
        pieces = data.split(b"\n")
        if pieces and not pieces[-1]:
            pieces.pop()  # the newline ending the range ends its last line
        for n, raw in enumerate(pieces, start=line):
            if raw.strip():
                yield Raw(file, n, parse_line(raw, file, n))
        return
    records = iter_records([unit["path"]], unit["fmt"], columns=columns, split=split, glob=glob)
    yield from itertools.islice(records, unit["begin"], unit["end"])
