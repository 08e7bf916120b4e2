"""Parquet files, streamed in record batches (bounded memory whatever the file size)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator, Sequence

from .record import Raw, missing_columns

BATCH_ROWS = 1024


def _columns(schema_names: Sequence[str], columns: Sequence[str] | None) -> list[str] | None:
    """Only the requested columns that exist (a missing one makes every row a ``missing_field``)."""
    if columns is None:
        return None
    return [c for c in columns if c in schema_names]


def iter_parquet(path: str | os.PathLike, *, columns: Sequence[str] | None = None, batch_rows: int = BATCH_ROWS) -> Iterator[Raw]:
    import pyarrow.parquet as pq

    file = str(Path(path))
    pf = pq.ParquetFile(file)
    if (error := missing_columns(file, columns, pf.schema_arrow.names)) is not None:
        for row in range(1, pf.metadata.num_rows + 1):  # every row lacks it: one counted bad record each
            yield Raw(file, row, error)
        return
    cols = _columns(pf.schema_arrow.names, columns)
    row = 0
    for batch in pf.iter_batches(batch_size=batch_rows, columns=cols):
        for obj in batch.to_pylist():
            row += 1
            yield Raw(file, row, obj)


def count_rows(path: str | os.PathLike) -> int:
    import pyarrow.parquet as pq

    return pq.ParquetFile(str(path)).metadata.num_rows


def read(path: str | os.PathLike, opts) -> Iterator[Raw]:
    return iter_parquet(path, columns=opts.columns)


def count(path: str | os.PathLike, opts) -> int:
    return count_rows(path)
