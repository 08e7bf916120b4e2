"""A layout's index rows read shard by shard live inside ``cache_limit`` (``remote.shard_index``,
``remote.members``): shard k's rows count with member k, leave with it, and when no process holds member k
their whole pages are punched out of the sparse files; every pack still reads as the local layout, in one process
and in DataLoader workers that share the cache (a real S3-protocol server: moto on 127.0.0.1)."""

from __future__ import annotations

import numpy as np
import pytest
from torch.utils.data import DataLoader

import packfmt
from packfmt import format as F
from packfmt.collection import write_collection
from packfmt.remote.shard_index import ShardedIndex, punch_hole
from packfmt.collection.shards import write_shards
from packfmt.packindex import build_pack_index
from packfmt.storage.upload import upload_tree
from packfmt.torch import PackedDataset

from s3_server import BUCKET, cache, s3_server, time_limit  # noqa: F401  (fixtures; time_limit: autouse)
from stream_bounds import disk_use, ledger

KEYS = ("input_ids", "labels", "position_ids", "seq_lens")
PAGE = 4096


@pytest.fixture(scope="module")
def layout(s3_server, tmp_path_factory):  # noqa: F811
    """(the layout on disk, its URL): 20,000 documents of 1-4 tokens in shards of 16 KiB, so that each shard's
    rows of segments.bin (24 bytes a document) span many pages."""
    root = tmp_path_factory.mktemp("bound")
    rng = np.random.default_rng(5)
    paths = []
    for m in range(40):
        paths.append(root / "members" / f"m{m:02d}")
        lengths = rng.integers(1, 5, 500)
        with packfmt.DatasetWriter(paths[-1], vocab_size=1000, tokenizer={"name": "t", "hash": None}) as w:
            w.add_documents(rng.integers(0, 1000, int(lengths.sum())), lengths)
    src = write_collection(root / "src", [(None, p) for p in paths])
    build_pack_index(src, capacity=64, algorithm="ffd", name="p")
    out = write_shards(src, "p", root / "up" / "layout", shard_bytes=16 << 10)
    url = f"s3://{BUCKET}/bound"
    upload_tree(root / "up", url)
    probe = PackedDataset(f"{url}/layout", "p", stream=True, cache_dir=root / "probe")  # every shard, counted
    for b in range(0, len(probe), 50):
        probe.__getitems__(list(range(b, min(b + 50, len(probe)))))
    with ledger(probe).transaction() as tx:
        fixed = tx.fixed
    return out, f"{url}/layout", fixed, ledger(probe).nbytes.copy()


def _allocated(path) -> int:
    return path.stat().st_blocks * 512


def test_rows_leave_the_cache_with_their_member(layout, cache):  # noqa: F811
    out, url, fixed, each = layout
    local = PackedDataset(str(out.path), "p")
    probe = PackedDataset(url, "p", stream=True, cache_limit=1 << 30)
    idx = probe.index
    assert isinstance(idx, ShardedIndex)
    K = len(out.members)
    rows = [idx.rows_bytes(k) for k in range(K)]
    assert K >= 6 and min(rows) > 4 * PAGE  # every shard's rows span whole pages that can be punched
    del probe, idx
    limit = fixed + 2 * int(each.max()) + 1  # two shards with their rows, not three
    ds = PackedDataset(url, "p", stream=True, cache_limit=limit)
    stream, b = ds.store.resident_members(), ledger(ds)
    seg = ds.index.path / F.SEGMENTS
    full = seg.stat().st_size
    for epoch in range(2):  # in order: each shard fetched, read, evicted; the second epoch fetches its rows again
        for j in range(0, len(ds), 5):
            packs = list(range(j, min(j + 5, len(ds))))
            got, want = ds.__getitems__(packs), local.__getitems__(packs)
            for x, y in zip(got, want):
                for key in KEYS:
                    assert x[key].tolist() == y[key].tolist(), (int(y["pack_id"]), key)
            assert disk_use(cache) <= limit  # rows counted: with them, no more than two shards on the disk
            with b.transaction() as tx:
                assert tx.used() <= limit
                present = np.flatnonzero(b.state == 2).tolist()
            assert ds.index._ready.nonzero()[0].tolist() == sorted(stream.resident)  # rows ready while held here
            # what the rows hold on disk: the shards' rows on disk and the pages their neighbours share
            assert _allocated(seg) <= sum(rows[k] for k in present) + (K + 1) * PAGE
    assert _allocated(seg) < full  # without punching: every shard's rows, the whole file (the bound above fails)
    assert ds.index.fetched_rows > sum(rows)  # the second epoch fetched rows again (they had been punched out)


