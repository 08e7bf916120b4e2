"""PackedDataset over a collection reads what the same packs over one store holding every document give.

The single store is written from the members' documents concatenated in order: what a physical
merge holds (collection document g == its document g), so the same segments must give the same
rows, batch for batch, with loss masks, with uint32 tokens, through DataLoader workers and the
distributed sampler; and a collection of many members holds no file descriptor per member.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import packfmt
from packfmt.collection import write_collection
from packfmt.torch import DistributedPackSampler, PackedDataset, collate_varlen
from packfmt.torch.testing import next_fit_segments, write_pack_index


def _write(root: Path, docs, masks, vocab: int) -> Path:
    with packfmt.DatasetWriter(root, vocab_size=vocab, loss_mask=masks is not None,
                               tokenizer={"name": "t", "hash": None}) as w:
        for i, doc in enumerate(docs):
            w.add_document(doc, None if masks is None else masks[i])
    return root


def make_pair(root: Path, sizes, *, vocab=1000, mask=False, seed=0, capacity=16):
    """A collection of len(sizes) members and the one store of all their documents, same pack index "p"."""
    rng = np.random.default_rng(seed)
    members, all_docs, all_masks = [], [], []
    for m, n_docs in enumerate(sizes):
        docs = [rng.integers(0, vocab, int(n)) for n in rng.integers(1, 30, n_docs)]
        masks = [rng.integers(0, 2, len(d)) for d in docs] if mask else None
        members.append(_write(root / f"m{m:04d}", docs, masks, vocab))
        all_docs += docs
        all_masks += masks or []
    coll = write_collection(root / "coll", [(None, p) for p in members])
    single = packfmt.open(_write(root / "single", all_docs, all_masks if mask else None, vocab))
    segs, po = next_fit_segments(single.doc_lengths, capacity, order=rng.permutation(len(all_docs)))
    write_pack_index(coll, segs, po, capacity=capacity, name="p")
    write_pack_index(single, segs, po, capacity=capacity, name="p")
    return coll, single


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        va, vb = a[key], b[key]
        if isinstance(va, torch.Tensor):
            assert torch.equal(va, vb), key
        else:
            assert va == vb, key


@pytest.mark.parametrize("vocab,mask", [(1000, False), (70000, True)])
def test_collection_rows_equal_one_store_of_the_same_documents(tmp_path, vocab, mask):
    coll, single = make_pair(tmp_path, [3, 0, 5, 1, 4], vocab=vocab, mask=mask)
    a, b = PackedDataset(coll.path, "p"), PackedDataset(single.path, "p")
    assert len(a) == len(b) > 3
    for p in range(len(a)):
        _same(a[p], b[p])
    _same(collate_varlen(a.__getitems__(list(range(len(a))))), collate_varlen(b.__getitems__(list(range(len(b))))))
    padded = PackedDataset(coll.path, "p", pad_to_capacity=True)
    _same(padded[1], PackedDataset(single.path, "p", pad_to_capacity=True)[1])
    assert a.pack_num_tokens().tolist() == b.pack_num_tokens().tolist()


def test_collection_through_dataloader_workers_and_distributed_sampler(tmp_path):
    coll, single = make_pair(tmp_path, [6, 2, 7], mask=True, seed=1)
    ds, ref = PackedDataset(coll.path, "p"), PackedDataset(single.path, "p")
    assert len(pickle.dumps(ds)) < 2000  # the path, the index name, the options
    seen = []
    for rank in range(2):
        sampler = DistributedPackSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=3, balance="tokens")
        ref_sampler = DistributedPackSampler(ref, num_replicas=2, rank=rank, shuffle=True, seed=3, balance="tokens")
        assert list(sampler) == list(ref_sampler)
        loader = DataLoader(ds, batch_size=2, sampler=sampler, collate_fn=collate_varlen, num_workers=2)
        for batch in loader:
            packs = batch["pack_ids"].tolist()
            _same(batch, collate_varlen(ref.__getitems__(packs)))
            seen += packs
    assert sorted(set(seen)) == list(range(len(ds)))  # (a rank may repeat a pack to even out the ranks)


def test_many_members_hold_no_descriptor_each(tmp_path):
    coll, single = make_pair(tmp_path, [1] * 300, seed=2, capacity=64)
    before = len(os.listdir("/proc/self/fd"))
    ds = PackedDataset(coll.path, "p")
    rows = [ds[p]["input_ids"].tolist() for p in range(len(ds))]
    after = len(os.listdir("/proc/self/fd"))
    from packfmt.collection.reader import DEFAULT_OPEN_MEMBERS

    # at most the member LRU's stores (two maps each here) and the index: not two per member (600)
    assert after - before <= 2 * DEFAULT_OPEN_MEMBERS + 10
    ref = PackedDataset(single.path, "p")
    assert rows == [ref[p]["input_ids"].tolist() for p in range(len(ref))]


def test_index_of_another_member_list_is_refused(tmp_path):
    coll, single = make_pair(tmp_path, [2, 3])
    other = write_collection(tmp_path / "other", [(None, tmp_path / "m0001"), (None, tmp_path / "m0000")])
    import shutil

    shutil.copytree(coll.path / "packs", other.path / "packs")
    with pytest.raises(packfmt.FormatError, match=r"collection: this index was built for another member list"):
        PackedDataset(other.path, "p")
    shutil.rmtree(other.path / "packs")
    shutil.copytree(single.path / "packs", other.path / "packs")
    with pytest.raises(packfmt.FormatError, match=r"built for a single store"):
        PackedDataset(other.path, "p")


def test_collection_and_its_physical_merge_give_identical_batches(tmp_path):
    """The issue's proof: reading a collection and reading its physical merge (index carried) agree."""
    from packfmt.collection import merge_physical

    coll, _ = make_pair(tmp_path, [4, 0, 6, 3], vocab=70000, mask=True, seed=5)
    merged = merge_physical([(None, coll.path)], tmp_path / "merged")
    assert merged.pack_index_names() == ["p"]  # the collection's index, rebound to the merged store
    a, b = PackedDataset(coll.path, "p"), PackedDataset(merged.path, "p")
    everything = list(range(len(a)))
    _same(collate_varlen(a.__getitems__(everything)), collate_varlen(b.__getitems__(everything)))
    for p in everything:
        _same(a[p], b[p])
