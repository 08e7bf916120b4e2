"""Elastic resume: a sampler state saved on W ranks resumes on W' ranks (spec/READER.md §6).

The oracle below is the spec's rule written out independently of ``packfmt/torch/_deal.py``: the
epoch's global order, a deal of ``order[start:]`` padded with the epoch's first packs (or with its
tail dropped), rounds of R consecutive entries. Each check replays runs on several world sizes
(every rank a real sampler, states through ``torch.save``/``torch.load``) and asserts that what all
ranks of all runs consumed is the global order, round by round, each pack exactly once, followed
by exactly the padding of the deal that finished the epoch (or without the dropped tail).
"""

from __future__ import annotations

import io
from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from packfmt.torch import DistributedPackSampler, PackedDataset, PackSampler, SamplerStateError, collate_varlen
from packfmt.torch import lockstep_state
from packfmt.torch.testing import write_flat_dataset, write_pack_index

SIZES = (1, 7, 61, 299)  # packs per dataset: smaller than, close to and far above the world sizes


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """One real store + pack index per size: one document of 1..59 tokens per pack."""
    root = tmp_path_factory.mktemp("elastic")
    out = {}
    for n in SIZES:
        rng = np.random.default_rng(n)
        lengths = rng.integers(1, 60, n)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        store = write_flat_dataset(root / f"ds{n}", rng.integers(0, 1000, offsets[-1]), offsets, vocab_size=1000)
        segs = np.stack([np.arange(n), np.zeros(n, dtype=np.int64), lengths], axis=1)
        write_pack_index(store, segs, np.arange(n + 1), capacity=64, name="one")
        out[n] = PackedDataset(store, "one")
    return out


@pytest.fixture(scope="module")
def ds(datasets):
    return datasets[299]


