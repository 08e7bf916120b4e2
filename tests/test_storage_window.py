"""A shuffled epoch of a remote collection read member by member (``stream=True``) with the window shuffle
(``DistributedPackSampler(..., window=2)``, spec/READER.md §6): through a real S3-protocol server (moto on
127.0.0.1), 200 small members, the cache bounded to 10% of their bytes, members fetched ahead in the sampler's
order (``packfmt.torch.prefetch``), read by a DataLoader. Every pack is read once, equal to the local read, and
each member is fetched about once (a plain shuffle of the same index fetches members again and again)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import packfmt
from packfmt.collection import write_collection
from packfmt.storage.upload import upload_tree
from packfmt.torch import DistributedPackSampler, PackedDataset, collate_varlen
from packfmt.torch.prefetch import prefetch
from packfmt.torch.testing import next_fit_members, write_pack_index

from s3_server import BUCKET, cache, s3_server, time_limit  # noqa: F401  (fixtures)
from stream_bounds import disk_use, limit_for
from test_storage_stream import _fetched, _member_bytes

MEMBERS, BATCH = 200, 8


@pytest.fixture(scope="module")
def remote(s3_server, tmp_path_factory):
    """(local collection, its URL, bytes of its member files). Index "m": next fit of capacity 64 in document order
    within each member (a member's packs consecutive and its own, as pack-ordered shards lay them out)."""
    root = tmp_path_factory.mktemp("window")
    rng = np.random.default_rng(1)
    paths = []
    for m in range(MEMBERS):
        paths.append(root / "coll" / "members" / f"m{m:03d}")
        with packfmt.DatasetWriter(paths[-1], vocab_size=1000, loss_mask=True,
                                   tokenizer={"name": "t", "hash": None}) as w:
            for n in rng.integers(1, 40, 8):
                w.add_document(rng.integers(0, 1000, int(n)), rng.integers(0, 2, int(n)))
    coll = write_collection(root / "coll" / "c", [(None, p) for p in paths])
    write_pack_index(coll, *next_fit_members(coll.doc_lengths, coll.doc_start, 64), capacity=64, name="m")
    url = f"s3://{BUCKET}/window"
    upload_tree(root / "coll", url)
    return (root / "coll" / "c", f"{url}/c", _member_bytes(paths),
            limit_for(f"{url}/c", "m", MEMBERS // 10, root / "probe"))  # the fixed files and 10% of the members


def _loader_epoch(local, url, cache_root, index, limit, num_workers, **sampler_args):
    """One epoch through a DataLoader over the streamed dataset, checked batch by batch against the local read;
    returns (packs read, in order; member bytes fetched)."""
    reference = PackedDataset(local, index)
    ds = PackedDataset(url, index, stream=True, cache_limit=limit)
    sampler = DistributedPackSampler(ds, num_replicas=1, rank=0, seed=3, **sampler_args)
    sampler.set_epoch(1)
    prefetch(ds, sampler.epoch_indices(), batch_size=BATCH)
    got = DataLoader(ds, batch_size=BATCH, sampler=sampler, collate_fn=collate_varlen, num_workers=num_workers)
    want = DataLoader(reference, batch_size=BATCH, sampler=sampler.epoch_indices().tolist(), collate_fn=collate_varlen)
    seen = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # the reads follow the plan: a dropped plan would warn (0 workers)
        for a, b in zip(got, want, strict=True):
            for key in ("input_ids", "labels", "position_ids", "doc_ids", "cu_seqlens", "document_ids", "pack_ids"):
                assert torch.equal(a[key], b[key]), key
            seen += a["pack_ids"].tolist()
            assert disk_use(cache_root) <= limit  # the bound holds after every batch
    return seen, _fetched(cache_root)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_window_shuffle_fetches_each_member_about_once(remote, cache, num_workers):
    """With 2 workers each plans and streams its own batches, the node's one limit shared (prefetch's module doc)."""
    local, url, total, limit = remote
    seen, fetched = _loader_epoch(local, url, cache, "m", limit, num_workers, window=2)
    n = len(PackedDataset(local, "m"))
    assert sorted(seen) == list(range(n))  # every pack exactly once (1 rank: no padding)
    assert seen != list(range(n))  # shuffled
    assert fetched <= 1.2 * total, (fetched, total)  # measured 1.0x (both); a plain shuffle of "m": 2.3x



@pytest.mark.parametrize("threads", [None, 2])
def test_prefetch_threads_grow_while_batches_wait(remote, cache, threads):  # noqa: F811
    """By default the members in flight adapt: 2 prefetch threads at first, one more each time a batch has to wait
    for a member, at most ``MOST_THREADS``; ``threads=N`` fixes the count. Items equal the local read either way."""
    from packfmt.remote.plan import FIRST_THREADS, MOST_THREADS

    local, url, _, limit = remote
    reference = PackedDataset(local, "m")
    ds = PackedDataset(url, "m", stream=True, cache_limit=limit)
    sampler = DistributedPackSampler(ds, num_replicas=1, rank=0, seed=3, window=2)
    prefetch(ds, sampler, batch_size=BATCH, threads=threads)
    for a in DataLoader(ds, batch_size=BATCH, sampler=sampler, collate_fn=collate_varlen):
        b = collate_varlen(reference.__getitems__(a["pack_ids"].tolist()))
        assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["labels"], b["labels"])
    members = ds._views()["members"]
    assert members.waits > 0  # the first batch waits at least
    if threads is None:
        assert FIRST_THREADS < len(members.prefetchers) <= MOST_THREADS
    else:
        assert len(members.prefetchers) == threads
