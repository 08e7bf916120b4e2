"""Object storage end to end (issue 12): build to s3://, pack, merge, validate, inspect and read with
PackedDataset through a real S3-protocol server (moto, on 127.0.0.1), compared with the same local data."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import numpy as np
import pytest

import packfmt
from packfmt.build import build_text
from packfmt.cli import main
from packfmt.errors import DatasetExistsError, WriteError
from packfmt.packindex import build_pack_index

from s3_server import BUCKET, cache, s3_server, time_limit  # noqa: F401  (fixtures)

os.environ["HF_HUB_OFFLINE"] = "1"
SAMPLE = Path(packfmt.__file__).parent / "sample_data"
TOK = str(SAMPLE / "tokenizer")
URL = f"s3://{BUCKET}"


def _items(ds) -> list[np.ndarray]:
    return [ds[i]["input_ids"].numpy() for i in range(len(ds))]


def _downloads(cache_root: Path) -> list[str]:
    log = cache_root / "downloads.log"
    return [json.loads(line)["url"] for line in log.read_text().splitlines()] if log.exists() else []


def test_cli_build_pack_validate_inspect_read(s3_server, cache, tmp_path, capsys):
    torch_ds = pytest.importorskip("packfmt.torch")
    url = f"{URL}/cli/text"
    # the input itself is read from the bucket too
    s3_server.put_file(str(SAMPLE / "text.jsonl"), f"{BUCKET}/inputs/text.jsonl")
    assert main(["build", "text", f"{URL}/inputs/text.jsonl", "-o", url, "--tokenizer", TOK, "--no-progress"]) == 0
    assert main(["pack", url, "--capacity", "128"]) == 0
    assert f"to {url}/packs/ffd-128" in capsys.readouterr().out
    names = sorted(p.split("/cli/text/")[1] for p in s3_server.find(f"{BUCKET}/cli/text"))
    assert names == ["doc_offsets.bin", "manifest.json", "packs/ffd-128/index.json", "packs/ffd-128/pack_offsets.bin",
                     "packs/ffd-128/segments.bin", "tokens.bin"]
    assert main(["validate", url, "--deep"]) == 0
    assert main(["inspect", url]) == 0
    assert "60" in capsys.readouterr().out

    # the same data built and packed locally
    local = tmp_path / "local"
    build_text([SAMPLE / "text.jsonl"], local, TOK)
    build_pack_index(local, capacity=128)
    assert s3_server.cat_file(f"{BUCKET}/cli/text/tokens.bin") == (local / "tokens.bin").read_bytes()

    # a node with an empty cache reads it: every file fetched once, items identical to the local read
    fresh = tmp_path / "fresh-cache"
    os.environ["PACKFMT_CACHE"] = str(fresh)
    remote = torch_ds.PackedDataset(url)
    assert Path(remote.path).is_relative_to(fresh)
    got, want = _items(remote), _items(torch_ds.PackedDataset(local))
    assert len(got) == len(want) > 0 and all(np.array_equal(a, b) for a, b in zip(got, want))
    fetched = _downloads(fresh)
    assert sorted(fetched) == sorted(f"{url}/{n}" for n in names if not n.endswith(".json"))
    torch_ds.PackedDataset(url)  # warm: nothing downloaded again
    assert _downloads(fresh) == fetched


def test_upload_puts_manifest_last_and_refuses_existing(s3_server, cache, monkeypatch):
    from packfmt.storage.transport import Remote

    order: list[str] = []
    real = Remote.put_file  # every request packfmt makes goes through storage/transport's Remote

    def recording(self, lpath, rpath, *a, **kw):
        order.append(rpath.rsplit("/", 1)[-1])
        return real(self, lpath, rpath, *a, **kw)

    monkeypatch.setattr(Remote, "put_file", recording)
    url = f"{URL}/order/ds"
    result = build_text([SAMPLE / "text.jsonl"], url, TOK)
    assert result.path == url
    assert order[-1] == "manifest.json" and sorted(order) == ["doc_offsets.bin", "manifest.json", "tokens.bin"]
    order.clear()
    build_pack_index(url, capacity=64)
    assert order[-1] == "index.json" and len(order) == 3
    with pytest.raises(DatasetExistsError, match="overwrite=True"):
        build_text([SAMPLE / "text.jsonl"], url, TOK)
    assert main(["build", "text", str(SAMPLE / "text.jsonl"), "-o", url, "--tokenizer", TOK, "--no-progress"]) == 1
    # overwrite: the store is replaced and its stale pack index is gone from the bucket
    build_text([SAMPLE / "text.jsonl"], url, TOK, overwrite=True, limit=10)
    assert not s3_server.exists(f"{BUCKET}/order/ds/packs/ffd-64/index.json")
    assert packfmt.open(url).num_documents == 10


def test_collection_in_bucket_resolves_relative_members(s3_server, cache, tmp_path):
    torch_ds = pytest.importorskip("packfmt.torch")
    for name, limit in (("a", 20), ("b", 40)):
        build_text([SAMPLE / "text.jsonl"], f"{URL}/stores/{name}", TOK, limit=limit)
        build_text([SAMPLE / "text.jsonl"], tmp_path / "stores" / name, TOK, limit=limit)
    coll_url = f"{URL}/mixes/ab"
    assert main(["merge", f"{URL}/stores/a", f"{URL}/stores/b", "-o", coll_url]) == 0
    manifest = json.loads(s3_server.cat_file(f"{BUCKET}/mixes/ab/manifest.json"))
    assert [m["path"] for m in manifest["members"]] == ["../../stores/a", "../../stores/b"]
    assert main(["pack", coll_url, "--capacity", "128"]) == 0
    packfmt.collection.write_collection(tmp_path / "mixes" / "ab", [(None, tmp_path / "stores" / "a"),
                                                                    (None, tmp_path / "stores" / "b")])
    build_pack_index(tmp_path / "mixes" / "ab", capacity=128)
    os.environ["PACKFMT_CACHE"] = str(tmp_path / "other-node")
    remote = packfmt.open(coll_url)
    assert remote.num_documents == 60 and [m.name for m in remote.members] == ["a", "b"]
    got, want = _items(torch_ds.PackedDataset(coll_url)), _items(torch_ds.PackedDataset(tmp_path / "mixes" / "ab"))
    assert len(got) == len(want) and all(np.array_equal(x, y) for x, y in zip(got, want))
    assert main(["validate", coll_url, "--deep"]) == 0
    # physical merge of the remote collection to a local store: the same tokens
    assert main(["merge", "--physical", coll_url, "-o", str(tmp_path / "flat")]) == 0
    flat = packfmt.open(tmp_path / "flat")
    assert flat.num_documents == 60 and np.array_equal(np.asarray(flat.tokens), np.concatenate(
        [np.asarray(packfmt.open(tmp_path / "stores" / n).tokens) for n in "ab"]))
    # a collection in the bucket cannot list a local member, nor a local one a remote member
    with pytest.raises(WriteError, match="cannot list a local member"):
        packfmt.collection.write_collection(f"{URL}/mixes/bad", [(None, tmp_path / "stores" / "a")])
    with pytest.raises(WriteError, match="cannot list a member in object storage"):
        packfmt.collection.write_collection(tmp_path / "bad", [(None, f"{URL}/stores/a")])


def test_file_urls_are_local_paths(tmp_path):
    build_text([SAMPLE / "text.jsonl"], f"file://{tmp_path}/ds", TOK, limit=5)
    assert packfmt.open(f"file://{tmp_path}/ds").num_documents == 5
    assert (tmp_path / "ds" / "manifest.json").is_file()


def test_cli_megatron_and_chat_inputs_from_the_bucket(s3_server, cache, tmp_path, monkeypatch):
    import tempfile

    from packfmt.megatron import export_megatron

    private = tmp_path / "tmp"  # this process's temp dirs only: the other xdist worker's tests use /tmp too
    private.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private))

    local = tmp_path / "local"
    build_text([SAMPLE / "text.jsonl"], local, TOK, limit=12)
    export_megatron(local, tmp_path / "mg" / "web_text_document")
    s3_server.put(str(tmp_path / "mg") + "/", f"{BUCKET}/mg/", recursive=True)
    store = packfmt.open(local)
    assert main(["build", "megatron", f"{URL}/mg/web_text_document", "-o", f"{URL}/mg/ds",
                 "--vocab-size", str(store.vocab_size)]) == 0
    back = packfmt.open(f"{URL}/mg/ds")
    assert np.array_equal(np.asarray(back.tokens), np.asarray(store.tokens))
    assert np.array_equal(np.asarray(back.doc_offsets), np.asarray(store.doc_offsets))
    s3_server.put_file(str(SAMPLE / "chat.jsonl"), f"{BUCKET}/in/chat.jsonl")
    assert main(["build", "chat", f"{URL}/in/chat.jsonl", "-o", str(tmp_path / "chat"), "--tokenizer", TOK,
                 "--no-progress"]) == 0
    assert main(["build", "chat", str(SAMPLE / "chat.jsonl"), "-o", str(tmp_path / "chat-local"), "--tokenizer", TOK,
                 "--no-progress"]) == 0
    assert (tmp_path / "chat" / "tokens.bin").read_bytes() == (tmp_path / "chat-local" / "tokens.bin").read_bytes()
    assert not list(private.glob("packfmt-inputs-*"))  # downloaded inputs removed


def test_python_build_reads_remote_inputs(s3_server, cache, tmp_path):
    """build_text(inputs=[URL]) fetches the inputs like the CLI does (and a remote out uploads)."""
    s3_server.put_file(str(SAMPLE / "text.jsonl"), f"{BUCKET}/api-inputs/text.jsonl")
    result = build_text([f"{URL}/api-inputs/text.jsonl"], tmp_path / "from-url", TOK)
    local = build_text([SAMPLE / "text.jsonl"], tmp_path / "local", TOK)
    assert (Path(result.path) / "tokens.bin").read_bytes() == (Path(local.path) / "tokens.bin").read_bytes()
    assert result.report["documents_written"] == 60


def test_ranged_plan_of_remote_inputs_reads_no_whole_object(s3_server, tmp_path):
    """JSONL byte ranges end just after a newline (a line longer than a search window included) and tile the
    object; Parquet row groups come from the footer; a missing object is a one-line error naming it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from packfmt.storage import ranges
    from packfmt.storage.errors import StorageError

    lines = [json.dumps({"text": "x" * (k * 37 % 200)}) for k in range(300)]
    lines[150] = json.dumps({"text": "y" * (3 * ranges.WINDOW)})  # the newline after a cut is 3 windows away
    data = ("\n".join(lines) + "\n").encode()
    s3_server.pipe_file(f"{BUCKET}/r/a.jsonl", data)
    url = f"s3://{BUCKET}/r/a.jsonl"
    cuts = ranges.line_ranges(url, 5)
    assert cuts == ranges.line_ranges(url, 5)  # a function of the object alone
    assert cuts[0][0] == 0 and cuts[-1][1] == len(data) and len(cuts) > 5
    assert all(a[1] == b[0] for a, b in itertools.pairwise(cuts))
    assert all(data[e - 1:e] == b"\n" for _, e in cuts)
    assert b"".join(ranges.read_range(url, b, e) for b, e in cuts) == data
    pq.write_table(pa.table({"text": [str(i) for i in range(50)]}), tmp_path / "t.parquet", row_group_size=16)
    s3_server.put_file(str(tmp_path / "t.parquet"), f"{BUCKET}/r/t.parquet")
    assert ranges.row_groups(f"s3://{BUCKET}/r/t.parquet") == [16, 16, 16, 2]
    with pytest.raises(StorageError, match="no such object"):
        ranges.line_ranges(f"s3://{BUCKET}/r/missing.jsonl", 20)
