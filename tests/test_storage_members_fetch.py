"""A whole fetch of a remote collection (``packfmt.open(url)``): members fetched several at once in member order
(``storage.in_flight``), one pin for all of them (not a descriptor a member), and eviction that honours a pin over
a member's folder (``cache.evict``). Against a real S3-protocol server (moto), and fsspec's ``memory://`` file
system where only the number of members matters."""

from __future__ import annotations

import gc
import os
import resource
import threading
import time
from pathlib import Path

import fsspec
import numpy as np
import pytest

import packfmt
from packfmt.collection import write_collection
from packfmt.errors import ChecksumError
from packfmt.storage.cache import evict, mirror_path
from packfmt.storage.in_flight import MEMBERS_ENV, in_order, members_in_flight
from packfmt.storage.upload import upload_tree
from packfmt.torch.testing import write_split_stores

from s3_server import BUCKET, cache, s3_server, time_limit  # noqa: F401  (fixtures; time_limit: autouse)


def _collection(root: Path, members: int, docs_per_member: int = 2) -> Path:
    """``root/coll`` over ``members`` stores at ``root/stores/mNNNNNN`` (paths ``../stores/...``: outside the
    collection's folder, as ``packfmt merge`` of stores kept elsewhere writes them)."""
    n = members * docs_per_member
    lengths = np.random.default_rng(members).integers(1, 20, n)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tokens = (np.arange(offsets[-1]) % 997).astype(np.uint16)
    paths = write_split_stores(root / "stores", tokens, offsets, np.arange(0, n + 1, docs_per_member), vocab_size=1000)
    return write_collection(root / "coll", [(None, p) for p in paths]).path


def _to_memory(root: Path, prefix: str) -> str:
    fs = fsspec.filesystem("memory")
    for p in sorted(root.rglob("*")):
        if p.is_file():
            fs.pipe_file(f"memory://{prefix}/{p.relative_to(root)}", p.read_bytes())
    return f"memory://{prefix}/coll"


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_more_members_than_open_files_allowed(tmp_path):
    """Each member used to hold a pin (an open descriptor) for as long as the collection was open: a collection of
    more members than the soft limit on open files (1,024 on many systems) failed with EMFILE."""
    _collection(tmp_path / "src", 300)
    url = _to_memory(tmp_path / "src", "fdlimit")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = _open_fds() + 120  # fewer than the members
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
    try:
        ds = packfmt.open(url, cache_dir=tmp_path / "cache")
        assert len(ds.members) == 300
        assert len(ds.origin.pins) == 2  # the collection's folder, and the one holding it and its members
        assert int(ds.document(599).sum()) >= 0 and ds.num_documents == 600
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_pin_over_the_members_keeps_them_from_eviction(tmp_path):
    _collection(tmp_path / "src", 12)
    url = _to_memory(tmp_path / "src", "evict")
    root = tmp_path / "cache"
    ds = packfmt.open(url, cache_dir=root)
    member_dir = mirror_path("memory://evict/stores/m000005", cache_dir=root)
    files = sorted(p.name for p in member_dir.iterdir())
    assert "tokens.bin" in files
    with pytest.warns(UserWarning, match="over its limit"):
        assert evict(root, 0) == 0  # every file is under a pin this process holds (shared): nothing removed
    assert sorted(p.name for p in member_dir.iterdir()) == files
    first = ds.document(10).copy()
    del ds
    gc.collect()
    assert evict(root, 0) > 0  # no pin held now
    assert not (member_dir / "tokens.bin").exists()
    again = packfmt.open(url, cache_dir=root)  # fetched again, verified
    assert np.array_equal(again.document(10), first)


def test_in_flight_fetch_equals_one_at_a_time(s3_server, tmp_path, monkeypatch):  # noqa: F811
    _collection(tmp_path / "src", 16)
    upload_tree(tmp_path / "src", f"s3://{BUCKET}/inflight")
    url = f"s3://{BUCKET}/inflight/coll"
    got = {}
    for k in ("1", "8"):
        monkeypatch.setenv(MEMBERS_ENV, k)
        root = tmp_path / f"cache-{k}"
        ds = packfmt.open(url, cache_dir=root)
        mirror = mirror_path(f"s3://{BUCKET}/inflight", cache_dir=root)
        got[k] = ({str(p.relative_to(mirror)): p.read_bytes() for p in sorted(mirror.rglob("*")) if p.is_file()},
                  len((root / "downloads.log").read_text().splitlines()), ds.doc_lengths.copy())
        del ds
    assert got["1"][0].keys() == got["8"][0].keys() and all(got["1"][0][k] == got["8"][0][k] for k in got["1"][0])
    assert got["1"][1] == got["8"][1] == 16 * 2 + 1  # tokens and offsets of each member; doc_lengths.bin
    assert np.array_equal(got["1"][2], got["8"][2])


