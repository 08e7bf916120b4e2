"""Window shuffle (``DistributedPackSampler(..., window=K)``, spec/READER.md §6 "Window order").

A pack's group is the member holding its first segment's document; the groups of an epoch are
permuted and cut into windows of K groups, and each window's packs are permuted among themselves.
The oracle is ``spec_order`` of tests/test_torch_elastic.py (the spec's rule written as plain loops);
the deal, its padding and every resume (same and other world sizes) are checked by that file's
``check_epoch`` on real samplers over real collections and pack indexes.
"""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packfmt.collection import write_collection
from packfmt.errors import PackfmtError
from packfmt.torch import DistributedPackSampler, PackedDataset, PackSampler, SamplerStateError
from packfmt.torch._deal import epoch_order, group_runs, window_order
from packfmt.torch.testing import next_fit_members, write_flat_dataset, write_pack_index, write_split_stores
from test_torch_elastic import assert_epoch_multiset, check_epoch, draw_runs, roundtrip, run, spec_order

MEMBERS, DOCS = 10, 6  # documents per member
_names = itertools.count()


@pytest.fixture(scope="module")
def coll(tmp_path_factory):
    """A collection of MEMBERS member stores of DOCS documents (1..30 tokens) each."""
    root = tmp_path_factory.mktemp("window")
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 31, MEMBERS * DOCS)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    paths = write_split_stores(root / "members", rng.integers(0, 1000, offsets[-1]), offsets,
                               np.arange(0, MEMBERS * DOCS + 1, DOCS), vocab_size=1000)
    return write_collection(root / "c", [(None, p) for p in paths])


def index_of(coll, layout) -> PackedDataset:
    """A pack index of whole documents: ``layout`` = [(member, [documents per pack, ...]), ...] in pack order,
    each member's documents taken in order from its first."""
    segs, offsets, lengths = [], [0], coll.doc_lengths
    for member, packs in layout:
        doc = int(coll.doc_start[member])
        for k in packs:
            segs += [(d, 0, int(lengths[d])) for d in range(doc, doc + k)]
            offsets.append(len(segs))
            doc += k
    name = f"h{next(_names)}"
    write_pack_index(coll, np.array(segs), np.array(offsets), capacity=30 * DOCS, name=name)
    return PackedDataset(coll, name)


@st.composite
def layouts(draw):
    """Some members in any order, each member's documents cut into 1..DOCS packs of consecutive documents."""
    members = draw(st.permutations(range(MEMBERS)))[:draw(st.integers(1, MEMBERS))]
    out = []
    for m in members:
        cuts = sorted(draw(st.sets(st.integers(1, DOCS - 1), max_size=DOCS - 1)))
        out.append((m, list(np.diff([0, *cuts, DOCS]))))
    return out


def windows_of(order, groups, window):
    """Check that one epoch's order is windows of ``window`` whole groups each (the last: the rest), every
    window a contiguous block of the order; return the blocks."""
    size = Counter(groups)
    out, pos, seen = [], 0, set()
    while pos < len(order):
        want, members = min(window, len(size) - len(seen)), []
        for p in order[pos:]:  # the window's groups: the first `want` distinct groups from here
            if groups[p] not in members:
                members.append(groups[p])
                if len(members) == want:
                    break
        end = pos + sum(size[g] for g in members)
        assert {groups[p] for p in order[pos:end]} == set(members) and not seen & set(members)
        seen |= set(members)
        out.append(order[pos:end])
        pos = end
    return out


# ---------------------------------------------------------------------- the rule, pure
@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(1, 8), min_size=1, max_size=15), window=st.integers(1, 6),
       seed=st.integers(0, 2**32), epoch=st.integers(0, 50))
