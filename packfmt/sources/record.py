"""What every source module shares: the record it yields, the options it is given, and the
``missing_field`` error of a table (below the ``sources`` package front, so submodules never import it)."""

from __future__ import annotations

import os
from typing import Any, NamedTuple, Sequence

from ..errors import InputError

__all__ = ["Raw", "ReadOptions", "is_path", "missing_columns"]


class Raw(NamedTuple):
    """One source record: where it came from and what it holds."""

    file: str
    line: int
    obj: dict | InputError


class ReadOptions(NamedTuple):
    """What a build asks of every source: the columns it needs, the split, the text-folder glob."""

    columns: Sequence[str] | None = None
    split: str | None = None
    glob: str = "*.txt"


def is_path(inp: Any) -> bool:
    return isinstance(inp, (str, os.PathLike))


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