def test_rows_another_reader_holds_are_never_punched(layout, cache):  # noqa: F811
    """Two readers on one cache (two jobs on a node): one holds shard 0, the other reads every shard under a small
    limit, evicting each; the pages shard 0's rows share with shard 1 stay, and the first reader, which checked its
    rows once, still reads them right."""
    out, url, fixed, each = layout
    local = PackedDataset(str(out.path), "p")
    holder = PackedDataset(url, "p", stream=True, cache_limit=fixed + 3 * int(each.max()))
    first = list(range(int(out.manifest.raw["layout"]["member_packs"][0])))
    holder.__getitems__(first[:1])  # shard 0 resident there, its rows checked once
    seg = holder.index.path / F.SEGMENTS
    d1 = int(out.members[0].documents)
    want = (out.path / F.PACKS_DIR / "p" / F.SEGMENTS).read_bytes()[:24 * d1]
    rows = [holder.index.rows_bytes(k) for k in range(len(out.members))]
    reader = PackedDataset(url, "p", stream=True, cache_limit=fixed + 3 * int(each.max()))  # the holder's, the reader's
    for b in range(len(first), len(reader), 5):  # every other shard, each evicted in turn (and punched)
        reader.__getitems__(list(range(b, min(b + 5, len(reader)))))
    assert _allocated(seg) < seg.stat().st_size  # the reader punched the shards it let go of
    assert seg.read_bytes()[:24 * d1] == want  # not shard 0's: the holder holds it
    assert holder.index._ready[0]
    for x, y in zip(holder.__getitems__(first), local.__getitems__(first)):
        for key in KEYS:
            assert x[key].tolist() == y[key].tolist(), (int(y["pack_id"]), key)


def test_workers_sharing_the_cache_read_every_pack_while_rows_are_punched(layout, cache):  # noqa: F811
    """Two DataLoader workers sharing the node's small limit, reading the same shards: a worker never punches rows
    another holds (its pin), and never reads rows it has not checked since its member returned."""
    out, url, fixed, each = layout
    local = PackedDataset(str(out.path), "p")
    K = len(out.members)
    assert K >= 6
    ds = PackedDataset(url, "p", stream=True, cache_limit=fixed + 3 * int(each.max()))  # three shards of K
    order = np.arange(len(ds))
    seen = []
    for batch in DataLoader(ds, batch_size=3, sampler=order.tolist(), num_workers=2, collate_fn=lambda items: items):
        for x in batch:
            p = int(x["pack_id"])
            seen.append(p)
            y = local[p]
            for key in KEYS:
                assert x[key].tolist() == y[key].tolist(), (p, key)
    assert sorted(seen) == order.tolist()
    seg = ds.index.path / F.SEGMENTS  # the workers' cache: the shards both had let go of were punched out
    assert int((ledger(ds).state == 2).sum()) < K  # shards were deleted to make room ...
    assert _allocated(seg) < seg.stat().st_size  # ... and their rows punched out


def test_punch_hole_frees_whole_pages_only(tmp_path):
    import os

    path = tmp_path / "f"
    path.write_bytes(b"\x01" * (6 * PAGE))
    fd = os.open(path, os.O_RDWR)
    try:
        os.fsync(fd)
        done = punch_hole(fd, PAGE // 2, 4 * PAGE + 100)  # pages 1, 2, 3 lie wholly inside
    finally:
        os.close(fd)
    data = path.read_bytes()
    assert len(data) == 6 * PAGE  # the size is kept
    if done == 0:
        pytest.skip("this file system cannot punch holes (the rows then stay: the bound is not kept)")
    assert done == 3 * PAGE
    assert data[:PAGE] == b"\x01" * PAGE and data[4 * PAGE:] == b"\x01" * (2 * PAGE)  # partial pages kept
    assert data[PAGE:4 * PAGE] == bytes(3 * PAGE)
    assert punch_hole(-1, 10, 20) == 0  # no whole page: nothing asked of the system
