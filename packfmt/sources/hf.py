"""Hugging Face ``datasets`` objects and datasets already in the local HF cache.

- In-memory objects (Python API: ``build_text(ds, ...)``): a ``datasets.Dataset`` (memory-mapped
  Arrow, read ``BATCH_ROWS`` rows at a time), an ``IterableDataset`` (streamed: bounded memory
  whatever its size), or a ``DatasetDict`` / ``IterableDatasetDict`` (the split rule of
  ``save_to_disk`` folders: ``split=``, else ``train``, else refused with the splits listed).
- By name (``--format hf NAME``): ``datasets.load_dataset(NAME)`` with the Hub forced offline, so
  only what is already in the local cache (``HF_DATASETS_CACHE``) is read and nothing is ever
  downloaded; a dataset not there is an error saying how to download it.

Rows are read as Arrow and converted with ``to_pylist``, so values are the plain Python objects a
JSONL line of the same record gives (an ``Image`` feature stays ``{"bytes", "path"}``, undecoded).
``line`` is the 1-based row number within the split.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from functools import lru_cache
from typing import Any, Iterator

from ..errors import InputError
from .record import Raw, is_path, missing_columns
from .hf_disk import choose_split

BATCH_ROWS = 1024
_DICT_TYPES = ("DatasetDict", "IterableDatasetDict")
_DATASET_TYPES = ("Dataset", "IterableDataset", *_DICT_TYPES)


def is_dataset_object(obj: Any) -> bool:
    """A ``datasets`` Dataset, IterableDataset or (Iterable)DatasetDict (checked without importing datasets)."""
    return any(c.__module__.startswith("datasets.") and c.__name__ in _DATASET_TYPES for c in type(obj).__mro__)


def _is_dict(obj: Any) -> bool:
    return any(c.__name__ in _DICT_TYPES for c in type(obj).__mro__)


@contextmanager
def _offline():
    """The Hub forced offline for the duration (datasets and huggingface_hub read their flags at import)."""
    import datasets
    import huggingface_hub.constants as hub

    saved = os.environ.get("HF_HUB_OFFLINE"), datasets.config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE
    os.environ["HF_HUB_OFFLINE"] = "1"
    datasets.config.HF_HUB_OFFLINE = hub.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        if saved[0] is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = saved[0]
        datasets.config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE = saved[1], saved[2]


@lru_cache(maxsize=4)  # read, count and describe of one build load it once
def load_cached(name: str) -> Any:
    """The dataset ``name`` from the local HF cache (a Dataset or DatasetDict); never downloads."""
    import datasets

    with _offline():
        try:
            return datasets.load_dataset(name)
        except Exception as exc:  # datasets raises FileNotFoundError, ConnectionError, DatasetNotFoundError...
            cache = datasets.config.HF_DATASETS_CACHE
            raise InputError(f"{name}: not in the local Hugging Face cache ({cache}): {type(exc).__name__}: {exc}. "
                             f"packfmt never downloads; fetch it first, online, with "
                             f"python -c \"import datasets; datasets.load_dataset('{name}')\" "
                             "(or set HF_DATASETS_CACHE to the cache that holds it)",
                             reason="missing_input", file=name, expected=f"a dataset cached under {cache}",
                             found="not cached") from None


def _resolve(inp: Any, split: str | None) -> tuple[Any, str]:
    """``(dataset, label)``: the object to read (a split picked from a dict) and its name in messages."""
    obj = load_cached(inp) if is_path(inp) else inp
    base = str(inp) if is_path(inp) else type(obj).__name__
    if _is_dict(obj):
        chosen = choose_split(list(obj.keys()), split, base)
        return obj[chosen], f"{base}[{chosen}]"
    own = getattr(obj, "split", None)
    return obj, f"{base}[{own}]" if own else base


def label(inp: Any) -> str:
    """The input's name in the build report: the dataset name, or the object's type."""
    return str(inp) if is_path(inp) else type(inp).__name__


def describe(inp: Any, opts) -> dict:
    obj = load_cached(inp) if is_path(inp) else inp
    if _is_dict(obj):
        return {"split": choose_split(list(obj.keys()), opts.split, label(inp))}
    own = getattr(obj, "split", None)
    return {"split": str(own)} if own else {}


def _arrow_batches(ds: Any, columns: list[str] | None) -> Iterator[Any]:
    if columns is not None:
        ds = ds.select_columns(columns)
    yield from ds.with_format("arrow").iter(batch_size=BATCH_ROWS)


def read(inp: Any, opts) -> Iterator[Raw]:
    ds, file = _resolve(inp, opts.split)
    names = ds.column_names
    if names is not None and (error := missing_columns(file, opts.columns, names)) is not None:
        n = _known_rows(ds)
        if n is None:  # a stream of unknown length: every row is read to be counted
            n = sum(1 for _ in ds)
        yield from (Raw(file, row, error) for row in range(1, n + 1))
        return
    cols = None if opts.columns is None or names is None else [c for c in opts.columns if c in names]
    row = 0
    for batch in _arrow_batches(ds, cols):
        for obj in batch.to_pylist():
            row += 1
            yield Raw(file, row, obj)


def _known_rows(ds: Any) -> int | None:
    try:
        return len(ds)
    except TypeError:  # IterableDataset: unknown until read
        return None


def count(inp: Any, opts) -> int | None:
    ds, _ = _resolve(inp, opts.split)
    return _known_rows(ds)
