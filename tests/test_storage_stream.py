"""A remote collection read member by member (``stream=True``) through a real S3-protocol server (moto on
127.0.0.1): 200 small members, the cache bounded to its fixed files and 10% of the members (``cache_limit`` bounds
the whole cache folder as ``du`` counts it: ``stream_bounds``), members fetched ahead in the sampler's order
(``packfmt.torch.prefetch``); the values are those of the same collection read locally."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import packfmt
from packfmt.collection import write_collection
from packfmt.storage.upload import upload_tree
from packfmt.torch import DistributedPackSampler, PackedDataset
from packfmt.torch.prefetch import prefetch
from packfmt.torch.testing import next_fit_segments, write_pack_index

from s3_server import BUCKET, cache, s3_server, time_limit  # noqa: F401  (fixtures; time_limit: autouse)
from stream_bounds import disk_use, ledger, limit_in_members

MEMBERS, BATCH = 200, 8


@pytest.fixture(scope="module")
def remote(s3_server, tmp_path_factory):
    """(local collection, its URL, bytes of its member files): packs in document order, next fit, capacity 64."""
    root = tmp_path_factory.mktemp("stream")
    rng = np.random.default_rng(0)
    paths = []
    for m in range(MEMBERS):
        with packfmt.DatasetWriter(root / "coll" / "members" / f"m{m:03d}", vocab_size=1000, loss_mask=True,
                                   tokenizer={"name": "t", "hash": None}) as w:
            for n in rng.integers(1, 40, 8):
                w.add_document(rng.integers(0, 1000, int(n)), rng.integers(0, 2, int(n)))
        paths.append(root / "coll" / "members" / f"m{m:03d}")
    coll = write_collection(root / "coll" / "c", [(None, p) for p in paths])
    segs, po = next_fit_segments(coll.doc_lengths, 64)
    write_pack_index(coll, segs, po, capacity=64, name="p")
    url = f"s3://{BUCKET}/stream"
    upload_tree(root / "coll", url)
    probe = PackedDataset(f"{url}/c", "p", stream=True, cache_dir=root / "probe")  # to size limits in members
    probe.__getitems__([0])
    return root / "coll" / "c", f"{url}/c", _member_bytes(paths), limit_in_members(probe, MEMBERS // 10)


def _member_bytes(paths) -> int:
    return sum(f.stat().st_size for p in paths for f in p.iterdir() if f.is_file() and f.name != "manifest.json")


def _fetched(cache_root: Path) -> int:
    log = cache_root / "downloads.log"
    return sum(json.loads(line)["bytes"] for line in log.read_text().splitlines() if "/members/" in line)


def _epoch(ds, order, reference, cache_root, limit, whole=True):
    seen = []
    for j in range(0, len(order), BATCH):
        packs = order[j:j + BATCH]
        got, want = ds.__getitems__(packs), reference.__getitems__(packs)
        for a, b in zip(got, want):
            for key in ("input_ids", "labels", "position_ids", "doc_ids", "seq_lens", "document_ids"):
                assert torch.equal(a[key], b[key]), key
        seen += [int(x["pack_id"]) for x in got]
        assert disk_use(cache_root) <= limit  # the bound holds after every batch
    if whole:
        assert sorted(seen) == list(range(len(ds)))  # every pack exactly once


@pytest.mark.parametrize("shuffle", [False, True])
def test_streamed_epoch_bounded_and_exact(remote, cache, shuffle):
    local, url, total, limit = remote
    reference = PackedDataset(local, "p")
    ds = PackedDataset(url, "p", stream=True, cache_limit=limit)
    assert not list(cache.rglob("tokens.bin"))  # opening fetched no member
    sampler = DistributedPackSampler(ds, num_replicas=1, rank=0, shuffle=shuffle, seed=3)
    order = sampler.epoch_indices()
    if shuffle:  # every batch touches other members: refetches make a whole epoch slow on moto; its first batches
        order = order[:12 * BATCH]
    prefetch(ds, order)
    _epoch(ds, order, reference, cache, limit, whole=not shuffle)
    fetched = _fetched(cache)
    if not shuffle:  # packs in document order: each member fetched once
        assert fetched <= 1.2 * total, (fetched, total)
    else:  # a shuffled order revisits members: fetched again when evicted meanwhile (pack-ordered shards: later)
        assert fetched > 0


def test_stream_without_plan_and_limit_too_small(remote, cache, monkeypatch):
    local, url, total, limit = remote
    reference = PackedDataset(local, "p")
    ds = PackedDataset(url, "p", stream=True, cache_limit=limit)
    order = np.arange(len(ds))[::-1].copy()  # no plan: least recently used
    _epoch(ds, order, reference, cache, limit)
    del ds
    with pytest.raises(packfmt.PackfmtError, match="cache_limit=100 bytes cannot hold the collection's own files"):
        PackedDataset(url, "p", stream=True, cache_limit=100)
    monkeypatch.setenv("PACKFMT_CACHE_WAIT", "0.5")  # a limit that holds the fixed files, not one member
    with ledger(PackedDataset(url, "p", stream=True, cache_dir=cache.parent / "a")).transaction() as tx:
        fixed = tx.fixed  # (what the same collection's own files take in a cache folder of its own)
    tiny = PackedDataset(url, "p", stream=True, cache_dir=cache.parent / "b", cache_limit=fixed + 4096)
    with pytest.raises(packfmt.PackfmtError, match=f"cache_limit={fixed + 4096:,} bytes could not hold member"):
        tiny.__getitems__([0])


def test_stream_maps_at_most_max_mapped_members(remote, cache, monkeypatch):
    """Without cache_limit every member fetched could stay: each is 3 kernel mappings (vm.max_map_count), so at
    most lazy_members.MAX_MAPPED stay mapped, the least recently used evicted past it; items exactly the same."""
    from packfmt.collection import lazy_members

    local, url, total, _ = remote
    monkeypatch.setattr(lazy_members, "MAX_MAPPED", 6)
    reference = PackedDataset(local, "p")
    ds = PackedDataset(url, "p", stream=True, cache_dir=cache)
    members = ds._views()["members"]
    _epoch(ds, np.arange(len(ds)), reference, cache, 1 << 40)
    assert 0 < len(members.resident) <= 6


def test_stream_dataloader_workers(remote, cache):
    """Two DataLoader workers re-open the stream (the node's one budget shared by them and the main process) and plan
    their own batches."""
    from torch.utils.data import DataLoader

    from packfmt.torch import collate_varlen

    local, url, total, limit = remote
    reference = PackedDataset(local, "p")
    ds = PackedDataset(url, "p", stream=True, cache_limit=limit)
    order = np.arange(len(ds))
    prefetch(ds, order, batch_size=BATCH)
    got = DataLoader(ds, batch_size=BATCH, sampler=order.tolist(), num_workers=2, collate_fn=collate_varlen)
    want = DataLoader(reference, batch_size=BATCH, sampler=order.tolist(), collate_fn=collate_varlen)
    n = 0
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["labels"], b["labels"])
        assert disk_use(cache) <= limit
        n += 1
    assert n == -(-len(ds) // BATCH)
    assert _fetched(cache) <= 1.2 * total  # each worker's share fetched about once


def test_streamed_member_is_verified(remote, cache, s3_server):
    """A member object changed in the bucket after the collection was written is refused when a batch first needs
    it (hashed while it streams, as every cached file is), and nothing of it is left in the cache; the members
    before it were read."""
    from packfmt.errors import ChecksumError

    local, url, total, limit = remote
    ds = PackedDataset(url, "p", stream=True, cache_limit=limit)
    assert packfmt.open(url, stream=True).num_documents == ds.store.num_documents  # packfmt.open takes stream too
    last = len(ds) - 1
    m = int(ds.store.member_of(int(np.asarray(ds.index.segments)[-1, 0])))
    key = f"{BUCKET}/stream/members/m{m:03d}/tokens.bin"
    good = s3_server.cat_file(key)
    s3_server.pipe_file(key, bytes([good[0] ^ 1]) + good[1:])  # same size, one bit flipped
    try:
        ds.__getitems__([0])
        with pytest.raises(ChecksumError, match=f"m{m:03d}/tokens.bin: checksum"):
            ds.__getitems__([last])
        assert not list(cache.rglob(f"m{m:03d}/*.bin"))  # nothing of the refused member stays
    finally:
        s3_server.pipe_file(key, good)
    assert int(ds.__getitems__([last])[0]["pack_id"]) == last  # the object restored: read


def test_streamed_open_bounds_segments_by_member_then_by_document(s3_server, cache, tmp_path):
    """V27 of a streamed index: at open each segment is bounded by its member's tokens (one bound per member, no
    array of 8 bytes a document), and a segment past that is refused naming the member; one within its member but
    past its document opens, and is refused when a batch fetches the member, before any token of it is read."""
    import shutil

    from packfmt.errors import FormatError

    paths = []
    for m, lengths in enumerate([[3, 4], [5], [2, 2]]):
        with packfmt.DatasetWriter(tmp_path / "s" / f"m{m}", vocab_size=50, tokenizer={"name": "t", "hash": None}) as w:
            for n in lengths:
                w.add_document(np.arange(n) + 1)
        paths.append(tmp_path / "s" / f"m{m}")
    urls = {}
    for lie, end in (("document", 6), ("member", 8)):  # member 0: documents of 3 and 4 tokens, 7 in all
        shutil.rmtree(tmp_path / lie, ignore_errors=True)
        shutil.copytree(tmp_path / "s", tmp_path / lie / "s")
        coll = write_collection(tmp_path / lie / "c", [(None, tmp_path / lie / "s" / p.name) for p in paths])
        segs = np.array([[0, 0, end], [1, 0, 4], [2, 0, 5], [3, 0, 2], [4, 0, 2]])
        with pytest.raises(FormatError, match="V27"):  # written, then refused by the local open's real lengths
            write_pack_index(coll, segs, np.array([0, 1, 2, 3, 5]), capacity=16, name="p")
        urls[lie] = f"s3://{BUCKET}/bounds-{lie}/c"
        upload_tree(tmp_path / lie, f"s3://{BUCKET}/bounds-{lie}")
    with pytest.raises(FormatError, match=r"length of document 0 \(at most the 7 tokens of its member 0\)"):
        PackedDataset(urls["member"], "p", stream=True)
    ds = PackedDataset(urls["document"], "p", stream=True)
    assert [int(x["pack_id"]) for x in ds.__getitems__([1, 2, 3])] == [1, 2, 3]  # members 1 and 2 read
    with pytest.raises(FormatError, match=r"\[0\]: expected 0 <= begin < end <= length of document 0 \(3\)"):
        ds.__getitems__([0])


def test_streamed_open_fetches_only_the_index_it_opens(s3_server, cache, tmp_path):
    """A streamed collection lists its pack indexes at open and fetches (and verifies) one only when it is opened:
    training from one of several indexes downloads no byte of the others before its first batch; a materialized
    index (its packs' tokens, a second copy of the data) is refused before any of it is fetched; the collection's
    doc_lengths.bin only when its lengths are asked for."""
    paths = []
    for m in range(3):
        with packfmt.DatasetWriter(tmp_path / "t" / "s" / f"m{m}", vocab_size=50,
                                   tokenizer={"name": "t", "hash": None}) as w:
            for n in (3, 5, 2):
                w.add_document(np.arange(n) + 1)
        paths.append(tmp_path / "t" / "s" / f"m{m}")
    coll = write_collection(tmp_path / "t" / "c", [(None, p) for p in paths])
    for name, capacity in (("a", 8), ("b", 16), ("m", 8)):
        segs, po = next_fit_segments(coll.doc_lengths, capacity)
        write_pack_index(coll, segs, po, capacity=capacity, name=name, materialize=name == "m")
    upload_tree(tmp_path / "t", f"s3://{BUCKET}/lazy-index")
    url = f"s3://{BUCKET}/lazy-index/c"

    def fetched(name):
        log = cache / "downloads.log"
        lines = log.read_text().splitlines() if log.exists() else []
        return [line for line in lines if f"/packs/{name}/" in line]

    opened = packfmt.open(url, stream=True, cache_dir=cache)
    assert opened.pack_index_names() == ["a", "b", "m"] and not fetched("a") and not fetched("b")
    with pytest.raises(packfmt.PackfmtError, match=r"3 pack indexes \['a', 'b', 'm'\]"):
        opened.pack_index()
    with pytest.raises(packfmt.PackfmtError, match=r"packs/m/index.json: materialized: expected false for a streamed "
                                                   r"read, found true.*open it without stream=True"):
        PackedDataset(url, "m", stream=True, cache_dir=cache)  # its packs' tokens: a second copy, fetched whole
    assert not fetched("m")
    ds = PackedDataset(url, "a", stream=True, cache_dir=cache)
    assert int(ds.__getitems__([0])[0]["pack_id"]) == 0
    assert fetched("a") and not fetched("b")
    assert len(PackedDataset(url, "b", stream=True, cache_dir=cache)) == len(opened.pack_index("b"))
    assert fetched("b")
    # doc_lengths.bin (8 bytes a document) is not read by a streamed read: left in the bucket until asked for, then
    # fetched and verified (a stale copy in the mirror is not this manifest's: fetched again, never read)
    log = (cache / "downloads.log").read_text()
    assert "doc_lengths.bin" not in log
    (opened.path / "doc_lengths.bin").write_bytes(b"\0" * 8 * opened.num_documents)
    np.testing.assert_array_equal(opened.doc_lengths, coll.doc_lengths)
    assert "doc_lengths.bin" in (cache / "downloads.log").read_text()
