"""Collections of many tiny members (10^3 in the fast suite, 10^5 marked slow) read, pack and validate
exactly like one store of the same documents (issue "Internet scale": per-member cost; timings are in
benchmarks/bench_members.py, not here)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import packfmt
from packfmt.collection import Collection, write_collection
from packfmt.packindex import build_pack_index
from packfmt.torch import PackedDataset
from packfmt.torch.testing import write_flat_dataset, write_split_stores
from packfmt.validate import validate

from limits import time_limit


def _same_as_one_store(tmp_path, members: int, seconds: int) -> None:
    rng = np.random.default_rng(members)
    cuts = np.concatenate([[0], np.cumsum(rng.integers(1, 4, members))])  # 1-3 documents per member
    n_docs = int(cuts[-1])
    lengths = rng.integers(1, 50, n_docs).astype(np.int64)
    offsets = np.zeros(n_docs + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tokens = rng.integers(0, 50_000, int(offsets[-1]), dtype=np.uint16)
    single = write_flat_dataset(tmp_path / "single", tokens, offsets, vocab_size=50_000).path
    paths = write_split_stores(tmp_path / "stores", tokens, offsets, cuts, vocab_size=50_000)
    coll = write_collection(tmp_path / "coll", [(None, p) for p in paths]).path
    with time_limit(seconds, f"open, pack and validate of {members:,} members"):
        one, many = packfmt.open(single), Collection(coll, max_open_members=16)
        assert len(many.members) == members
        np.testing.assert_array_equal(many.doc_offsets, one.doc_offsets)
        for g in rng.integers(0, n_docs, 50):
            np.testing.assert_array_equal(many.document(int(g)), one.document(int(g)))
        a = build_pack_index(single, capacity=256, algorithm="ffd", name="p")
        b = build_pack_index(coll, capacity=256, algorithm="ffd", name="p")
        np.testing.assert_array_equal(b.segments, a.segments)
        np.testing.assert_array_equal(b.pack_offsets, a.pack_offsets)
        # read through PackedDataset as the one store reads: past MAP_BUDGET mappings (10^5 members: 3 x 10^5, past
        # vm.max_map_count) the members are mapped as batches need them (collection/lazy_members.py)
        ds_one, ds_many = PackedDataset(single, "p"), PackedDataset(coll, "p")
        for packs in np.array_split(rng.permutation(len(ds_one))[:400], 40):
            for x, y in zip(ds_one.__getitems__(packs), ds_many.__getitems__(packs)):
                for key in ("input_ids", "labels", "position_ids", "document_ids"):
                    assert torch.equal(x[key], y[key]), key
        del ds_one, ds_many
        report = validate(coll)
        assert report.ok and not report.problems, report.problems[:3]
        assert report.checked["members"] == members and report.checked["documents"] == n_docs
        assert report.checked["pack_indexes"] == 1


def test_thousands_of_members_read_pack_and_validate_like_one_store(tmp_path):
    _same_as_one_store(tmp_path, 2_000, 300)


def test_a_hundred_thousand_members_read_pack_and_validate_like_one_store(tmp_path):
    _same_as_one_store(tmp_path, 100_000, 3_000)
