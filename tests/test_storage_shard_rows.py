"""A pack-ordered layout read streamed through a real S3-protocol server (moto on 127.0.0.1), its index a shard at a
time (spec/COLLECTION.md §9.4; ``remote.shard_index``): the open fetches ``index.json``, ``shard_digests.bin`` and
``pack_tokens.bin`` (4 bytes a pack, read by the default sampler) only, each shard's rows of ``pack_offsets.bin`` and ``segments.bin`` arrive (by ranged GETs, checked against their
digests) when a batch first touches the shard, every pack reads as the layout read locally, and rows changed in the
bucket or in the cache are never used."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

import packfmt
from packfmt import format as F
from packfmt._io import checksum_file
from packfmt.collection import write_collection
from packfmt.remote.shard_index import ShardedIndex
from packfmt.collection.shards import write_shards
from packfmt.errors import FormatError
from packfmt.index import PackIndex
from packfmt.packindex import build_pack_index
from packfmt.storage.upload import upload_tree
from packfmt.torch import DistributedPackSampler, PackedDataset

from s3_server import BUCKET, cache, s3_server, time_limit  # noqa: F401  (fixtures; time_limit: autouse)

KEYS = ("input_ids", "labels", "position_ids", "seq_lens", "num_label_tokens")


@pytest.fixture(scope="module")
def layout(s3_server, tmp_path_factory):  # noqa: F811
    """(the layout on disk, its URL, its index "p" read locally): 30 members, an ffd index, ~1 KiB shards."""
    root = tmp_path_factory.mktemp("rows")
    rng = np.random.default_rng(3)
    paths = []
    for m in range(30):
        paths.append(root / "members" / f"m{m:02d}")
        with packfmt.DatasetWriter(paths[-1], vocab_size=1000, loss_mask=True, tokenizer={"name": "t", "hash": None}) as w:
            for n in rng.integers(1, 60, 20):
                w.add_document(rng.integers(0, 1000, int(n)), rng.integers(0, 2, int(n)))
    src = write_collection(root / "src", [(None, p) for p in paths])
    build_pack_index(src, capacity=64, algorithm="ffd", name="p")
    out = write_shards(src, "p", root / "up" / "layout", shard_bytes=1024)
    assert len(out.members) >= 10 and out.pack_index("p").manifest.raw["format_version"] == "1.2"
    url = f"s3://{BUCKET}/rows"
    upload_tree(root / "up", url)
    return out, f"{url}/layout"


def _log(cache_root: Path) -> list[dict]:
    log = cache_root / "downloads.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _same(ds, local, packs) -> None:
    got, want = ds.__getitems__(packs), local.__getitems__(packs)
    for x, y in zip(got, want):
        for key in KEYS:
            assert x[key].tolist() == y[key].tolist(), (int(y["pack_id"]), key)


def test_rows_arrive_a_shard_at_a_time_and_read_the_same(layout, cache):  # noqa: F811
    out, url = layout
    local = PackedDataset(str(out.path), "p")
    ds = PackedDataset(url, "p", stream=True, cache_limit=1 << 30)
    idx = ds.index
    assert isinstance(idx, ShardedIndex) and len(ds) == len(local)
    fetched = [e["url"].rsplit("/", 1)[-1] for e in _log(cache)]
    assert sorted(fetched) == ["pack_tokens.bin", "shard_digests.bin"]  # no segments.bin, no pack_offsets.bin
    seg = idx.path / F.SEGMENTS
    assert seg.stat().st_size == 24 * out.num_documents and seg.stat().st_blocks == 0  # sparse, nothing in it yet
    k = len(out.members) // 2
    first = int(np.cumsum([0] + out.manifest.raw["layout"]["member_packs"])[k])
    _same(ds, local, [first])  # one pack of shard k: its rows only
    assert idx._ready.tolist() == [i == k for i in range(len(out.members))]
    rows = [e for e in _log(cache) if e.get("why", "").startswith("rows of shard")]
    assert [e["why"] for e in rows] == [f"rows of shard {k}"]
    assert 0 < rows[0]["bytes"] < (seg.stat().st_size + (idx.path / F.PACK_OFFSETS).stat().st_size) / 5
    order = np.random.default_rng(0).permutation(len(ds))
    for b in range(0, len(order), 7):
        _same(ds, local, order[b:b + 7])
    for i in order[:20].tolist():  # single items too
        assert ds[i]["labels"].tolist() == local[i]["labels"].tolist()
    assert idx._ready.all()
    whole = (out.path / F.PACKS_DIR / "p" / F.SEGMENTS).read_bytes()
    assert seg.read_bytes() == whole  # every shard's rows fetched once, in place
    assert idx.fetched_rows == len(whole) + 8 * (len(ds) + len(out.members))  # (a shard's last offset twice)
    assert ds.pack_num_tokens().tolist() == local.pack_num_tokens().tolist()  # pack_tokens.bin, on first use
    assert ds.pack_num_tokens().dtype == np.int64
    assert ds.pack_groups().tolist() == local.pack_groups().tolist()
    again = PackedDataset(url, "p", stream=True, cache_limit=1 << 30)  # another process on the node: rows hashed,
    _same(again, local, order[:16])                                    # not fetched again
    assert again.index.fetched_rows == 0


def test_the_token_balanced_window_sampler_reads_every_pack_once(layout, cache):  # noqa: F811
    out, url = layout
    local = PackedDataset(str(out.path), "p")
    ds = PackedDataset(url, "p", stream=True, cache_limit=1 << 30)
    sampler = DistributedPackSampler(ds, num_replicas=1, rank=0, window=3, balance="tokens", seed=5)
    want = DistributedPackSampler(local, num_replicas=1, rank=0, window=3, balance="tokens", seed=5)
    order = np.array(list(sampler))
    assert order.tolist() == list(want) and sorted(order.tolist()) == list(range(len(ds)))
    for b in range(0, len(order), 5):
        _same(ds, local, order[b:b + 5])


def _upload_changed(s3_server, url: str, name: str, edit) -> bytes:  # noqa: F811
    key = url.split("://", 1)[1] + f"/{F.PACKS_DIR}/p/{name}"
    good = s3_server.cat_file(key)
    s3_server.pipe_file(key, edit(good))
    return good


def test_rows_changed_in_the_bucket_are_refused_and_never_used(layout, cache, s3_server):  # noqa: F811
    out, url = layout
    c = np.cumsum([0] + out.manifest.raw["layout"]["member_packs"])
    k = 4
    row = int(out.doc_start[k]) + 1  # a segment of shard k: its end one token shorter, same size
    at = 24 * row + 16

    def edit(b: bytes) -> bytes:
        v = int.from_bytes(b[at:at + 8], "little")
        return b[:at] + (v - 1).to_bytes(8, "little") + b[at + 8:]

    good = _upload_changed(s3_server, url, F.SEGMENTS, edit)
    try:
        ds = PackedDataset(url, "p", stream=True, cache_limit=1 << 30)
        with pytest.raises(FormatError, match=rf"segments.bin: rows \[{int(out.doc_start[k])}:.*shard {k}.*xxh3_64"):
            ds.__getitems__([int(c[k])])
        assert not ds.index._ready[k]
        seg = np.fromfile(ds.index.path / F.SEGMENTS, dtype="<i8").reshape(-1, 3)
        assert not seg[int(out.doc_start[k]):int(out.doc_start[k + 1])].any()  # nothing of them reached the file
        _same(ds, PackedDataset(str(out.path), "p"), [int(c[k + 1])])  # another shard reads
    finally:
        s3_server.pipe_file(url.split("://", 1)[1] + f"/{F.PACKS_DIR}/p/{F.SEGMENTS}", good)
    assert int(ds.__getitems__([int(c[k])])[0]["pack_id"]) == int(c[k])  # the object restored: read


def test_rows_damaged_in_the_cache_are_fetched_again(layout, cache):  # noqa: F811
    out, url = layout
    local = PackedDataset(str(out.path), "p")
    ds = PackedDataset(url, "p", stream=True, cache_limit=1 << 30)
    _same(ds, local, np.arange(len(ds)))
    path = ds.index.path / F.SEGMENTS
    k, row = 2, int(out.doc_start[2])
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, (7).to_bytes(8, "little"), 24 * row + 16)  # the cached copy, changed after it was checked
    finally:
        os.close(fd)
    again = PackedDataset(url, "p", stream=True, cache_limit=1 << 30)
    c = np.cumsum([0] + out.manifest.raw["layout"]["member_packs"])
    _same(again, local, np.arange(int(c[k]), int(c[k + 1])))
    assert again.index.fetched_rows > 0 and again.index._ready.sum() == 1  # shard 2's rows only, fetched again
    assert path.read_bytes() == (out.path / F.PACKS_DIR / "p" / F.SEGMENTS).read_bytes()


def test_a_pack_length_that_disagrees_with_its_rows_is_refused(layout, cache, s3_server):  # noqa: F811
    """pack_tokens.bin verified whole (its checksum in index.json), and each shard's packs against it."""
    out, url = layout
    d = url.split("://", 1)[1] + f"/{F.PACKS_DIR}/p"
    good_json, good_pt = s3_server.cat_file(f"{d}/{F.PACK_INDEX_JSON}"), s3_server.cat_file(f"{d}/pack_tokens.bin")
    pt = np.frombuffer(good_pt, dtype="<u4").copy()
    pt[3] += 1
    obj = json.loads(good_json)
    tmp = cache.parent / "pt.bin"
    tmp.write_bytes(pt.tobytes())
    obj["files"]["pack_tokens.bin"]["checksum"] = checksum_file(tmp)
    s3_server.pipe_file(f"{d}/pack_tokens.bin", pt.tobytes())
    s3_server.pipe_file(f"{d}/{F.PACK_INDEX_JSON}", F.canonical_json(obj))
    try:
        ds = PackedDataset(url, "p", stream=True, cache_limit=1 << 30)
        ds.pack_num_tokens()
        with pytest.raises(FormatError, match=r"pack_tokens.bin: \[3\]: expected"):
            ds.__getitems__([3])
    finally:
        s3_server.pipe_file(f"{d}/pack_tokens.bin", good_pt)
        s3_server.pipe_file(f"{d}/{F.PACK_INDEX_JSON}", good_json)


