"""Samplers and DataLoader workers: coverage, equal batch counts, determinism, exact resume."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, DistributedSampler

import packfmt
from packfmt.torch import (
    DistributedPackSampler,
    PackedDataset,
    PackSampler,
    SamplerStateError,
    collate_varlen,
)
from packfmt.torch.testing import next_fit_segments, write_pack_index

RANKS, WORKERS, BATCH = 4, 2, 3


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    root = tmp_path_factory.mktemp("smp")
    rng = np.random.default_rng(7)
    lengths = rng.integers(1, 60, 300)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    store = packfmt.torch.testing.write_flat_dataset(root / "ds", rng.integers(0, 1000, offsets[-1]), offsets, vocab_size=1000)
    # one document per pack: pack sizes 1..59 tokens, uneven enough to make balancing matter
    segs = np.stack([np.arange(len(lengths)), np.zeros(len(lengths), dtype=np.int64), lengths], axis=1)
    write_pack_index(store, segs, np.arange(len(lengths) + 1), capacity=64, name="one")
    return PackedDataset(store, "one")


def loader_packs(ds, sampler, **kw):
    """Pack ids in the order a DataLoader with workers delivers them, as a list of batches."""
    dl = DataLoader(ds, batch_size=BATCH, sampler=sampler, collate_fn=collate_varlen, num_workers=WORKERS, **kw)
    return [b["pack_ids"].tolist() for b in dl]


@pytest.mark.parametrize("balance", ["tokens", "none"])
@pytest.mark.parametrize("drop_last", [False, True])
def test_four_ranks_two_workers_cover_every_pack(ds, balance, drop_last):
    n = len(ds)
    samplers = [DistributedPackSampler(ds, RANKS, r, seed=3, drop_last=drop_last, balance=balance) for r in range(RANKS)]
    per_rank = [loader_packs(ds, s, persistent_workers=True, pin_memory=False) for s in samplers]
    assert len({len(b) for b in per_rank}) == 1  # every rank the same number of batches
    flat = [p for batches in per_rank for b in batches for p in b]
    counts = np.bincount(flat, minlength=n)
    if drop_last:
        assert len(flat) == (n // RANKS) * RANKS and counts.max() == 1
    else:
        assert counts.min() == 1 and len(flat) == -(-n // RANKS) * RANKS
        assert counts.sum() - n < RANKS  # the wrap-around padding repeats fewer than RANKS packs
    # deterministic for a seed, different for another epoch
    again = loader_packs(ds, DistributedPackSampler(ds, RANKS, 0, seed=3, drop_last=drop_last, balance=balance))
    assert again == per_rank[0]
    s = DistributedPackSampler(ds, RANKS, 0, seed=3, drop_last=drop_last, balance=balance)
    s.set_epoch(1)
    assert list(s) != [p for b in per_rank[0] for p in b]


def test_token_balance_beats_strided_split(ds):
    tokens = ds.pack_num_tokens()
    spread = {}
    for balance in ("tokens", "none"):
        sums = [tokens[DistributedPackSampler(ds, RANKS, r, seed=3, balance=balance).epoch_indices()].sum() for r in range(RANKS)]
        spread[balance] = max(sums) - min(sums)
    assert spread["tokens"] <= spread["none"]
    assert spread["tokens"] <= tokens.max()  # greedy dealing: within one pack of each other


def test_plain_distributed_sampler_with_workers(ds):
    seen = []
    for r in range(RANKS):
        s = DistributedSampler(ds, num_replicas=RANKS, rank=r, shuffle=True, seed=1)
        seen += [p for b in loader_packs(ds, s, pin_memory=True) for p in b]
    assert set(seen) == set(range(len(ds)))


def remaining_after_resume(ds, make_sampler, stops):
    """Consume ``stops[0]`` packs, save, restore into a fresh sampler, consume ``stops[1]``... finish."""
    sampler = make_sampler()
    consumed = []
    state = None
    for stop in stops:
        sampler = make_sampler()
        if state is not None:
            sampler.load_state_dict(state)
        it = iter(sampler)
        consumed += [next(it) for _ in range(stop)]
        state = sampler.state_dict()
    sampler = make_sampler()
    sampler.load_state_dict(state)
    return consumed + list(sampler)


@pytest.mark.parametrize("rank", [0, 3])
def test_resume_mid_epoch_after_two_interruptions(ds, rank):
    def make():
        s = DistributedPackSampler(ds, RANKS, rank, seed=11, balance="tokens")
        s.set_epoch(2)
        return s

    full = list(make())
    assert remaining_after_resume(ds, make, [5]) == full
    assert remaining_after_resume(ds, make, [5, 7]) == full  # two successive interruptions
    assert remaining_after_resume(ds, make, [len(full)]) == full  # saved at the end of the epoch
    # after a finished epoch the next iteration starts again at the beginning
    s = make()
    assert list(s) == full and list(s) == full


def test_resume_through_dataloader_with_consumed_count(ds):
    sampler = DistributedPackSampler(ds, RANKS, 1, seed=5)
    full = [p for b in loader_packs(ds, sampler) for p in b]
    sampler = DistributedPackSampler(ds, RANKS, 1, seed=5)
    dl = DataLoader(ds, batch_size=BATCH, sampler=sampler, collate_fn=collate_varlen, num_workers=WORKERS)
    got = []
    for step, batch in enumerate(dl):
        got += batch["pack_ids"].tolist()
        if step == 3:
            break
    # the loader prefetched ahead; the state records what the loop consumed
    state = sampler.state_dict(num_consumed=len(got))
    fresh = DistributedPackSampler(ds, RANKS, 1, seed=5)
    fresh.load_state_dict(state)
    got += [p for b in loader_packs(ds, fresh) for p in b]
    assert got == full


def test_state_refuses_mismatch(ds, tmp_path):
    s = DistributedPackSampler(ds, RANKS, 0, seed=1)
    state = s.state_dict()
    with pytest.raises(SamplerStateError, match="seed.*construct the sampler with seed=1"):
        DistributedPackSampler(ds, RANKS, 0, seed=2).load_state_dict(state)
    with pytest.raises(SamplerStateError, match="balance.*construct the sampler with balance='tokens'"):
        DistributedPackSampler(ds, 2, 0, seed=1, balance="none").load_state_dict(state)  # another world size too
    other_segs, other_po = next_fit_segments(ds.store.doc_lengths, 32)
    write_pack_index(ds.store, other_segs, other_po, capacity=32, name="other")
    other = PackedDataset(ds.store, "other")
    for replicas in (RANKS, 3):  # a different dataset is refused on any number of ranks, naming the fix
        with pytest.raises(SamplerStateError, match="fingerprint.*build the sampler on the dataset and index the checkpoint"):
            DistributedPackSampler(other, replicas, 0, seed=1).load_state_dict(state)
    with pytest.raises(SamplerStateError):
        s.load_state_dict({k: v for k, v in state.items() if k != "fingerprint"})


def test_pack_sampler_is_a_seeded_permutation(ds):
    a, b = list(PackSampler(ds, seed=4)), list(PackSampler(ds, seed=4))
    assert a == b and sorted(a) == list(range(len(ds))) and a != sorted(a)
    assert list(PackSampler(ds, shuffle=False)) == list(range(len(ds)))


def test_loaded_position_belongs_to_its_epoch(ds):
    """A loaded position serves one iterator of its own epoch; any other epoch starts at 0."""
    def make():
        return DistributedPackSampler(ds, RANKS, 2, seed=4)

    e0, e1 = make().epoch_indices(0).tolist(), make().epoch_indices(1).tolist()
    s = make()
    it = iter(s)
    head = [next(it) for _ in range(6)]
    mid = s.state_dict()
    assert head == e0[:6] and mid["epoch"] == 0 and mid["yielded"] == 6

    fresh = make()
    fresh.load_state_dict(mid)
    assert fresh.epoch == 0 and fresh.state_dict()["yielded"] == 6  # a mid-epoch state selects its epoch
    fresh.set_epoch(1)
    assert fresh.state_dict()["yielded"] == 0  # nothing of epoch 1 is done yet
    assert list(fresh) == e1
    fresh.set_epoch(0)
    assert list(fresh) == e0  # the position was for one resumed iteration only

    fresh = make()
    fresh.load_state_dict(mid)
    assert list(fresh) == e0[6:] and list(fresh) == e0


def test_state_after_set_epoch_counts_the_new_epoch(ds):
    s = DistributedPackSampler(ds, RANKS, 0, seed=4)
    assert len(list(s)) == len(s) and s.state_dict()["yielded"] == len(s)
    s.set_epoch(1)
    state = s.state_dict()  # checkpoint taken between set_epoch and the first batch
    assert state["epoch"] == 1 and state["yielded"] == 0
    fresh = DistributedPackSampler(ds, RANKS, 0, seed=4)
    fresh.load_state_dict(state)
    assert list(fresh) == s.epoch_indices(1).tolist()


def test_state_saved_at_epoch_end(ds):
    """A finished epoch's state: the epoch chosen by set_epoch before loading runs in full."""
    def make():
        return DistributedPackSampler(ds, RANKS, 3, seed=4)

    s = make()
    s.set_epoch(2)
    list(s)
    done = s.state_dict()
    assert done["yielded"] == len(s)
    nxt = make()
    nxt.set_epoch(3)  # StatefulDataLoader loads its state inside iter(loader), after set_epoch
    nxt.load_state_dict(done)
    assert nxt.epoch == 3 and list(nxt) == make().epoch_indices(3).tolist()
    same = make()
    same.load_state_dict(done)  # no set_epoch: the saved epoch, with nothing left in it
    assert same.epoch == 2 and list(same) == []
    same.set_epoch(3)
    assert list(same) == make().epoch_indices(3).tolist()


