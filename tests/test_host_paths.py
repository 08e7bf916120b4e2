"""No path of the writing host in any file packfmt writes (spec/SECURITY.md A15, FORMAT.md §2.2, §5.3).

Every command that writes files is run over temporary folders (builds of every kind, one with a skipped record, a
collection, a physical merge, pack indexes, a pack-ordered layout, both exports and a Megatron import), and every
file written is searched for the temporary folder's absolute path and for the package's: reports name local files
relative to the dataset they are written into.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import packfmt
from packfmt.cli import main
from packfmt.report_paths import build_report_paths, report_path

from mixed_stores import SAMPLE, build_mixed_stores, build_store


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostpaths")
    stores = build_mixed_stores(root)
    bad = root / "bad.jsonl"
    bad.write_text('{"text": "a fine record"}\n{not json\n', encoding="utf-8")
    build_store("text", bad, root / "skipped", "--on-error", "skip")
    cli = [
        ["merge", *(str(p) for p in stores.values()), "-o", str(root / "coll")],
        ["merge", "--physical", str(root / "coll"), "-o", str(root / "phys")],
        ["pack", str(root / "coll"), "--capacity", "256", "--name", "p"],
        ["pack", str(root / "coll"), "--capacity", "256", "--name", "q", "--shards", str(root / "shards")],
        ["export", "webdataset", str(root / "coll"), "--index", "p", str(root / "wds")],
        ["export", "megatron", str(stores["text"]), str(root / "meg" / "text")],
        ["build", "megatron", str(root / "meg" / "text"), "-o", str(root / "imported"), "--vocab-size", "8192"],
    ]
    for args in cli:
        assert main(args) == 0, args
    inputs = {bad, root / "vqa.json", *(root / "vqa_images").iterdir()}
    return root, [p for p in root.rglob("*") if p.is_file() and p not in inputs]


def test_no_written_file_holds_a_host_path(written):
    root, files = written
    assert len(files) > 50 and any(p.name == "export.json" for p in files)
    needles = {str(root), str(root.resolve()), str(Path(packfmt.__file__).resolve().parent)}
    found = [(str(p.relative_to(root)), n) for p in files for n in needles if n.encode() in p.read_bytes()]
    assert not found, f"host paths written: {found}"


def test_reports_name_files_relative_to_their_dataset(written):
    root, _ = written
    vqa = json.loads((root / "vqa" / packfmt.format.MANIFEST).read_text())["build_report"]
    assert vqa["sources"][0]["path"] == "../vqa.json" and vqa["settings"]["image_root"] == "../vqa_images"
    assert (root / "vqa" / vqa["sources"][0]["path"]).resolve() == (root / "vqa.json").resolve()
    text = json.loads((root / "text" / packfmt.format.MANIFEST).read_text())["build_report"]
    if Path(os.path.commonpath([SAMPLE.resolve(), root.resolve()])) == Path("/"):  # nothing in common but the root:
        assert text["sources"][0]["path"] == "text.jsonl"  # its name only (a climb to / would spell the host's paths)
    else:
        assert (root / "text" / text["sources"][0]["path"]).resolve() == (SAMPLE / "text.jsonl").resolve()
    skipped = json.loads((root / "skipped" / packfmt.format.MANIFEST).read_text())["build_report"]
    [example] = skipped["skipped_examples"]
    assert example["file"] == "../bad.jsonl" and example["message"].startswith("../bad.jsonl:2:")
    merged = json.loads((root / "phys" / packfmt.format.MANIFEST).read_text())["build_report"]
    assert [m["path"] for m in merged["members"]] == ["../text", "../chat", "../vqa"]
    assert json.loads((root / "wds" / "export.json").read_text())["source"] == "../coll"


def test_urls_stay_and_a_dataset_at_a_url_gets_names(tmp_path):
    assert report_path("s3://bucket/data/train.jsonl", tmp_path / "out") == "s3://bucket/data/train.jsonl"
    assert report_path(tmp_path / "in" / "a.jsonl", "s3://bucket/out") == "a.jsonl"
    assert report_path(f"file://{tmp_path}/in/a.jsonl", tmp_path / "out") == "../in/a.jsonl"
    report = {"sources": [{"path": "my/hf-dataset", "format": "hf"}, {"path": str(tmp_path / "x.json"), "format": "json"}],
              "settings": {"image_root": None}, "skipped_examples": [{"file": None, "message": "m"}]}
    named = build_report_paths(report, tmp_path / "out")
    assert named["sources"] == [{"path": "my/hf-dataset", "format": "hf"}, {"path": "../x.json", "format": "json"}]
    assert named["settings"] == {"image_root": None} and named["skipped_examples"] == report["skipped_examples"]