def roundtrip(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


# ---------------------------------------------------------------------- the spec's rule, independently
def spec_order(n, seed, epoch, shuffle, window=None, groups=None):
    """The global order; with ``window`` (K) and ``groups`` (each pack's group), the window shuffle."""
    if not shuffle:
        return list(range(n))
    rng = np.random.default_rng([seed, epoch])
    if window is None:
        return [int(x) for x in rng.permutation(n)]
    runs = []  # the packs of each group, groups in pack order
    for p in range(n):
        if p == 0 or groups[p] != groups[p - 1]:
            runs.append([])
        runs[-1].append(p)
    by_window = rng.permutation(len(runs))  # window i holds groups by_window[i*K : (i+1)*K]
    key = rng.permutation(n)
    order = []
    for i in range(0, len(runs), window):
        order += sorted((p for g in by_window[i:i + window] for p in runs[g]), key=lambda p: key[p])
    return order


def spec_entries(order, start, world, drop_last):
    """The deal of order[start:] over ``world`` ranks, as one flat list of entries (READER.md §6)."""
    rest = order[start:]
    if drop_last:
        return rest[: len(rest) // world * world]
    size = -(-len(rest) // world) * world
    return rest + [order[i % len(order)] for i in range(size - len(rest))]


# ---------------------------------------------------------------------- runs of lockstep ranks
def run(ds, world, epoch, states, rounds, **cfg):
    """One run on ``world`` ranks: each rank loads an old rank's state (if any), takes ``rounds`` packs
    (None: to the end of its deal), saves. Returns (rounds as lists indexed by rank, states)."""
    samplers = []
    for r in range(world):
        s = DistributedPackSampler(ds, world, r, **cfg)
        s.set_epoch(epoch)
        if states:
            s.load_state_dict(states[r % len(states)])  # any old rank's state serves any new rank
        samplers.append(s)
    assert len({len(s) for s in samplers}) == 1  # every rank the same number of packs, so of batches
    iters = [iter(s) for s in samplers]
    taken = []
    while rounds is None or len(taken) < rounds:
        rnd = [next(it, None) for it in iters]
        if rounds is None and rnd[0] is None:
            assert rnd == [None] * world  # the deal ends on every rank at once
            break
        assert None not in rnd
        taken.append(rnd)
    return taken, [roundtrip(s.state_dict()) for s in samplers]


def check_epoch(ds, runs, *, seed, epoch, shuffle, drop_last, balance, window=None):
    """Replay ``runs`` = [(world, rounds or None), ...] (the last one to the end of the epoch) and check
    every round against the spec. Returns (all packs consumed in round order, the global order, the
    last run's start position and world size, the last states)."""
    cfg = dict(seed=seed, shuffle=shuffle, drop_last=drop_last, balance=balance, window=window)
    order = spec_order(len(ds), seed, epoch, shuffle, window, None if window is None else ds.pack_groups().tolist())
    weights = ds.pack_num_tokens()
    consumed, states, pos, prev_world, totals, finisher = [], None, 0, None, None, None
    for world, rounds in runs:
        start = pos
        taken, states = run(ds, world, epoch, states, rounds, **cfg)
        entries = spec_entries(order, start, world, drop_last)
        for j, rnd in enumerate(taken):  # each round: the next `world` entries of the deal
            expect = entries[j * world:(j + 1) * world]
            if balance == "none":
                assert rnd == expect  # rank r takes entry r
            else:
                assert sorted(rnd) == sorted(expect)  # balancing only permutes within a round
        if balance == "tokens":  # balanced within each deal (a resume on as many ranks continues it)
            if world != prev_world:
                totals = np.zeros(world, dtype=np.int64)
            for rnd in taken:
                totals += weights[rnd]
                assert totals.max() - totals.min() <= weights.max()
        consumed += [p for rnd in taken for p in rnd]
        saved = lockstep_state(states)  # every rank saved the same position
        pos = len(order) if len(taken) * world >= len(entries) else start + len(taken) * world
        assert saved["consumed"] == pos and saved["num_replicas"] == world
        if pos == len(order) and finisher is None:
            finisher = (start, world)  # the deal that finished the epoch: its padding or dropped tail counts
        prev_world = world
    assert finisher is not None, "the last run finishes the epoch"
    return consumed, order, finisher, states


def assert_epoch_multiset(consumed, order, finisher, drop_last):
    """Every pack of the epoch exactly once, plus the last deal's padding (or minus its dropped tail)."""
    (last_start, last_world), n = finisher, len(order)
    rest = n - last_start
    if drop_last:
        dropped = order[n - rest % last_world:] if rest % last_world else []
        assert sorted(consumed + dropped) == list(range(n))  # each pack once, the dropped ones never
    else:
        pad = [order[i % n] for i in range(-rest % last_world)]  # cyclically, when it outnumbers the packs
        assert len(consumed) == n + len(pad) and set(consumed) == set(range(n))
        assert not Counter(pad) - Counter(consumed[-last_world:])  # the padding (the epoch's first packs): last round
        assert sorted(consumed) == sorted(order + pad)


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("balance", ["tokens", "none"])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("worlds", [(4, 3), (2, 4)], ids=lambda w: f"{w[0]}to{w[1]}")
def test_resume_on_another_world_size_consumes_the_epoch_once(ds, worlds, shuffle, balance, drop_last):
    old, new = worlds
    consumed, order, finisher, _ = check_epoch(ds, [(old, 17), (new, None)], seed=5, epoch=3, shuffle=shuffle,
                                               drop_last=drop_last, balance=balance)
    start = 17 * old
    assert finisher == (start, new)
    assert sorted(consumed[:start]) == sorted(order[:start])  # the old ranks took the order's first rounds
    if balance == "none":
        assert consumed[: len(order) - 10] == order[: len(order) - 10]  # interleaved ranks: the global order itself
    assert_epoch_multiset(consumed, order, finisher, drop_last)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_sequence_of_world_sizes_consumes_the_epoch_once(datasets, data):
    """Property: any dataset size, configuration and sequence of interruptions on any world sizes."""
    n = data.draw(st.sampled_from(SIZES), label="packs")
    cfg = dict(seed=data.draw(st.integers(0, 3), label="seed"), epoch=data.draw(st.integers(0, 4), label="epoch"),
               shuffle=data.draw(st.booleans(), label="shuffle"), drop_last=data.draw(st.booleans(), label="drop_last"),
               balance=data.draw(st.sampled_from(["tokens", "none"]), label="balance"))
    order = spec_order(n, cfg["seed"], cfg["epoch"], cfg["shuffle"])
    consumed, order, finisher, _ = check_epoch(datasets[n], draw_runs(data, order, cfg["drop_last"]), **cfg)
    assert_epoch_multiset(consumed, order, finisher, cfg["drop_last"])


def draw_runs(data, order, drop_last):
    """Up to 3 interrupted runs on drawn world sizes, each stopped after a drawn number of rounds of the deal
    from where the last one stopped, then a last world size that finishes the epoch: ``check_epoch``'s ``runs``."""
    runs, pos = [], 0
    for _ in range(data.draw(st.integers(0, 3), label="interruptions")):
        world = data.draw(st.integers(1, 6), label="world")
        length = len(spec_entries(order, pos, world, drop_last)) // world
        rounds = data.draw(st.integers(0, length), label="rounds")
        runs.append((world, rounds))
        pos = len(order) if rounds == length else pos + rounds * world
    return runs + [(data.draw(st.integers(1, 6), label="last world"), None)]


def per_rank(ds, world, state, stops, epoch=2, **cfg):
    """Each rank of a ``world``-rank run from ``state``, interrupted after each of ``stops`` packs: all it yields."""
    out = []
    for r in range(world):
        got, st_ = [], state
        for stop in stops + [None]:
            s = DistributedPackSampler(ds, world, r, seed=1, **cfg)
            s.set_epoch(epoch)
            s.load_state_dict(st_)
            it = iter(s)
            got += list(it) if stop is None else [next(it) for _ in range(stop)]
            st_ = roundtrip(s.state_dict())
        out.append(got)
    return out


def test_a_resumed_deal_resumes_exactly_on_its_own_world_size(ds):
    """After 4 -> 3, the 3-rank deal (start > 0, balanced) survives further interruptions on 3 ranks unchanged."""
    _, states = run(ds, 4, 2, None, 9, seed=1, balance="tokens")
    assert states[0]["start"] == 0 and states[0]["consumed"] == 36
    straight = per_rank(ds, 3, states[1], [], balance="tokens")
    assert per_rank(ds, 3, states[2], [4, 11], balance="tokens") == straight
    s = DistributedPackSampler(ds, 3, 0, seed=1, balance="tokens")
    s.load_state_dict(states[3])
    assert len(s) == -(-(len(ds) - 36) // 3) and s.state_dict()["start"] == 36  # the deal of what is left
    it = iter(s)
    next(it)
    mid = s.state_dict()
    assert (mid["start"], mid["yielded"], mid["consumed"], mid["num_replicas"]) == (36, 1, 39, 3)
    s.set_epoch(3)  # the next epoch is whole again, on 3 ranks
    assert len(s) == -(-len(ds) // 3) and list(s) == DistributedPackSampler(ds, 3, 0, seed=1).epoch_indices(3).tolist()


@pytest.mark.parametrize("drop_last", [True, False])
def test_a_finished_epoch_stays_finished_on_another_world_size(ds, drop_last):
    """299 packs on 4 ranks: drop_last drops 3; loaded on 2 ranks those 3 are not dealt after all."""
    cfg = dict(seed=1, drop_last=drop_last, balance="none")
    _, states = run(ds, 4, 2, None, None, **cfg)
    assert states[0]["consumed"] == len(ds) == 299
    for r in range(2):
        s = DistributedPackSampler(ds, 2, r, **cfg)
        s.load_state_dict(states[r])
        assert s.epoch == 2 and list(s) == []  # nothing left of epoch 2
        nxt = DistributedPackSampler(ds, 2, r, **cfg)
        nxt.set_epoch(3)  # StatefulDataLoader order: set_epoch, then the state of the finished epoch
        nxt.load_state_dict(states[r])
        assert nxt.epoch == 3 and list(nxt) == DistributedPackSampler(ds, 2, r, **cfg).epoch_indices(3).tolist()


def test_states_that_are_not_one_lockstep_position_are_refused(ds):
    _, states = run(ds, 4, 0, None, 5, seed=1)
    assert lockstep_state(states) == states[0]
    ahead = dict(states[2], yielded=6, consumed=states[2]["consumed"] + 4)
    with pytest.raises(SamplerStateError, match=r"yielded: rank 0 saved 5, rank 2 saved 6.*load the states that one"):
        lockstep_state(states[:2] + [ahead] + states[3:])
    with pytest.raises(SamplerStateError, match=r"rank: expected each of 0..3 once"):
        lockstep_state(states[:3])
    with pytest.raises(SamplerStateError, match="epoch"):
        lockstep_state([states[0], dict(states[1], epoch=1)])
    with pytest.raises(SamplerStateError):
        lockstep_state([])


@pytest.mark.parametrize("edit,match", [
    ({"consumed": 21}, r"consumed: expected 20 .*written by another program"),
    ({"start": 300, "consumed": 300}, r"start: expected an integer in \[0, 299\]"),
    ({"yielded": 76}, r"yielded: expected an integer in \[0, 75\]"),
    ({"num_replicas": 0}, r"num_replicas: expected an integer in \[1, inf\]"),
    ({"rank": 4}, r"rank: expected an integer in \[0, 3\]"),
    ({"yielded": "5"}, r"yielded: expected an integer"),
    ({"start": None}, r"start: expected an integer"),
], ids=["consumed", "start", "yielded", "replicas", "rank", "str", "none"])
def test_states_whose_positions_do_not_add_up_are_refused(ds, edit, match):
    _, states = run(ds, 4, 0, None, 5, seed=1)
    bad = dict(states[1], **edit)
    for world in (4, 3):
        with pytest.raises(SamplerStateError, match=match):
            DistributedPackSampler(ds, world, 0, seed=1).load_state_dict(bad)
    half = {k: v for k, v in states[1].items() if k != "consumed"}
    with pytest.raises(SamplerStateError, match=r"state\['consumed'\]: expected present"):
        DistributedPackSampler(ds, 3, 0, seed=1).load_state_dict(half)


def test_a_state_from_before_elastic_resume_reads_as_start_zero(ds):
    """States of READER.md 1.0-1.3 have no start/consumed: they resume on any world size."""
    _, states = run(ds, 4, 1, None, 6, seed=1)
    old = [{k: v for k, v in s.items() if k not in ("start", "consumed")} for s in states]
    same = DistributedPackSampler(ds, 4, 2, seed=1)
    same.load_state_dict(old[2])
    assert list(same) == DistributedPackSampler(ds, 4, 2, seed=1).epoch_indices(1)[6:].tolist()
    three = DistributedPackSampler(ds, 3, 0, seed=1)
    three.load_state_dict(old[0])
    assert three.state_dict()["start"] == 24  # 6 rounds of 4 ranks done
    assert list(three) == DistributedPackSampler(ds, 3, 0, seed=1).epoch_indices(1, start=24).tolist()


def test_pack_sampler_takes_over_from_four_ranks(ds):
    """Down to one process: a 4-rank balance="none" state resumes on PackSampler in the global order."""
    taken, states = run(ds, 4, 0, None, 10, seed=4, balance="none")
    single = PackSampler(ds, seed=4)
    single.load_state_dict(states[3])
    order = spec_order(len(ds), 4, 0, True)
    assert [p for rnd in taken for p in rnd] + list(single) == order


# ---------------------------------------------------------------------- through real DataLoaders with workers
BATCH = 4


def check_loader_runs(ds, old_ranks, new_ranks, old_batches, epoch, seed):
    """Rank lists of what each old rank took (``old_batches`` batches) and each new rank took to the
    epoch's end: zipped into lockstep rounds, checked against the spec like ``check_epoch``."""
    order = spec_order(len(ds), seed, epoch, True)
    start = old_batches * BATCH * len(old_ranks)
    consumed = []
    for ranks, begin in ((old_ranks, 0), (new_ranks, start)):
        world = len(ranks)
        assert len({len(r) for r in ranks}) == 1  # lockstep: every rank took as many packs
        entries = spec_entries(order, begin, world, False)
        rounds = [list(rnd) for rnd in zip(*ranks)]
        for j, rnd in enumerate(rounds):
            assert sorted(rnd) == sorted(entries[j * world:(j + 1) * world])
        consumed += [p for rnd in rounds for p in rnd]
    assert len(consumed) - len(ds) == -(len(ds) - start) % len(new_ranks) > 0  # the last deal pads
    assert_epoch_multiset(consumed, order, (start, len(new_ranks)), False)


def stateful_run(ds, world, rank, num_workers, *, stop=None, resume=None, epochs=2):
    """A training loop over ``epochs`` on one rank, checkpointing after ``stop`` batches.
    Returns ({epoch: packs}, checkpoint or None)."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    sampler = DistributedPackSampler(ds, world, rank, seed=9, balance="tokens")
    loader = StatefulDataLoader(ds, batch_size=BATCH, sampler=sampler, collate_fn=collate_varlen,
                                num_workers=num_workers)
    first = 0
    if resume is not None:
        loader.load_state_dict(resume["loader"])
        first = resume["epoch"]
    got, n = {}, 0
    for epoch in range(first, epochs):
        sampler.set_epoch(epoch)
        for batch in loader:
            got.setdefault(epoch, []).extend(batch["pack_ids"].tolist())
            n += 1
            if n == stop:
                return got, roundtrip({"epoch": epoch, "loader": loader.state_dict()})
    return got, None


@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")
@pytest.mark.parametrize("num_workers", [0, 2])
def test_stateful_dataloader_four_ranks_resume_on_three(ds, num_workers):
    pytest.importorskip("torchdata.stateful_dataloader", reason="torchdata is not installed")
    stop = 4
    old = [stateful_run(ds, 4, r, num_workers, stop=stop) for r in range(4)]
    new = [stateful_run(ds, 3, r, num_workers, resume=old[r % 4][1])[0] for r in range(3)]
    check_loader_runs(ds, [o[0][0] for o in old], [g[0] for g in new], stop, epoch=0, seed=9)
    for r in range(3):  # and the next epoch is a whole epoch on 3 ranks
        assert new[r][1] == DistributedPackSampler(ds, 3, r, seed=9).epoch_indices(1).tolist()


def test_plain_dataloader_two_ranks_resume_on_four(ds):
    """A DataLoader with 2 workers prefetches; the state records the packs the loop consumed."""
    stop = 6
    old, states = [], []
    for r in range(2):
        sampler = DistributedPackSampler(ds, 2, r, seed=9, balance="tokens")
        got = []
        for step, batch in enumerate(DataLoader(ds, batch_size=BATCH, sampler=sampler, collate_fn=collate_varlen,
                                                num_workers=2)):
            got += batch["pack_ids"].tolist()
            if step + 1 == stop:
                break
        old.append(got)
        states.append(roundtrip(sampler.state_dict(num_consumed=len(got))))
    state = lockstep_state(states)
    new = []
    for r in range(4):
        sampler = DistributedPackSampler(ds, 4, r, seed=9, balance="tokens")
        sampler.load_state_dict(state)
        new.append([p for b in DataLoader(ds, batch_size=BATCH, sampler=sampler, collate_fn=collate_varlen,
                                          num_workers=2 if r == 0 else 0) for p in b["pack_ids"].tolist()])
    check_loader_runs(ds, old, new, stop, epoch=0, seed=9)