def test_window_order_is_the_spec_rule(sizes, window, seed, epoch):
    groups = np.repeat(np.arange(len(sizes))[::-1] * 3, sizes)  # group ids in any order: only runs matter
    runs, split = group_runs(groups)
    assert split == -1 and runs[-1] == len(sizes) - 1
    order = window_order(runs, seed, epoch, window)
    n = groups.shape[0]
    assert order.dtype == np.int64 and sorted(order.tolist()) == list(range(n))  # every pack exactly once
    assert order.tolist() == spec_order(n, seed, epoch, True, window, groups.tolist())
    assert np.array_equal(order, epoch_order(n, seed, epoch, True, window, runs))  # deterministic, one rule
    blocks = windows_of(order.tolist(), groups.tolist(), window)
    assert len(blocks) == -(-len(sizes) // window)


@settings(max_examples=200, deadline=None)
@given(groups=st.lists(st.integers(0, 4), min_size=1, max_size=30))
def test_group_runs_finds_the_first_split_group(groups):
    runs, split = group_runs(np.array(groups))
    first_seen, expect, prev = {}, -1, None
    for p, g in enumerate(groups):
        if g != prev and g in first_seen and expect < 0:
            expect = p
        first_seen.setdefault(g, p)
        prev = g
    assert split == expect
    assert runs.tolist() == [sum(1 for i in range(1, p + 1) if groups[i] != groups[i - 1]) for p in range(len(groups))]
    for shift in (-10, 2**40):  # ids a seen-bit array cannot index: the numpy path, the same answer
        other, other_split = group_runs(np.array(groups) + shift)
        assert other_split == split and other.tolist() == runs.tolist()


def test_no_window_keeps_the_plain_order_bit_identical():
    for n, seed, epoch in ((1, 0, 0), (97, 3, 5), (1000, 2**31, 1)):
        assert np.array_equal(epoch_order(n, seed, epoch, True),
                              np.random.default_rng([seed, epoch]).permutation(n))


# ---------------------------------------------------------------------- real samplers over real indexes
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_window_epochs_deal_and_resume_on_any_world_sizes(coll, data):
    """Every pack once per epoch (padding and dropped tails as without window), each window K whole groups
    contiguous in the order, through any sequence of interruptions on any world sizes."""
    ds = index_of(coll, data.draw(layouts(), label="layout"))
    window = data.draw(st.integers(1, 4), label="window")
    cfg = dict(seed=data.draw(st.integers(0, 3), label="seed"), epoch=data.draw(st.integers(0, 4), label="epoch"),
               shuffle=True, drop_last=data.draw(st.booleans(), label="drop_last"),
               balance=data.draw(st.sampled_from(["tokens", "none"]), label="balance"), window=window)
    groups = ds.pack_groups().tolist()
    order = spec_order(len(ds), cfg["seed"], cfg["epoch"], True, window, groups)
    windows_of(order, groups, window)
    consumed, got_order, finisher, _ = check_epoch(ds, draw_runs(data, order, cfg["drop_last"]), **cfg)
    assert got_order == order
    assert_epoch_multiset(consumed, order, finisher, cfg["drop_last"])


@pytest.mark.parametrize("worlds", [(3, 3), (4, 3), (2, 4)], ids=lambda w: f"{w[0]}to{w[1]}")
@pytest.mark.parametrize("drop_last", [False, True])
def test_window_resume_mid_epoch(coll, worlds, drop_last):
    ds = index_of(coll, [(m, [1, 2, 3] if m % 2 else [2] * 3) for m in range(MEMBERS)])  # 30 packs
    old, new = worlds
    consumed, order, finisher, states = check_epoch(ds, [(old, 3), (new, None)], seed=7, epoch=1, shuffle=True,
                                                    drop_last=drop_last, balance="tokens", window=2)
    assert states[0]["window"] == 2
    assert sorted(consumed[:3 * old]) == sorted(order[:3 * old])
    assert_epoch_multiset(consumed, order, finisher, drop_last)
    if old == new:  # the same deal continued: exactly the uninterrupted run
        straight, _ = run(ds, old, 1, None, None, seed=7, drop_last=drop_last, balance="tokens", window=2)
        assert consumed == [p for rnd in straight for p in rnd]


def test_pack_groups_and_a_store_is_one_group(coll, tmp_path):
    ds = index_of(coll, [(4, [6]), (1, [3, 3]), (7, [1, 5])])
    assert ds.pack_groups().tolist() == [4, 1, 1, 7, 7] and ds.pack_groups().dtype == np.int64
    lengths = np.arange(1, 13)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    store = write_flat_dataset(tmp_path / "s", np.arange(int(offsets[-1])) % 50, offsets,
                               vocab_size=50)
    write_pack_index(store, np.stack([np.arange(12), np.zeros(12, np.int64), lengths], axis=1), np.arange(13),
                     capacity=12, name="one")
    sds = PackedDataset(store, "one")
    assert sds.pack_groups().tolist() == [0] * 12
    s = PackSampler(sds, seed=5, window=3)
    assert list(s) == spec_order(12, 5, 0, True, 3, [0] * 12) and sorted(s) == list(range(12))


def test_split_members_are_refused_naming_the_index(coll):
    ds = index_of(coll, [(2, [3]), (5, [6]), (2, [3])])  # member 2's packs on both sides of member 5's
    with pytest.raises(PackfmtError, match=r"packs/h\d+: packs of one member: expected consecutive .*found pack 2 "
                                           r"in member 2 .*packfmt pack COLL --capacity N --shards OUT.*window=None"):
        DistributedPackSampler(ds, 2, 0, window=2)
    assert len(list(DistributedPackSampler(ds, 2, 0))) == 2  # without window: the plain shuffle


def test_window_arguments_are_checked(coll):
    ds = index_of(coll, [(0, [6]), (1, [6])])
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="window: expected None or an integer >= 1"):
            DistributedPackSampler(ds, 1, 0, window=bad)
    with pytest.raises(ValueError, match="window: a window shuffle needs shuffle=True"):
        DistributedPackSampler(ds, 1, 0, shuffle=False, window=2)


