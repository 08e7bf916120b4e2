"""The readers of one node never wait for cache room in a circle (``remote.members.StreamedMembers.ensure_all``).

A batch takes its members one by one; while it waits for room for the next it used to keep those it had taken.
With a tight ``cache_limit`` the readers of a node (ranks, DataLoader workers) could then each hold part of their
batch and wait for room the others held: none went on until ``$PACKFMT_CACHE_WAIT`` ran out (600 s) and the read
failed "could not hold member ...", though each batch alone fit (test_storage_nodes_proof.py: 4 workers of a node,
room for 8 shards, 7 held in three half-taken batches of 4). Here three readers of one node share its cache folder
(three datasets over it: three ledger slots and three sets of pins, as three processes have); the third stands for a
rank's own process, which opens the dataset and leaves the reading to its DataLoader workers. The other two each
take the first of their batch's two shards, and the room holds two: both batches must still be read, equal to the
local layout. (Each reader keeps idle at most its share of the room, a third here, so the batch read first leaves
the room to the other: ``remote.eviction``.)

The collection is a pack-ordered layout in fsspec's ``memory://`` file system (only the cache's rules matter).
"""

from __future__ import annotations

import threading

import fsspec
import numpy as np
import pytest
import torch

import packfmt
from packfmt.collection.shards import write_shards
from packfmt.packindex import build_pack_index
from packfmt.remote import members as M
from packfmt.torch import PackedDataset, collate_varlen

from stream_bounds import ledger, limit_for


@pytest.fixture
def layout(tmp_path):
    """(the layout on disk, its ``memory://`` URL): 4+ shards of equal size (documents of one length)."""
    with packfmt.DatasetWriter(tmp_path / "src", vocab_size=1000, tokenizer={"name": "t", "hash": None}) as w:
        w.add_documents(np.arange(64 * 48) % 1000, np.full(48, 64))
    build_pack_index(tmp_path / "src", capacity=64, algorithm="ffd", name="p")
    out = write_shards(tmp_path / "src", "p", tmp_path / "up" / "layout", shard_bytes=12 * 128)
    fs = fsspec.filesystem("memory")
    for p in sorted((tmp_path / "up").rglob("*")):
        if p.is_file():
            fs.pipe_file(f"memory://room/{p.relative_to(tmp_path / 'up')}", p.read_bytes())
    return out, "memory://room/layout"


def test_two_readers_each_holding_half_their_batch_both_go_on(layout, tmp_path, monkeypatch):
    out, url = layout
    assert len(out.members) >= 4
    monkeypatch.setenv(M.WAIT_ENV, "15")  # without the fix: both wait this long, then fail
    limit = limit_for(url, "p", 2, tmp_path / "probe")  # room for two shards
    readers = [PackedDataset(url, "p", stream=True, cache_limit=limit, cache_dir=tmp_path / "node") for _ in range(3)]
    assert len({ledger(ds).slot for ds in readers}) == 3  # three processes of the node, as the ledger counts them
    shard = readers[0].pack_groups()
    batches = [[int(np.flatnonzero(shard == k)[0]) for k in pair] for pair in ((0, 1), (2, 3))]
    first = threading.Barrier(2, timeout=10)  # each reader has reserved its first shard before either asks for more
    real = M.fetch_member

    waited = set()

    def fetch_member(stream, m, *args):
        if m in (0, 2) and m not in waited:  # (the first time: a batch that begins again fetches it again)
            waited.add(m)
            first.wait()
        return real(stream, m, *args)

    monkeypatch.setattr(M, "fetch_member", fetch_member)
    got, errors = [None, None], []

    def read(r: int) -> None:
        try:
            got[r] = collate_varlen(readers[r].__getitems__(batches[r]))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=read, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    local = PackedDataset(str(out.path), "p")
    for r in range(2):
        want = collate_varlen(local.__getitems__(batches[r]))
        for key in ("input_ids", "labels", "position_ids", "cu_seqlens", "pack_ids"):
            assert torch.equal(got[r][key], want[key]), (r, key)