def _deal_balanced_reference(rounds: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The deal as READER.md §6 words it, one numpy argsort per round (the implementation before its numba kernel)."""
    by_weight = np.argsort(-weights, axis=1, kind="stable")
    packs = np.take_along_axis(rounds, by_weight, axis=1)
    w = np.take_along_axis(weights, by_weight, axis=1)
    out = np.empty_like(rounds)
    totals = np.zeros(rounds.shape[1], dtype=np.int64)
    for j in range(rounds.shape[0]):
        lightest = np.argsort(totals, kind="stable")
        out[j, lightest] = packs[j]
        totals[lightest] += w[j]
    return out


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 80), st.integers(1, 60), st.integers(1, 6), st.integers(0, 2**32 - 1))
def test_balanced_deal_is_the_spec_rule(ranks, rounds, spread, seed):
    """``deal_balanced`` (a numba kernel: insertion sort up to 32 ranks, merge sort above) deals exactly as the
    rule's plain numpy form, ties included (few distinct weights, many equal running totals)."""
    from packfmt.torch._deal import deal_balanced

    rng = np.random.default_rng(seed)
    packs = rng.permutation(ranks * rounds).reshape(rounds, ranks).astype(np.int64)
    weights = rng.integers(1, 1 + spread, (rounds, ranks)).astype(np.int64)
    want = _deal_balanced_reference(packs, weights)
    assert np.array_equal(deal_balanced(packs, weights), want)
    assert np.array_equal(deal_balanced(packs, weights.astype(np.int32)), want)  # the sampler's narrow weights


@pytest.mark.parametrize("balance", ["none", "tokens"])
def test_an_epochs_order_is_made_once_and_read_only(ds, balance):
    """``prefetch(ds, sampler.epoch_indices())`` then ``iter(sampler)``: one order for the epoch, shared, not
    writable (an edit by one caller would reach the other); another epoch gets its own."""
    s = DistributedPackSampler(ds, num_replicas=2, rank=1, balance=balance, window=None)
    a = s.epoch_indices()
    assert np.shares_memory(a, s.epoch_indices()) and not a.flags.writeable
    with pytest.raises(ValueError):
        a[0] = a[1]
    assert list(s) == a.tolist()
    s.set_epoch(1)
    assert not np.shares_memory(a, s.epoch_indices()) and list(s) == s.epoch_indices().tolist()