def test_a_state_with_another_window_is_refused(coll):
    ds = index_of(coll, [(m, [3, 3]) for m in range(MEMBERS)])
    _, states = run(ds, 2, 0, None, 3, seed=1, window=2)
    for other in (None, 3):
        with pytest.raises(SamplerStateError, match=rf"window: expected {other} \(this sampler\), found 2 \(saved\); "
                                                    r"the state belongs to another sampler configuration: construct "
                                                    r"the sampler with window=2"):
            DistributedPackSampler(ds, 2, 0, seed=1, window=other).load_state_dict(states[0])
    old = {k: v for k, v in states[0].items() if k != "window"}  # READER.md 1.0-1.4: no window, the plain shuffle
    with pytest.raises(SamplerStateError, match="window: expected 2 .*found None"):
        DistributedPackSampler(ds, 2, 0, seed=1, window=2).load_state_dict(old)
    plain = DistributedPackSampler(ds, 2, 0, seed=1)
    plain.load_state_dict({k: v for k, v in run(ds, 2, 0, None, 3, seed=1)[1][0].items() if k != "window"})
    assert list(plain) == DistributedPackSampler(ds, 2, 0, seed=1).epoch_indices(0)[3:].tolist()
    resumed = DistributedPackSampler(ds, 2, 1, seed=1, window=2)
    resumed.load_state_dict(roundtrip(states[1]))
    assert list(resumed) == DistributedPackSampler(ds, 2, 1, seed=1, window=2).epoch_indices(0)[3:].tolist()


def test_next_fit_members_never_mixes_members(coll):
    segs, offsets = next_fit_members(coll.doc_lengths, coll.doc_start, 40)
    write_pack_index(coll, segs, offsets, capacity=40, name="nfm")
    ds = PackedDataset(coll, "nfm")
    members = coll.member_of(segs[:, 0])
    groups = ds.pack_groups()
    assert np.array_equal(np.repeat(groups, np.diff(offsets)), members)  # every segment in its pack's member
    assert np.all(np.diff(groups) >= 0) and group_runs(groups)[1] == -1
    assert np.array_equal(np.bincount(segs[:, 0], weights=segs[:, 2] - segs[:, 1]), coll.doc_lengths)  # all tokens
    assert (ds.pack_num_tokens() <= 40).all()
    DistributedPackSampler(ds, 2, 0, window=3)  # accepted
