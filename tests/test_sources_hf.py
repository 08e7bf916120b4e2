"""Hugging Face datasets as sources (in-memory objects and the local cache by name) and incremental JSON arrays:
every build equals the JSONL build of the same records, byte for byte."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

import packfmt
from packfmt.build import build_chat, build_text
from packfmt.errors import InputError
from packfmt.sources import iter_records

os.environ["HF_HUB_OFFLINE"] = "1"
datasets = pytest.importorskip("datasets")
SAMPLE = Path(packfmt.__file__).parent / "sample_data"
TOK = SAMPLE / "tokenizer"


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def binaries(path: Path) -> dict[str, bytes]:
    """Every data file of a store (the manifest differs only in its build report)."""
    out = {p.name: p.read_bytes() for p in sorted(Path(path).glob("*.bin"))}
    assert "tokens.bin" in out and "doc_offsets.bin" in out
    return out


@pytest.fixture(scope="module")
def text_records() -> list[dict]:
    return read_jsonl(SAMPLE / "text.jsonl")


@pytest.fixture(scope="module")
def jsonl_store(tmp_path_factory, text_records) -> Path:
    tmp = tmp_path_factory.mktemp("jsonl")
    return build_text([write_jsonl(tmp / "t.jsonl", text_records)], tmp / "ds", TOK).path


def test_dataset_iterable_and_dict_equal_jsonl(tmp_path, text_records, jsonl_store):
    want = binaries(jsonl_store)
    ds = datasets.Dataset.from_list(text_records)
    got = build_text(ds, tmp_path / "a", TOK, batch_size=7)
    assert binaries(got.path) == want
    assert got.report["records_read"] == len(text_records) == got.report["documents_written"]
    assert got.report["sources"] == [{"path": "Dataset", "format": "hf"}]

    def gen():
        yield from text_records  # a real stream: length unknown until read

    stream = datasets.IterableDataset.from_generator(gen)
    assert binaries(build_text([stream], tmp_path / "b", TOK).path) == want

    other = datasets.Dataset.from_list([{"text": "held-out test text"}])
    dd = datasets.DatasetDict({"test": other, "train": ds})
    result = build_text(dd, tmp_path / "c", TOK)
    assert binaries(result.path) == want
    assert result.report["sources"][0]["split"] == "train"


def test_dataset_dict_without_train_lists_splits(tmp_path, text_records):
    dd = datasets.DatasetDict({"validation": datasets.Dataset.from_list(text_records[:3]),
                               "test": datasets.Dataset.from_list(text_records[3:5])})
    with pytest.raises(InputError) as err:
        build_text(dd, tmp_path / "x", TOK)
    assert err.value.reason == "missing_split" and "validation" in str(err.value) and "split=" in str(err.value)
    assert not (tmp_path / "x").exists()
    result = build_text(dd, tmp_path / "y", TOK, split="test")
    assert result.report["documents_written"] == 2


def test_missing_column_names_the_columns(tmp_path, text_records):
    ds = datasets.Dataset.from_list(text_records)
    with pytest.raises(InputError) as err:
        build_text(ds, tmp_path / "x", TOK, field="body")
    assert err.value.reason == "missing_field" and "'text'" in str(err.value) and "field=" in str(err.value)


def test_chat_from_dataset_equals_jsonl(tmp_path):
    records = read_jsonl(SAMPLE / "chat.jsonl")
    want = binaries(build_chat([write_jsonl(tmp_path / "c.jsonl", records)], tmp_path / "j", TOK).path)
    assert "loss_mask.bin" in want
    got = build_chat(datasets.Dataset.from_list(records), tmp_path / "h", TOK)
    assert binaries(got.path) == want


def test_json_array_streams_and_equals_jsonl(tmp_path, text_records, jsonl_store):
    arr = tmp_path / "arr.json"
    arr.write_text(json.dumps(text_records, indent=1), encoding="utf-8")
    assert binaries(build_text([arr], tmp_path / "a", TOK).path) == binaries(jsonl_store)


def test_json_array_memory_is_bounded_by_an_element_not_the_file(tmp_path):
    big = tmp_path / "big.json"
    with open(big, "w", encoding="utf-8") as f:
        f.write("[")
        for i in range(20000):
            f.write(("," if i else "") + json.dumps({"id": i, "conversations": [{"from": "human", "value": "x" * 400}]}))
        f.write("]")
    size = big.stat().st_size
    tracemalloc.start()
    n = sum(1 for _ in iter_records([big]))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert n == 20000
    assert peak < size / 10, f"peak {peak} bytes while reading a {size}-byte array: not incremental"


def test_json_array_truncated_keeps_elements_before_and_counts_one_bad(tmp_path, text_records):
    arr = tmp_path / "cut.json"
    arr.write_text(json.dumps(text_records[:5])[:-30], encoding="utf-8")
    raws = list(iter_records([arr]))
    good = [r for r in raws if isinstance(r.obj, dict)]
    bad = [r for r in raws if isinstance(r.obj, InputError)]
    assert len(good) == 4 and len(bad) == 1
    assert bad[0].obj.reason == "malformed_json" and bad[0].line == 5
    result = build_text([arr], tmp_path / "s", TOK, on_error="skip")
    assert result.report["records_read"] == 5 and result.report["skipped"] == {"malformed_json": 1}


def make_cached(cache: Path, name: str, records: list[dict], tmp: Path) -> None:
    """Put ``name`` (``user/dataset``) in an HF datasets cache the way a past online load_dataset leaves it."""
    src = write_jsonl(tmp / "src.jsonl", records)
    code = ("import datasets, sys; datasets.load_dataset('json', data_files={'train': sys.argv[1]})")
    env = {**os.environ, "HF_DATASETS_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    subprocess.run([sys.executable, "-c", code, str(src)], check=True, env=env, capture_output=True)
    built = next((cache / "json").glob("default-*/0.0.0/*/"))
    user, short = name.split("/")
    dst = cache / f"{user}___{short}" / "default" / "0.0.0" / "abc"
    shutil.copytree(built, dst)
    (dst / "json-train.arrow").rename(dst / f"{short}-train.arrow")
    info = json.loads((dst / "dataset_info.json").read_text())
    info.update(builder_name=short, dataset_name=short)
    (dst / "dataset_info.json").write_text(json.dumps(info))
    shutil.rmtree(cache / "json")


def test_cli_format_hf_reads_the_local_cache_and_never_downloads(tmp_path, text_records, jsonl_store):
    cache = tmp_path / "cache"
    make_cached(cache, "tester/tiny", text_records, tmp_path)
    env = {**os.environ, "HF_DATASETS_CACHE": str(cache), "HF_HUB_OFFLINE": "0"}  # offline is forced by packfmt
    cmd = [sys.executable, "-m", "packfmt.cli", "build", "text", "--format", "hf", "--tokenizer", str(TOK),
           "--no-progress", "-o"]
    done = subprocess.run([*cmd, str(tmp_path / "ds"), "tester/tiny"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "read split 'train' of tester/tiny" in done.stdout
    assert binaries(tmp_path / "ds") == binaries(jsonl_store)
    missing = subprocess.run([*cmd, str(tmp_path / "no"), "tester/absent"], env=env, capture_output=True, text=True)
    assert missing.returncode != 0 and not (tmp_path / "no").exists()
    assert "not in the local Hugging Face cache" in missing.stderr and "load_dataset('tester/absent')" in missing.stderr
