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


# ----------------------------------------------------------------------------- 2. parquet --field lists the columns
def test_parquet_field_not_a_column_lists_the_columns(tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = tmp_path / "in.parquet"
    pq.write_table(pa.Table.from_pylist([{"body": f"{GOOD} {i}", "id": i} for i in range(5)]), src)
    with pytest.raises(InputError) as info:
        build_text([src], tmp_path / "ds", SAMPLE_TOK)  # field="text" is not a column
    assert "['body', 'id']" in str(info.value) and "field=" in str(info.value) and "--field" not in str(info.value)
    args = ["build", "text", str(src), "-o", str(tmp_path / "ds"), "--tokenizer", str(SAMPLE_TOK), "--no-progress"]
    assert cli.main(args + ["--field", "txt", "--on-error", "skip"]) == 1
    err = capsys.readouterr().err
    assert "no column 'txt'" in err and "['body', 'id']" in err and "--field" in err
    assert cli.main(args + ["--field", "body"]) == 0


# ----------------------------------------------------------------------------- 3. DatasetDict splits
def test_dataset_dict_reads_train_or_asks_for_a_split(tmp_path, capsys):
    datasets = pytest.importorskip("datasets")
    train = [{"text": f"{GOOD} train {i}"} for i in range(4)]
    test = [{"text": f"{GOOD} test {i}"} for i in range(3)]
    datasets.DatasetDict({"train": datasets.Dataset.from_list(train), "test": datasets.Dataset.from_list(test)}
                         ).save_to_disk(str(tmp_path / "dd"))
    out = tmp_path / "ds"
    assert cli.main(["build", "text", str(tmp_path / "dd"), "-o", str(out), "--tokenizer", str(SAMPLE_TOK),
                     "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "read split 'train'" in printed and "--split" in printed  # says which split, and how to pick another
    assert len(packfmt.open(out)) == len(train)  # not train + test mixed
    with pytest.raises(InputError) as info:  # a wrong split lists those there are
        build_text([tmp_path / "dd"], tmp_path / "x", SAMPLE_TOK, split="validation")
    assert "'validation'" in str(info.value) and "['train', 'test']" in str(info.value)

    datasets.DatasetDict({"a": datasets.Dataset.from_list(train), "b": datasets.Dataset.from_list(test)}
                         ).save_to_disk(str(tmp_path / "ab"))
    with pytest.raises(InputError) as info:  # no train: refuse, list the splits, name split=
        build_text([tmp_path / "ab"], tmp_path / "x", SAMPLE_TOK)
    assert "['a', 'b']" in str(info.value) and "split=" in str(info.value)
    assert cli.main(["build", "text", str(tmp_path / "ab"), "-o", str(tmp_path / "x"), "--tokenizer", str(SAMPLE_TOK)]) == 1
    assert "--split a|b" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


# ----------------------------------------------------------------------------- 4. every record fails / skip summary
def test_all_records_failing_names_the_option_not_on_error_skip(tmp_path, capsys):
    chat = Path(packfmt.__file__).parent / "sample_data" / "chat.jsonl"  # a chat file given to `build text`
    args = ["build", "text", str(chat), "-o", str(tmp_path / "ds"), "--tokenizer", str(SAMPLE_TOK), "--no-progress"]
    for extra in ([], ["--on-error", "skip"]):
        assert cli.main(args + extra) == 1
        err = capsys.readouterr().err
        assert "--on-error skip" not in err and "--field" in err and "packfmt build chat" in err
        assert "all 60 records" in err and "(60 missing_field)" in err
    with pytest.raises(InputError) as info:
        build_text([chat], tmp_path / "ds", SAMPLE_TOK, on_error="skip")
    assert info.value.reason == "nothing_written" and "field=" in str(info.value) and "--field" not in str(info.value)

    # skip: a summary per reason with the first 3 examples, exact counts, not one line per record
    lines = [json.dumps({"text": f"{GOOD} {i}"}) for i in range(3)] + ['{"body": 1}', "not json"] * 5
    src = tmp_path / "mixed.jsonl"
    src.write_text("\n".join(lines) + "\n")
    assert cli.main(["build", "text", str(src), "-o", str(tmp_path / "ok"), "--tokenizer", str(SAMPLE_TOK),
                     "--no-progress", "--on-error", "skip"]) == 0
    captured = capsys.readouterr()
    assert "13 records read = 3 written + 10 skipped" in captured.out
    assert "skipped 5 x missing_field, e.g.:" in captured.out and "skipped 5 x malformed_json, e.g.:" in captured.out
    assert captured.out.count(f"{src}:") == 6 and captured.out.count("... 2 more (pass --skip-log FILE") == 2
    assert str(src) not in captured.err
    report = packfmt.open(tmp_path / "ok").manifest.raw["build_report"]
    assert [(e["reason"], e["line"]) for e in report["skipped_examples"]] == [
        ("missing_field", 4), ("malformed_json", 5), ("missing_field", 6), ("malformed_json", 7),
        ("missing_field", 8), ("malformed_json", 9)]
    # one bad record among good ones still suggests skipping it
    with pytest.raises(InputError) as info:
        build_text([src], tmp_path / "x", SAMPLE_TOK)
    assert info.value.line == 4 and "on_error='skip'" in str(info.value)


# ----------------------------------------------------------------------------- 5. oversize losing tokens warns
def test_oversize_losing_tokens_warns_and_json_reports_it(tmp_path, capsys):
    from packfmt.packindex import LostTokensWarning

    ds = write_ds(tmp_path / "ds", [list(range(1, 11))] + [[1, 2]] * 45)  # 100 tokens; one document of 10
    with pytest.warns(LostTokensWarning, match=r"oversize='drop'.*10 of 100 tokens.*max_lost_fraction=0\.01.*oversize='split'"):
        build_pack_index(ds, capacity=8, oversize="drop", name="d")
    base = ["pack", str(ds), "--capacity", "8", "--json", "--overwrite"]
    assert cli.main(base + ["--oversize", "truncate"]) == 0  # 2 of 100 tokens lost > 1%
    captured = capsys.readouterr()
    assert "WARNING: --oversize truncate left out 2 of 100 tokens (2.00%)" in captured.err
    assert "--max-lost-fraction 0.01" in captured.err and "--oversize split" in captured.err
    lost = json.loads(captured.out)["lost_tokens"]
    assert lost == {"tokens": 2, "fraction": 0.02, "max_fraction": 0.01, "exceeded": True}
    assert cli.main(base + ["--oversize", "truncate", "--max-lost-fraction", "0.05"]) == 0  # under the bound: quiet
    captured = capsys.readouterr()
    assert "WARNING" not in captured.err and json.loads(captured.out)["lost_tokens"]["exceeded"] is False


# ----------------------------------------------------------------------------- 8. megatron export and loss masks
def test_megatron_export_says_the_mask_is_not_carried_and_writes_it_beside(tmp_path, capsys):
    from packfmt.megatron import read_megatron_index

    docs = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    store = packfmt.open(write_ds(tmp_path / "ds", docs, loss_mask=True))
    prefix = tmp_path / "mg" / "c"
    assert cli.main(["export", "megatron", str(tmp_path / "ds"), str(prefix)]) == 0
    err = capsys.readouterr().err
    mask = f"{prefix}_loss_mask"
    assert "do not carry the loss mask" in err and f"{mask}.bin" in err and f"{mask}.idx" in err
    dtype, lengths, pointers, doc_idx = read_megatron_index(mask + ".idx")
    assert dtype == np.uint8 and lengths.tolist() == [len(d) for d in docs]
    assert doc_idx.tolist() == read_megatron_index(f"{prefix}.idx")[3].tolist()
    assert np.array_equal(np.fromfile(mask + ".bin", dtype=np.uint8), store.loss_mask)
    try:  # the file pair is an IndexedDataset megatron-core reads, document by document
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from megatron.core.datasets.indexed_dataset import IndexedDataset
    except Exception:  # pragma: no cover - depends on the environment
        IndexedDataset = None
    if IndexedDataset is not None:
        assert [np.asarray(m).tolist() for m in IndexedDataset(mask)] == [store.document_loss_mask(i).tolist()
                                                                           for i in range(len(docs))]
    assert cli.main(["export", "megatron", str(tmp_path / "ds"), str(tmp_path / "n"), "--no-loss-mask"]) == 0
    assert "not exported (--no-loss-mask)" in capsys.readouterr().err
    assert not (tmp_path / "n_loss_mask.bin").exists()


# ----------------------------------------------------------------------------- 6. paths, empty inputs, whose words
def test_plot_path_empty_input_and_words_of_each_front_door(tmp_path, capsys):
    ds = write_ds(tmp_path / "ds")
    bad_plot = tmp_path / "no" / "such" / "dir" / "fig.png"
    assert cli.main(["inspect", str(ds), "--plot", str(bad_plot)]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err and captured.out == ""
    assert f"--plot {bad_plot}" in captured.err and "does not exist" in captured.err

    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(InputError) as info:
        build_text([empty], tmp_path / "out", SAMPLE_TOK)
    assert str(empty) in str(info.value) and "empty" in str(info.value)

    with pytest.raises(packfmt.errors.DatasetExistsError) as info:  # the API's words ...
        build_text([Path(packfmt.__file__).parent / "sample_data" / "text.jsonl"], ds, SAMPLE_TOK)
    assert "overwrite=True" in str(info.value) and "--overwrite" not in str(info.value)
    args = ["build", "text", str(Path(packfmt.__file__).parent / "sample_data" / "text.jsonl"), "-o", str(ds),
            "--tokenizer", str(SAMPLE_TOK), "--no-progress"]
    assert cli.main(args) == 1  # ... and the CLI's
    err = capsys.readouterr().err
    assert "--overwrite" in err and "overwrite=True" not in err
    build_pack_index(ds, capacity=8, name="p")
    with pytest.raises(packfmt.errors.DatasetExistsError) as info:
        build_pack_index(ds, capacity=8, name="p")
    assert "overwrite=True" in str(info.value) and "name=" in str(info.value) and "--name" not in str(info.value)
    assert cli.main(["pack", str(ds), "--capacity", "8", "--name", "p"]) == 1
    err = capsys.readouterr().err
    assert "--overwrite" in err and "--name" in err and "overwrite=True" not in err
    (tmp_path / "x.csv").write_text("text\nhello\n")
    with pytest.raises(InputError) as info:
        build_text([tmp_path / "x.csv"], tmp_path / "out", SAMPLE_TOK)
    assert "fmt=" in str(info.value) and "--format" not in str(info.value)
    with pytest.raises(InputError) as info:  # a bad template is an error in each front door's words, not a traceback
        build_text([empty], tmp_path / "out", SAMPLE_TOK, template="{a.b}")
    assert str(info.value).startswith("template= '{a.b}'")
    assert cli.main(["build", "text", str(empty), "-o", str(tmp_path / "out"), "--tokenizer", str(SAMPLE_TOK),
                     "--template", "{title"]) == 1
    assert capsys.readouterr().err.startswith("packfmt build: error: --template '{title': ")
