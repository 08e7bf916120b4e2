"""The tokenizer actor of a Ray build: reads a work unit, converts its records, emits Arrow rows.

One actor builds the converter (tokenizer, chat template, image rules) once in ``__init__`` and
then converts whole units: ``prepare`` and ``encode`` exactly as a local build runs them
(``packfmt.pipeline.convert_records``). Every record read becomes one row, written or not: a
document's tokens, loss mask and images, or the reason it is skipped, with its ``file:line``.
The sink applies the rest of the local build's rules (empty tokens, ids out of range).

A remote JSONL range numbers its lines from 1 (``units.read_unit``): its rows carry ``unit`` (the
unit's ``seq``) and it adds one row that is no record, ``newlines`` (how many lines the range
holds), first; the write tasks return those counts and the driver makes the lines absolute.
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .units import read_unit

__all__ = ["EncodeUnits", "ROW_SCHEMA_FIELDS", "decode_row"]

#: Records per Arrow table an actor yields (blocks; the sink bundles them into members).
CHUNK_ROWS = 1024
ROW_SCHEMA_FIELDS = ("file", "line", "tokens", "mask", "images", "reason", "message", "cli", "unit", "newlines")


def _fault_once(fault: dict | None, where: str, key: int) -> None:
    """Test hook: kill this process the first time ``where`` is reached for unit/task ``key``."""
    if not fault or fault.get("where") != where or fault.get("at") != key:
        return
    marker = Path(fault["marker"])
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.close(fd)
    os._exit(1)


class EncodeUnits:
    """Callable class for ``map_batches(compute=ActorPoolStrategy(...))``: units in, record rows out."""

    def __init__(self, factory: Callable[[], Any], columns, split: str | None, glob: str, batch_size: int,
                 fault: dict | None = None, storage_options: dict | None = None) -> None:
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        self.converter = factory()
        self.columns, self.split, self.glob, self.batch_size = columns, split, glob, batch_size
        self.fault, self.storage_options = fault, storage_options

    def __call__(self, batch):
        """Yield one Arrow table per ``CHUNK_ROWS`` records: an actor's memory stays bounded whatever the unit size."""
        from ..pipeline import convert_records

        cols: dict[str, list] = {k: [] for k in ROW_SCHEMA_FIELDS}
        for item in batch.to_pylist():
            unit = json.loads(item["unit"])  # one JSON column: units of every kind share one block schema
            newlines, records = read_unit(unit, columns=self.columns, split=self.split, glob=self.glob,
                                          storage_options=self.storage_options)  # a remote unit: its range only
            relative = None if newlines is None else unit["seq"]  # its lines count from its first line
            if newlines is not None:  # the unit's line count, for the driver (no record)
                for k in ROW_SCHEMA_FIELDS:
                    cols[k].append(None)
                cols["file"][-1], cols["unit"][-1], cols["newlines"][-1] = unit["path"], relative, newlines
            for n, (file, line, doc, failure) in enumerate(convert_records(records, self.converter, self.batch_size)):
                if n == 1:
                    _fault_once(self.fault, "encode", unit["seq"])
                cols["file"].append(file)
                cols["line"].append(line)
                cols["unit"].append(relative)
                cols["newlines"].append(None)
                if failure is None:
                    tokens, mask, images = doc
                    cols["tokens"].append(np.asarray(tokens, dtype=np.int64).tobytes())
                    cols["mask"].append(None if mask is None else np.asarray(mask, dtype=np.uint8).tobytes())
                    cols["images"].append(pickle.dumps(list(images)) if images else None)
                    cols["reason"].append(None)
                    cols["message"].append(None)
                    cols["cli"].append(None)
                else:
                    reason, message, cli = failure
                    for k in ("tokens", "mask", "images"):
                        cols[k].append(None)
                    cols["reason"].append(reason)
                    cols["message"].append(message)
                    cols["cli"].append(cli)
                if len(cols["file"]) >= CHUNK_ROWS:
                    yield _table(cols)
                    cols = {k: [] for k in ROW_SCHEMA_FIELDS}
        if cols["file"]:
            yield _table(cols)


def _table(cols: dict):
    import pyarrow as pa

    types = {"file": pa.string(), "line": pa.int64(), "tokens": pa.binary(), "mask": pa.binary(),
             "images": pa.binary(), "reason": pa.string(), "message": pa.string(), "cli": pa.string(),
             "unit": pa.int64(), "newlines": pa.int64()}
    return pa.table({k: pa.array(cols[k], types[k]) for k in ROW_SCHEMA_FIELDS})


def decode_row(row: dict) -> tuple:
    """A row back to ``(file, line, doc)`` or ``(file, line, (reason, message, cli))``."""
    if row["reason"] is not None:
        return row["file"], row["line"], (row["reason"], row["message"], row["cli"])
    tokens = np.frombuffer(row["tokens"], dtype=np.int64)
    mask = None if row["mask"] is None else np.frombuffer(row["mask"], dtype=np.uint8)
    images = pickle.loads(row["images"]) if row["images"] is not None else []
    return row["file"], row["line"], (tokens, mask, images)
