"""What the ``packfmt cp`` tests share: small real datasets (a store with two indexes, a collection of stores beside
it, a pack-ordered layout whose members lie inside it), a comparison of two datasets file for file, and a failure
injected after some files were copied (a copy stopped midway)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import packfmt
from packfmt import copying
from packfmt.collection import write_collection
from packfmt.collection.shards import write_shards
from packfmt.packindex import build_pack_index


def write_store(path: Path, docs: int = 40, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    with packfmt.DatasetWriter(path, vocab_size=1000, tokenizer={"name": "t", "hash": None}, loss_mask=True) as w:
        for _ in range(docs):
            n = int(rng.integers(1, 60))
            w.add_document(rng.integers(0, 1000, n), loss_mask=rng.integers(0, 2, n))
    return path


def make_datasets(root: Path) -> dict[str, Path]:
    """``store`` (two pack indexes), ``mix`` (a collection of ``web`` and ``code`` beside it, one index), ``layout``
    (the packs of ``mix``'s index as shards inside it, ``pack --shards``)."""
    store = write_store(root / "store")
    build_pack_index(store, capacity=64)
    build_pack_index(store, capacity=128, algorithm="bfd")
    web, code = write_store(root / "web", 30, 1), write_store(root / "code", 20, 2)
    mix = write_collection(root / "mix", [(None, web), (None, code)]).path
    build_pack_index(mix, capacity=64, weights={"web": 2})
    layout = write_shards(mix, "ffd-64-weights", root / "layout", shard_bytes=2048).path
    return {"store": store, "mix": Path(mix), "layout": Path(layout), "web": web, "code": code}


def files_of(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` by relative path (dot-folders of unfinished writes left out)."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(Path(root).rglob("*"))
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)}


def packs_of(ds) -> list[list[int]]:
    """Every pack of the dataset's only index as token ids (what a reader gets)."""
    from packfmt.torch import PackedDataset

    loaded = ds if isinstance(ds, PackedDataset) else PackedDataset(ds)  # a path, a URL or an opened dataset
    return [loaded[i]["input_ids"].tolist() for i in range(len(loaded))]


class Stopped(RuntimeError):
    """The failure a test injects into a copy (a copy stopped midway)."""


def stop_after(monkeypatch, files: int) -> list:
    """Make ``copying._copy_file`` raise ``Stopped`` once ``files`` data files were copied; returns the copied list."""
    copied, real = [], copying._copy_file

    def copy(src, dst, entry, buf):
        if len(copied) == files:
            raise Stopped(f"stopped after {files} files")
        real(src, dst, entry, buf)
        copied.append(dst)

    monkeypatch.setattr(copying, "_copy_file", copy)
    return copied