def test_in_flight_error_is_the_first_member_in_order(s3_server, tmp_path, monkeypatch):  # noqa: F811
    """Members 3 and 11 damaged: the error names member 3 whether members are fetched one at a time or 8 at once,
    and nothing of a damaged file is served."""
    _collection(tmp_path / "src", 16)
    upload_tree(tmp_path / "src", f"s3://{BUCKET}/damaged")
    for m in (3, 11):
        key = f"{BUCKET}/damaged/stores/m{m:06d}/tokens.bin"
        good = s3_server.cat_file(key)
        s3_server.pipe_file(key, bytes([good[0] ^ 1]) + good[1:])
    for k in ("1", "8"):
        monkeypatch.setenv(MEMBERS_ENV, k)
        with pytest.raises(ChecksumError, match="refused by the cache") as exc:
            packfmt.open(f"s3://{BUCKET}/damaged/coll", cache_dir=tmp_path / f"cache-{k}")
        assert exc.value.file == f"s3://{BUCKET}/damaged/stores/m000003/tokens.bin"
        assert not (mirror_path(f"s3://{BUCKET}/damaged/stores/m000003", cache_dir=tmp_path / f"cache-{k}")
                    / "tokens.bin").exists()


def test_in_order_runs_each_once_and_raises_the_first_failure_in_order():
    seen, lock, running, peak = [], threading.Lock(), [0], [0]

    def fn(i):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.002 * (7 - i % 7))  # later calls often finish first
        with lock:
            running[0] -= 1
            seen.append(i)
        if i in (13, 9):
            raise KeyError(i)

    with pytest.raises(KeyError) as exc:
        in_order(fn, 40, 4)
    assert exc.value.args == (9,)  # 13 may have failed first in time: 9 comes first in order
    assert set(range(10)) <= set(seen) and max(seen) <= 9 + 2 * 4 - 1  # none started past the window of 9
    assert len(seen) == len(set(seen)) and 1 < peak[0] <= 4
    seen.clear()
    in_order(seen.append, 25, 3)
    assert sorted(seen) == list(range(25))


@pytest.mark.parametrize("value", ["0", "65", "x"])
def test_members_in_flight_env_refused(monkeypatch, value):
    monkeypatch.setenv(MEMBERS_ENV, value)
    with pytest.raises(ValueError, match=MEMBERS_ENV):
        members_in_flight()


def test_streamed_residency_bounded_by_open_files():
    """A streamed collection keeps each resident member's pin open: at most a quarter of the soft limit on open
    files stay resident (10,000 tiny members under a large cache_limit used to pass a limit of 1,024)."""
    from packfmt.collection import lazy_members
    from packfmt.remote.eviction import resident_bound

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = _open_fds() + 400
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
    try:
        assert resident_bound() == min(lazy_members.MAX_MAPPED, low // 4)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_member_changed_in_a_mirrored_table_collection_is_refused(tmp_path):
    """A local open of a mirror (a DataLoader worker re-opening what its parent fetched) hashes again every member file
    whose stat moved. For a collection whose members are in a member table (format 2.0, from 256 members) the members
    were not looked at, and a changed byte was served."""
    _collection(tmp_path / "src", 300)
    url = _to_memory(tmp_path / "src", "mirrortable")
    ds = packfmt.open(url, cache_dir=tmp_path / "cache")
    assert (Path(ds.path) / "members.bin").is_file()  # the table form
    tokens = Path(os.path.normpath(ds.member_path(150))) / "tokens.bin"
    good = tokens.read_bytes()
    tokens.write_bytes(bytes([good[0] ^ 1]) + good[1:])
    with pytest.raises(ChecksumError, match="changed in the cache") as exc:
        packfmt.open(ds.path)
    assert exc.value.file == str(tokens)
    assert not tokens.exists()  # removed: the next open of the URL fetches it again
    again = packfmt.open(url, cache_dir=tmp_path / "cache")
    assert tokens.read_bytes() == good and again.num_documents == 600


def test_shards_and_exports_of_a_streamed_collection_refused_and_of_its_url_written(tmp_path):
    """Writing shards and both exports read every member; a collection opened with stream=True fetches members a batch
    at a time, and each failed with 'not a directory' about a member path in the cache. Now refused by name, with
    nothing written; the URL (fetched whole) works."""
    from packfmt.collection.shards import write_shards
    from packfmt.errors import WriteError
    from packfmt.export_webdataset import export_webdataset
    from packfmt.megatron import export_megatron
    from packfmt.packindex import build_pack_index

    coll = _collection(tmp_path / "src", 6)
    build_pack_index(coll, capacity=32, algorithm="ffd", name="p")
    url = _to_memory(tmp_path / "src", "shardsrc")
    streamed = packfmt.open(url, stream=True, cache_dir=tmp_path / "cache")
    for write, out in ((lambda o: write_shards(streamed, "p", o), "shards"),
                       (lambda o: export_webdataset(streamed, o), "wds"),
                       (lambda o: export_megatron(streamed, o / "prefix"), "megatron")):
        with pytest.raises(WriteError, match="stream=True") as exc:
            write(tmp_path / out)
        assert exc.value.field == "dataset" and not (tmp_path / out).exists()
    out = write_shards(url, "p", tmp_path / "out")  # the URL: fetched whole, then written
    assert out.pack_index("p").num_packs == packfmt.open(coll).pack_index("p").num_packs
    assert export_webdataset(url, tmp_path / "wds2").packs == out.pack_index("p").num_packs
