"""Messages say what to do: each names the command, option or choices that fix the problem.

One test per item of issue 11 ("messages that say what to do"), each checking the wording a new
user sees: CLI words (``--index``) from the CLI, API words (``name=``) from the API.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

import packfmt
from packfmt import cli
from packfmt.build import build_text
from packfmt.errors import FormatError, InputError
from packfmt.packindex import build_pack_index

os.environ["HF_HUB_OFFLINE"] = "1"
SAMPLE_TOK = Path(packfmt.__file__).parent / "sample_data" / "tokenizer"
GOOD = "The quick brown fox jumps over the lazy dog."


def write_ds(path: Path, docs=([1, 2, 3], [4, 5], [6, 7, 8, 9]), *, loss_mask: bool = False) -> Path:
    with packfmt.DatasetWriter(path, vocab_size=100, loss_mask=loss_mask) as w:
        for d in docs:
            w.add_document(d, loss_mask=[k % 2 for k in range(len(d))] if loss_mask else None)
    return path


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


# ----------------------------------------------------------------------------- 1. pack index names
def test_pack_index_errors_list_names_or_say_how_to_create_one(tmp_path, capsys):
    from packfmt.torch import PackedDataset

    ds = write_ds(tmp_path / "ds")
    with pytest.raises(FormatError) as info:  # API: no index at all -> the API call that creates one
        packfmt.open(ds).pack_index()
    assert "build_pack_index(" in str(info.value) and "capacity=" in str(info.value)
    assert cli.main(["inspect", str(ds), "--index", "ffd-8"]) == 1  # CLI: the command that creates one
    err = capsys.readouterr().err
    assert f"packfmt pack {ds} --capacity N" in err and "build_pack_index" not in err

    build_pack_index(ds, capacity=8, name="a")
    build_pack_index(ds, capacity=4, name="b")
    with pytest.raises(FormatError) as info:  # a wrong name lists the ones there are
        PackedDataset(ds, "c")
    assert "'c'" in str(info.value) and "['a', 'b']" in str(info.value)
    with pytest.raises(FormatError) as info:  # no name while there are several: list them, say how to pick
        PackedDataset(ds)
    assert "['a', 'b']" in str(info.value)
    assert cli.main(["inspect", str(ds), "--index", "c"]) == 1
    assert "['a', 'b']" in capsys.readouterr().err
    assert PackedDataset(ds, "b").index_name == "b"


# ----------------------------------------------------------------------------- 7. collate_hf names itself
def test_collate_hf_error_names_collate_hf(tmp_path):
    from packfmt.torch import PackedDataset, collate_hf

    ds = write_ds(tmp_path / "ds")
    build_pack_index(ds, capacity=8, name="p")
    items = [dict(item) for item in (PackedDataset(ds, "p")[0], PackedDataset(ds, "p")[1])]
    for item in items:  # what transformers' Trainer does with remove_unused_columns=True
        del item["seq_lens"], item["document_ids"]
    with pytest.raises(ValueError) as info:
        collate_hf(items)
    msg = str(info.value)
    assert msg.startswith("collate_hf:") and "collate_varlen" not in msg
    assert "remove_unused_columns=False" in msg and "seq_lens" in msg
