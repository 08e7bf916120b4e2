"""Folders written by ``datasets.Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``, read with pyarrow.

Layout (datasets 2.x-4.x)::

    folder/state.json            {"_data_files": [{"filename": "data-00000-of-00001.arrow"}, ...], ...}
    folder/dataset_info.json     features, description, ...
    folder/data-00000-of-00001.arrow   Arrow *streaming* IPC format (not the file format)

A ``DatasetDict`` folder holds ``dataset_dict.json`` (``{"splits": [...]}``) and one such folder per
split; ``split`` picks one. Without ``split``, ``train`` is read when it exists (the build report
says so); otherwise the build refuses and lists the splits: mixing every split (test included)
into training data is never what a user wants silently.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterator, Sequence

from ..errors import InputError
from .record import Raw, missing_columns


#: The split read from a DatasetDict when none is named.
DEFAULT_SPLIT = "train"


def splits(root: str | os.PathLike) -> list[str] | None:
    """The splits of a DatasetDict folder, in its listed order; None for a single-Dataset folder."""
    dd = Path(root) / "dataset_dict.json"
    if not dd.is_file():
        return None
    return list(json.loads(dd.read_text(encoding="utf-8")).get("splits", []))


def choose_split(names: Sequence[str], split: str | None, where: str, file: str | None = None) -> str:
    """The split to read from a DatasetDict with splits ``names``: ``split``, else ``train``.

    Raises ``missing_split`` naming the splits there are when ``split`` is not one of them, or when
    it is None and there is no ``train`` (``where`` names the DatasetDict in the message). Shared by
    ``save_to_disk`` folders and in-memory / cached DatasetDicts (``sources.hf``).
    """
    names = list(names)
    if split is None:
        if DEFAULT_SPLIT in names:
            return DEFAULT_SPLIT
        raise InputError(f"{where}: a DatasetDict with splits {names} and no {DEFAULT_SPLIT!r}: pass split= one of them",
                         reason="missing_split", file=file, field="splits", expected=f"one of {names}", found="no split",
                         cli=f"{where}: a DatasetDict with splits {names} and no {DEFAULT_SPLIT!r}: "
                             f"pass --split {'|'.join(names)}")
    if split not in names:
        raise InputError(f"{where}: no split {split!r}; the splits are {names}", reason="missing_split", file=file,
                         field="splits", expected=f"one of {names}", found=split)
    return split


def resolve_split(root: str | os.PathLike, split: str | None) -> str | None:
    """The split to read from ``root``: ``split``, else ``train`` of a DatasetDict; None for a single Dataset."""
    names = splits(root)
    if names is None:
        return None
    return choose_split(names, split, str(root), str(Path(root) / "dataset_dict.json"))


def _split_dirs(root: Path, split: str | None) -> list[Path]:
    chosen = resolve_split(root, split)
    return [root] if chosen is None else [root / chosen]


def data_files(root: str | os.PathLike, split: str | None = None) -> list[Path]:
    """The Arrow files of the dataset, in the order ``state.json`` lists them."""
    files = []
    for d in _split_dirs(Path(root), split):
        state = d / "state.json"
        if not state.is_file():
            raise InputError(f"{d}: not a save_to_disk folder (state.json missing)", reason="unsupported_format",
                             file=str(state), expected="state.json", found="missing")
        listed = json.loads(state.read_text(encoding="utf-8")).get("_data_files", [])
        for entry in listed:
            name = entry["filename"]
            if "/" in name or "\\" in name or name.startswith("."):
                raise InputError(f"{state}: bad data file name {name!r}", reason="unsupported_format", file=str(state),
                                 field="_data_files", expected="plain file names", found=name)
            files.append(d / name)
    return files


def _open_reader(path: Path):
    import pyarrow as pa

    source = pa.memory_map(str(path), "r")
    try:
        return pa.ipc.open_stream(source)
    except pa.ArrowInvalid:  # very old datasets versions wrote the IPC file format
        return pa.ipc.open_file(source)


def _batches(reader):
    if hasattr(reader, "num_record_batches"):  # file format
        for i in range(reader.num_record_batches):
            yield reader.get_batch(i)
    else:
        yield from reader


def iter_hf_disk(path: str | os.PathLike, *, columns: Sequence[str] | None = None, split: str | None = None) -> Iterator[Raw]:
    for arrow in data_files(path, split):
        file = str(arrow)
        reader = _open_reader(arrow)
        names = reader.schema.names
        if (error := missing_columns(file, columns, names)) is not None:
            rows = sum(b.num_rows for b in _batches(reader))
            yield from (Raw(file, row, error) for row in range(1, rows + 1))  # every row lacks it
            continue
        keep = None if columns is None else [c for c in columns if c in names]
        row = 0
        for batch in _batches(reader):
            if keep is not None:
                batch = batch.select(keep)
            for obj in batch.to_pylist():
                row += 1
                yield Raw(file, row, obj)


def count_rows(path: str | os.PathLike, split: str | None = None) -> int:
    total = 0
    for arrow in data_files(path, split):
        total += sum(b.num_rows for b in _batches(_open_reader(arrow)))
    return total


def read(path: str | os.PathLike, opts) -> Iterator[Raw]:
    return iter_hf_disk(path, columns=opts.columns, split=opts.split)


def count(path: str | os.PathLike, opts) -> int:
    return count_rows(path, split=opts.split)


def describe(path: str | os.PathLike, opts) -> dict:
    chosen = resolve_split(path, opts.split)
    return {} if chosen is None else {"split": chosen}