def test_a_layout_index_without_the_digests_is_fetched_whole(layout, cache, s3_server, tmp_path):  # noqa: F811
    """A 1.1 layout (written before §9.4): the whole index before the first batch, as before."""
    import shutil

    from old_collections import without_shard_rows

    out, _ = layout
    old = tmp_path / "old" / "layout"
    shutil.copytree(out.path, old)
    without_shard_rows(old / F.PACKS_DIR / "p")
    url = f"s3://{BUCKET}/rows-old"
    upload_tree(tmp_path / "old", url)
    ds = PackedDataset(f"{url}/layout", "p", stream=True, cache_limit=1 << 30)
    assert type(ds.index) is PackIndex
    assert {e["url"].rsplit("/", 1)[-1] for e in _log(cache)} >= {F.SEGMENTS, F.PACK_OFFSETS}
    _same(ds, PackedDataset(str(out.path), "p"), [0, len(ds) - 1])


def test_the_prefetch_plan_from_the_record_is_the_plan_from_the_segments(layout, cache):  # noqa: F811
    """``remote.plan.Plan`` takes each pack's shard from ``layout.member_packs`` (no segment read); it is the plan the
    segments give (every pack of a layout inside one member)."""
    from packfmt.remote.plan import Plan

    out, url = layout
    ds = PackedDataset(url, "p", stream=True, cache_limit=1 << 30)
    whole = out.pack_index("p")
    order = np.random.default_rng(1).permutation(len(ds))[: len(ds) // 2]
    a = Plan(ds.store.resident_members(), order, None, None, ds.index.shard_of)
    b = Plan(ds.store.resident_members(), order, np.asarray(whole.pack_offsets), np.asarray(whole.segments))
    for key in ("member", "pos", "starts", "pos_sorted", "member_by_pos"):
        assert np.array_equal(getattr(a, key), getattr(b, key)), key
    assert not ds.index._ready.any()  # planned without a row
    with pytest.raises(IndexError, match="pack ids"):
        Plan(ds.store.resident_members(), np.array([len(ds)]), None, None, ds.index.shard_of)


@pytest.mark.parametrize("saved,resumed", [(4, 3), (2, 4)])
def test_an_elastic_resume_prefetches_exactly_what_it_reads(layout, cache, saved, resumed):  # noqa: F811
    """A state saved on ``saved`` ranks, loaded on ``resumed``: ``pending_indices()`` is what ``iter`` yields, the
    prefetch plan made from it is followed to the end (no warning that the reads left the plan), and every pack
    read equals the local read; over the ranks the rest of the epoch is read exactly once."""
    import warnings

    from packfmt.torch.prefetch import prefetch

    out, url = layout
    local = PackedDataset(str(out.path), "p")
    first = [DistributedPackSampler(local, num_replicas=saved, rank=r, window=3, seed=2, balance="none")
             for r in range(saved)]
    done = 5
    state = first[0].state_dict(num_consumed=done)
    consumed = {int(p) for s in first for p in s.epoch_indices()[:done]}
    rest = []
    for r in range(resumed):
        ds = PackedDataset(url, "p", stream=True, cache_limit=1 << 30)
        s = DistributedPackSampler(ds, num_replicas=resumed, rank=r, window=3, seed=2, balance="none")
        s.load_state_dict(state)
        pending = s.pending_indices()
        prefetch(ds, pending, batch_size=4)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a read outside the plan warns
            read = list(s)
            assert read == pending.tolist()
            for b in range(0, len(read), 4):
                _same(ds, local, read[b:b + 4])
        rest += read
    from collections import Counter

    left, counts = set(range(len(local))) - consumed, Counter(rest)
    assert len(consumed) == done * saved and all(counts[p] == 1 for p in left)  # the rest of the epoch, once each
    assert sum(n for p, n in counts.items() if p not in left) < resumed  # and the deal's padding: under one round


def test_a_layout_of_a_shard_per_pack_streams_from_its_member_table(layout, cache, tmp_path):  # noqa: F811
    """256 shards and more: the collection lists them in a member table (spec/COLLECTION.md §2.5), whose columns
    give the shards' documents and tokens; every pack still reads as the local layout's."""
    out, _ = layout
    src = out.path.parent.parent / "src"
    many = write_shards(str(src), "p", tmp_path / "up" / "many", shard_bytes=1)  # every pack its own shard
    assert len(many.members) >= 256 and (many.path / "members.bin").exists()
    url = f"s3://{BUCKET}/rows-many"
    upload_tree(tmp_path / "up", url)
    local = PackedDataset(str(many.path), "p")
    ds = PackedDataset(f"{url}/many", "p", stream=True, cache_limit=1 << 30)
    assert isinstance(ds.index, ShardedIndex) and ds.pack_groups().tolist() == list(range(len(ds)))
    order = np.random.default_rng(4).permutation(len(ds))
    for b in range(0, len(order), 16):
        _same(ds, local, order[b:b + 16])
    assert ds.index._ready.all()
