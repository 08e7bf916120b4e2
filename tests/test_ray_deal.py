"""packfmt.ray.datasource.deal_packs: the rows of read_packs are one epoch's deal (spec/READER.md §6), no Ray needed.

Over ``num_replicas=R`` the rows are a multiple of ``R`` (so Ray Train's ``streaming_split(R, equal=True)``
truncates none): every pack once in the epoch's global order, then the padding (the epoch's first
packs, cyclically), or the last ``N mod R`` dropped with ``drop_last``; ``rank=r`` is exactly what
``DistributedPackSampler(rank=r)`` yields.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

pytest.importorskip("torch")

from packfmt.ray.datasource import deal_packs  # noqa: E402
from packfmt.torch import DistributedPackSampler, PackedDataset  # noqa: E402
from packfmt.torch.testing import write_flat_dataset, write_pack_index  # noqa: E402

SIZES = (1, 2, 7, 13)


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """Pack indexes of 1, 2, 7 and 13 packs (one document each, lengths 1..13) over one real store."""
    lengths = np.arange(1, 14)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    store = write_flat_dataset(tmp_path_factory.mktemp("deal") / "s", np.arange(offsets[-1]) % 50, offsets,
                               vocab_size=50)
    out = {}
    for n in SIZES:
        segments = np.stack([np.arange(n), np.zeros(n, dtype=np.int64), lengths[:n]], axis=1)
        write_pack_index(store, segments, np.arange(n + 1), capacity=16, name=f"n{n}")
        out[n] = PackedDataset(store.path, f"n{n}")
    return out


@settings(max_examples=60, deadline=None)
@given(n=st.sampled_from(SIZES), replicas=st.integers(1, 5), drop_last=st.booleans(), shuffle=st.booleans(),
       seed=st.integers(0, 3), epoch=st.integers(0, 3))
def test_rows_are_every_pack_once_then_padding_a_multiple_of_the_replicas(datasets, n, replicas, drop_last, shuffle,
                                                                          seed, epoch):
    ds = datasets[n]
    kw = dict(num_replicas=replicas, seed=seed, epoch=epoch, shuffle=shuffle, drop_last=drop_last)
    rows = deal_packs(ds, **kw)
    assert rows.shape[0] % replicas == 0
    assert np.array_equal(rows, deal_packs(ds, **kw))  # a function of (seed, epoch)
    if drop_last:
        assert rows.shape[0] == n - n % replicas
        assert len(set(rows.tolist())) == rows.shape[0]
    else:
        pad = rows.shape[0] - n
        assert 0 <= pad < replicas
        assert sorted(rows[:n].tolist()) == list(range(n))              # every pack once
        assert np.array_equal(rows[n:], np.resize(rows[:n], pad))      # then the epoch's first packs, cyclically
    ranks = [deal_packs(ds, rank=r, **kw) for r in range(replicas)]
    assert np.array_equal(np.stack(ranks, axis=1).reshape(-1), rows)  # rank r: every R-th row, from row r
    for r in range(replicas):
        sampler = DistributedPackSampler(ds, replicas, r, shuffle=shuffle, seed=seed, drop_last=drop_last,
                                         balance="none")
        sampler.set_epoch(epoch)
        assert list(sampler) == ranks[r].tolist()


def test_balanced_rank_shares_are_the_samplers(datasets):
    ds = datasets[13]
    for r in range(3):
        sampler = DistributedPackSampler(ds, 3, r, seed=5, balance="tokens")
        sampler.set_epoch(2)
        assert deal_packs(ds, num_replicas=3, rank=r, seed=5, epoch=2, balance="tokens").tolist() == list(sampler)


def test_balance_without_rank_is_refused(datasets):
    with pytest.raises(ValueError, match="rank="):
        deal_packs(datasets[7], num_replicas=2, balance="tokens")
