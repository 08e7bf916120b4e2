"""``packfmt cp`` to and from object storage through a real S3-protocol server (moto on 127.0.0.1): round trips of
a store with its indexes, a collection with its members, a layout; refusals; an upload stopped midway leaves no
dataset; URLs are printed as URLs (``pack --shards s3://``, ``inspect``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import packfmt
from packfmt import format as F
from packfmt.cli import main
from packfmt.copying import copy_dataset
from packfmt.errors import DatasetExistsError, FormatError, WriteError
from packfmt.validate import validate

from copy_helpers import Stopped, files_of, make_datasets, packs_of, stop_after
from s3_server import BUCKET, cache, s3_server, time_limit  # noqa: F401  (fixtures)

URL = f"s3://{BUCKET}"


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    return make_datasets(tmp_path_factory.mktemp("src"))


def keys(s3, url: str) -> dict[str, bytes]:
    """Every object under ``url`` by its key below it, with its bytes."""
    prefix = url.removeprefix("s3://")
    s3.invalidate_cache()  # listings are cached per file system object; other objects wrote since
    return {k[len(prefix) + 1:]: s3.cat_file(k) for k in sorted(s3.find(prefix))}


def test_a_store_round_trips_through_the_bucket(s3_server, cache, data, tmp_path, capsys):
    url = f"{URL}/rt/store"
    assert main(["cp", str(data["store"]), url]) == 0
    out = capsys.readouterr().out
    assert f"to {url}:" in out and str(cache) not in out  # the URL, never the cache's mirror
    assert keys(s3_server, url) == files_of(data["store"])
    assert validate(url, deep=True).ok
    back = copy_dataset(url, tmp_path / "back", cache_dir=tmp_path / "fresh")  # downloaded verified into a fresh cache
    assert back.files == len(files_of(data["store"])) and files_of(tmp_path / "back") == files_of(data["store"])
    assert copy_dataset(url, f"{URL}/rt/store2").bytes == back.bytes  # bucket to bucket
    assert keys(s3_server, f"{URL}/rt/store2") == files_of(data["store"])


def test_collections_round_trip_with_their_members(s3_server, cache, data, tmp_path, capsys):
    url = f"{URL}/rt/layout"
    done = copy_dataset(data["layout"], url)
    assert done.members > 1 and not done.outside
    assert keys(s3_server, url) == files_of(data["layout"])
    copy_dataset(url, tmp_path / "layout")
    assert files_of(tmp_path / "layout") == files_of(data["layout"])
    assert packs_of(tmp_path / "layout") == packs_of(data["layout"])
    mix = f"{URL}/rt/sets/mix"
    assert main(["cp", str(data["mix"]), mix]) == 1
    assert f"'web' (../web -> {URL}/rt/sets/web)" in capsys.readouterr().err
    assert not s3_server.find(f"{BUCKET}/rt/sets")
    assert main(["cp", str(data["mix"]), mix, "--outside-members", "copy"]) == 0
    assert keys(s3_server, mix) == files_of(data["mix"])
    assert packs_of(packfmt.open(mix, cache_dir=tmp_path / "c2")) == packs_of(data["mix"])
    with pytest.raises(WriteError, match="A17"):  # a member path that would leave the bucket
        copy_dataset(data["mix"], URL, outside_members="copy")  # ../web from the bucket itself
    back = tmp_path / "down" / "mix"
    copy_dataset(mix, back, outside_members="copy")
    assert files_of(back) == files_of(data["mix"]) and validate(back, deep=True).ok


def test_an_occupied_prefix_is_refused_unless_overwrite(s3_server, cache, data, capsys):
    url = f"{URL}/taken/store"
    s3_server.pipe(f"{BUCKET}/taken/store/notes.txt", b"mine")
    assert main(["cp", str(data["store"]), url]) == 1
    assert "holds 1 object(s) but is not a packfmt dataset" in capsys.readouterr().err
    assert list(keys(s3_server, url)) == ["notes.txt"]
    assert main(["cp", str(data["store"]), url, "--overwrite"]) == 0
    assert keys(s3_server, url) == files_of(data["store"])  # the foreign object replaced, as --overwrite says
    with pytest.raises(DatasetExistsError, match="already exists"):
        copy_dataset(data["store"], url)


def test_a_copy_stopped_midway_leaves_no_dataset_in_the_bucket(s3_server, cache, data, tmp_path, monkeypatch):
    url = f"{URL}/stopped/store"
    stop_after(monkeypatch, 3)  # before the upload: nothing leaves the machine
    with pytest.raises(Stopped):
        copy_dataset(data["store"], url)
    monkeypatch.undo()
    assert not keys(s3_server, f"{URL}/stopped")
    import s3fs

    real, put = s3fs.S3FileSystem._put_file, []

    async def stopping(self, lpath, rpath, *args, **kwargs):
        if len(put) == 4:
            raise Stopped("the upload stopped after 4 objects")
        put.append(rpath)
        return await real(self, lpath, rpath, *args, **kwargs)

    monkeypatch.setattr(s3fs.S3FileSystem, "_put_file", stopping)
    s3fs.S3FileSystem.clear_instance_cache()  # (an instance binds its sync put_file when made)
    try:
        with pytest.raises(Stopped):
            copy_dataset(data["store"], url)
    finally:
        monkeypatch.undo()
        s3fs.S3FileSystem.clear_instance_cache()
    left = keys(s3_server, url)
    assert len(left) == 4 and F.MANIFEST not in left and not any(k.endswith(F.PACK_INDEX_JSON) for k in left)
    with pytest.raises(FormatError, match="not a packfmt dataset"):
        packfmt.open(url, cache_dir=tmp_path / "c")
    assert not validate(url).ok
    with pytest.raises(DatasetExistsError, match="not a packfmt dataset"):  # what is left is not taken for a dataset
        copy_dataset(data["store"], url)
    copy_dataset(data["store"], url, overwrite=True)
    assert keys(s3_server, url) == files_of(data["store"])


def test_pack_shards_and_inspect_print_the_url(s3_server, cache, data, capsys):
    src = f"{URL}/printed/store"
    copy_dataset(data["store"], src)
    out = f"{URL}/printed/shards"
    assert main(["pack", src, "--capacity", "48", "--shards", out, "--shard-size", "4KiB"]) == 0
    printed = capsys.readouterr().out
    assert f"to {out} (" in printed and f"to {src}/packs/ffd-48" in printed and str(cache) not in printed
    assert main(["pack", src, "--capacity", "32", "--json", "--shards", f"{out}2", "--shard-size", "4KiB"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["path"] == f"{src}/packs/ffd-32" and record["shards"]["path"] == f"{out}2"
    assert main(["inspect", out]) == 0
    printed = capsys.readouterr().out
    assert f"collection {out}" in printed and str(cache) not in printed
