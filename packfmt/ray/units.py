"""Work units of a Ray build: explicit slices of the inputs, enumerated on the driver.

A unit names a slice of one input file by content, never by what Ray does with it: an
uncompressed JSONL file is cut at line boundaries into byte ranges of about ``records`` lines
(the first line number is carried, so skip messages say ``file:line`` as a local build does);
a Parquet file into row ranges; any other input (JSON array, compressed JSONL, HF folder, text
folder) is one unit. Units are read by packfmt's own source readers, so every record (a
malformed line included) is read and accounted for exactly as in a local build, and the units
concatenated in order are the input records in input order.

An input in object storage (``s3://...``) is never downloaded by the driver: a JSONL object is cut
into byte ranges at newlines found by small ranged reads (``packfmt.storage.ranges.line_ranges``), a
Parquet object into runs of row groups read from its footer; the actor that gets a unit reads only
that range or those row groups, once. Any other remote file is one unit that its actor fetches into
a temporary folder of its own node.

Line numbers of a remote JSONL range: nobody knows a range's first line number before the ranges
before it are read, so its records are numbered *relative* to the range (1 = its first line) and
the actor reports the range's newline count (``read_unit``'s first value). The driver turns those
counts, gathered through the write tasks' returns, into each range's first line (``first_lines``)
and makes every bad record's ``file:line`` absolute (``absolute``) before its ``Tally`` sees it:
messages and ``--skip-log`` are a local build's, and each byte of the object is read once.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Iterator, Sequence

from ..sources import Raw, detect_format, iter_records, remote_format

__all__ = ["absolute", "first_lines", "plan_units", "read_unit"]

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


def _remote_units(url: str, fmt: str | None, records: int, so: dict | None) -> list[dict]:
    """Units of one input in object storage, planned by ranged reads (nothing downloaded)."""
    from ..storage import ranges

    kind = fmt or remote_format(url)
    name = url.rsplit("/", 1)[-1].lower()
    if kind == "jsonl" and name.endswith((".jsonl", ".ndjson")):
        return [{"path": url, "kind": "jsonl_range", "begin": b, "end": e, "remote": True}  # lines: relative
                for b, e in ranges.line_ranges(url, records, so)]
    if kind == "parquet":
        units, groups, first, row = [], [], 0, 0
        for g, n in enumerate(ranges.row_groups(url, so)):
            groups.append(g)
            row += n
            if row - first >= records:
                units.append({"path": url, "kind": "row_groups", "groups": groups, "row": first, "remote": True})
                groups, first = [], row
        if groups:
            units.append({"path": url, "kind": "row_groups", "groups": groups, "row": first, "remote": True})
        return units
    return [{"path": url, "kind": "rows", "fmt": kind, "begin": 0, "end": None, "remote": True}]


def plan_units(inputs: Sequence[str], fmt: str | None, records: int, storage_options: dict | None = None) -> list[dict]:
    """The units of ``inputs`` in input order; ``records`` is the target records (lines, rows) per unit."""
    from ..sources.parquet import count_rows
    from ..storage import is_remote

    units: list[dict] = []
    for path in inputs:
        if is_remote(str(path)):
            units.extend(_remote_units(str(path), fmt, records, storage_options))
            continue
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


def read_unit(unit: dict, *, columns: Sequence[str] | None, split: str | None, glob: str,
              storage_options: dict | None = None) -> tuple[int | None, Iterator[Raw]]:
    """``(newlines, records)``: the records of one unit, in order, as the local build's source readers give them.

    A remote JSONL range is read here, in one ranged GET: its records are numbered from 1 at its first
    line and ``newlines`` is how many lines it holds (what ``first_lines`` needs). Every other unit's
    lines are the file's own and ``newlines`` is None.
    """
    if unit["kind"] == "jsonl_range" and unit.get("remote"):
        from ..storage.ranges import read_range

        data = read_range(unit["path"], unit["begin"], unit["end"], storage_options)
        return data.count(b"\n"), _range_records(data, unit["path"], 1)
    if unit["kind"] == "jsonl_range":
        with open(unit["path"], "rb") as f:
            f.seek(unit["begin"])
            data = f.read(unit["end"] - unit["begin"])
        return None, _range_records(data, unit["path"], unit["line"])
    if unit.get("remote"):
        return None, _read_remote(unit, columns=columns, split=split, glob=glob, storage_options=storage_options)
    records = iter_records([unit["path"]], unit["fmt"], columns=columns, split=split, glob=glob)
    return None, itertools.islice(records, unit["begin"], unit["end"])


def _range_records(data: bytes, file: str, line: int) -> Iterator[Raw]:
    """The records of a JSONL byte range whose first line is ``line`` (blank lines are no records)."""
    from ..sources.jsonl import parse_line

    pieces = data.split(b"\n")
    if pieces and not pieces[-1]:
        pieces.pop()  # the newline ending the range ends its last line
    for n, raw in enumerate(pieces, start=line):
        if raw.strip():
            yield Raw(file, n, parse_line(raw, file, n))


def first_lines(units: Sequence[dict], newlines: dict[int, int]) -> dict[int, int]:
    """``{seq: first line}`` of the remote JSONL ranges among ``units`` (in input order), from each one's
    newline count (``newlines[seq]``, as ``read_unit`` gave it): the ranges of one object are consecutive."""
    out: dict[int, int] = {}
    next_line: dict[str, int] = {}
    for u in units:
        if u["kind"] == "jsonl_range" and u.get("remote"):
            if u["seq"] not in newlines:
                raise RuntimeError(f"{u['path']}: bytes {u['begin']}-{u['end']}: no write task reported the line "
                                   "count of this unit (a Ray Data bug?); build again")
            out[u["seq"]] = next_line.get(u["path"], 1)
            next_line[u["path"]] = out[u["seq"]] + newlines[u["seq"]]
    return out


def absolute(bad: tuple, first: int) -> tuple:
    """A bad record ``(file, line, reason, message, cli)`` numbered relative to its unit, with ``line`` made
    absolute (``first``: the unit's first line). A message that names the record as a source reader does,
    starting ``file:line:`` (``sources.jsonl.parse_line``), gets the absolute line there; the others get
    their ``file:line`` from ``Tally.bad``."""
    file, line, reason, message, cli = bad
    at = first + line - 1
    old, new = f"{file}:{line}:", f"{file}:{at}:"
    message = new + message[len(old):] if message.startswith(old) else message
    cli = new + cli[len(old):] if cli is not None and cli.startswith(old) else cli
    return file, at, reason, message, cli


def _read_remote(unit: dict, *, columns, split, glob, storage_options) -> Iterator[Raw]:
    """A remote Parquet unit (its row groups, by ranged reads) or a whole remote file (fetched to this node)."""
    url = unit["path"]
    if unit["kind"] == "row_groups":
        import pyarrow.parquet as pq

        from ..sources.parquet import BATCH_ROWS, _columns
        from ..sources.record import missing_columns
        from ..storage.ranges import open_object

        with open_object(url, storage_options) as fh:
            pf = pq.ParquetFile(fh)
            n = sum(pf.metadata.row_group(g).num_rows for g in unit["groups"])
            if (error := missing_columns(url, columns, pf.schema_arrow.names)) is not None:
                for row in range(unit["row"] + 1, unit["row"] + n + 1):  # as iter_parquet: every row is bad
                    yield Raw(url, row, error)
                return
            cols, row = _columns(pf.schema_arrow.names, columns), unit["row"]
            for batch in pf.iter_batches(batch_size=BATCH_ROWS, row_groups=unit["groups"], columns=cols):
                for obj in batch.to_pylist():
                    row += 1
                    yield Raw(url, row, obj)
        return
    import shutil
    import tempfile

    from ..storage.ranges import open_object

    tmp = Path(tempfile.mkdtemp(prefix="packfmt-unit-"))  # this actor's node, removed when the unit is read
    try:
        local = tmp / url.rsplit("/", 1)[-1]
        with open_object(url, storage_options) as src, open(local, "wb") as dst:
            shutil.copyfileobj(src, dst, 8 << 20)
        for raw in iter_records([str(local)], unit["fmt"], columns=columns, split=split, glob=glob):
            yield Raw(url, raw.line, raw.obj)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
