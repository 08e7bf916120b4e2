"""Node-aware deal (``DistributedPackSampler(..., nodes=Q)``, spec/READER.md §6 "Nodes").

The oracle is the spec's rule written as plain loops, independently of ``packfmt/torch/_deal.py``: the deal's
entries (the sequence cut or padded as for one node), node ``q``'s block of ``L * t`` consecutive entries, rounds of
``L`` in it; after every rank took ``y`` packs, node ``q``'s first ``y * L`` entries are consumed, and a resume on
another shape deals what is left of the sequence, in order. Runs use real samplers, states through
``torch.save``/``torch.load``, and check every round of every rank against the oracle, each pack once per epoch,
equal lengths on every rank, and (over a collection with ``window``) that each member is read by one node.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packfmt.torch import DistributedPackSampler, SamplerStateError, lockstep_state
from test_torch_elastic import datasets, roundtrip, spec_order  # noqa: F401 - the fixture is used by name
from test_torch_window import DOCS, MEMBERS, coll, index_of  # noqa: F401


# ---------------------------------------------------------------------- the spec's rule, independently
def oracle_parts(seq, world, nodes, drop_last):
    """Each node's part of the sequence, as lists of positions: with drop_last L*t each from the front (the
    rest dropped), else len // nodes each, the first len % nodes one more."""
    per = world // nodes
    if drop_last:
        t = len(seq) // world
        return [list(range(q * per * t, (q + 1) * per * t)) for q in range(nodes)]
    parts, at = [], 0
    for q in range(nodes):
        size = len(seq) // nodes + (1 if q < len(seq) % nodes else 0)
        parts.append(list(range(at, at + size)))
        at += size
    return parts


def oracle_deal(seq, order, world, nodes, drop_last):
    """Each rank's packs, in order: node q's part padded to L*t entries (one node: the epoch's first packs; more:
    the part's own last packs, or the epoch's first for an empty part), round j's entry l to rank q*L + l."""
    t = (len(seq) // world) if drop_last else -(-len(seq) // world)
    per = world // nodes
    ranks = [[] for _ in range(world)]
    parts = oracle_parts(seq, world, nodes, drop_last)
    for q, part in enumerate(parts):
        block = [seq[i] for i in part]
        pad = per * t - len(block)
        if nodes == 1 or not block:
            block += [order[i % len(order)] for i in range(pad)]
        else:
            block += [block[(len(block) - pad + i) % len(block)] for i in range(pad)]
        for j in range(t):
            for lr in range(per):
                ranks[q * per + lr].append(block[j * per + lr])
    return ranks


def oracle_left(seq, world, nodes, taken, drop_last):
    """What a deal of ``seq`` leaves after every rank took ``taken`` packs (the next deal's sequence)."""
    t = (len(seq) // world) if drop_last else -(-len(seq) // world)
    if taken >= t:
        return []
    per = world // nodes
    done = {i for part in oracle_parts(seq, world, nodes, drop_last) for i in part[:taken * per]}
    return [p for i, p in enumerate(seq) if i not in done]


def run_shape(ds, world, nodes, epoch, states, rounds, **cfg):
    """One run on ``world`` ranks and ``nodes`` nodes from ``states`` (any old rank's state to any new rank):
    each rank's packs for ``rounds`` rounds (None: to the end), and the states saved after them."""
    samplers = []
    for r in range(world):
        s = DistributedPackSampler(ds, world, r, nodes=nodes, **cfg)
        s.set_epoch(epoch)
        if states:
            s.load_state_dict(states[(r * 7) % len(states)])
        samplers.append(s)
    lengths = {len(s) for s in samplers}
    assert len(lengths) == 1, f"ranks with different lengths: {lengths}"  # DDP would hang
    its = [iter(s) for s in samplers]
    taken = [list(it) if rounds is None else [next(it) for _ in range(rounds)] for it in its]
    assert len({len(t) for t in taken}) == 1  # the deal ends on every rank at once
    return taken, [roundtrip(s.state_dict()) for s in samplers]


def check_shapes(ds, shapes, *, seed, epoch, shuffle, drop_last, balance, window=None):
    """Replay ``shapes`` = [(world, nodes, rounds or None), ...] (the last to the end of the epoch) against the
    oracle: a run on the shape of the one before continues its deal, another shape deals what is left. Returns
    every pack consumed, the order, and the finishing deal's (sequence length, world)."""
    cfg = dict(seed=seed, shuffle=shuffle, drop_last=drop_last, balance=balance, window=window)
    order = spec_order(len(ds), seed, epoch, shuffle, window, None if window is None else ds.pack_groups().tolist())
    weights = ds.pack_num_tokens()
    seq, states, consumed, last, shape, y0 = list(order), None, [], None, None, 0
    for world, nodes, rounds in shapes:
        if shape is not None and shape != (world, nodes):
            seq, y0 = oracle_left(seq, *shape, y0, drop_last), 0  # a new deal of what is left
        shape = (world, nodes)
        taken, states = run_shape(ds, world, nodes, epoch, states, rounds, **cfg)
        want = oracle_deal(seq, order, world, nodes, drop_last)
        y1, per = y0 + len(taken[0]), world // nodes
        for r in range(world):
            if balance == "none":
                assert taken[r] == want[r][y0:y1]
        for q in range(nodes):  # balancing only permutes a round among the node's ranks
            ranks = range(q * per, (q + 1) * per)
            for j in range(len(taken[0])):
                assert sorted(taken[r][j] for r in ranks) == sorted(want[r][y0 + j] for r in ranks)
            if balance == "tokens" and taken[0] and y0 == 0:
                totals = [int(weights[taken[r]].sum()) for r in ranks]
                assert max(totals) - min(totals) <= weights.max()
        consumed += [p for r in range(world) for p in taken[r]]
        saved = lockstep_state(states)
        assert (saved["num_replicas"], saved["nodes"], saved["yielded"]) == (world, nodes, y1)
        left = oracle_left(seq, world, nodes, y1, drop_last)
        assert saved["consumed"] == len(order) - len(left)
        if not left and last is None:
            last = (len(seq), world)  # the deal that finished the epoch: its padding or dropped tail counts
        y0 = y1
    assert last is not None, "the last shape finishes the epoch"
    return consumed, order, last


def assert_once(consumed, order, last, drop_last, nodes_last=1):
    """Every pack once, plus the finishing deal's padding, or minus its dropped tail: fewer than R entries."""
    rest, world = last
    n = len(order)
    count = Counter(consumed)
    if drop_last:
        assert set(count.values()) <= {1} and len(consumed) == n - rest % world
    else:
        assert set(count) == set(range(n)) and len(consumed) == n + (-rest % world)


# ---------------------------------------------------------------------- tests
@pytest.mark.parametrize("balance", ["none", "tokens"])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("world,nodes", [(4, 2), (6, 3), (8, 4), (3, 3)])
def test_each_node_takes_one_block_of_the_deal(datasets, world, nodes, balance, drop_last):
    ds = datasets[299]
    consumed, order, last = check_shapes(ds, [(world, nodes, None)], seed=3, epoch=1, shuffle=True,
                                         drop_last=drop_last, balance=balance)
    assert_once(consumed, order, last, drop_last)


def test_one_node_is_the_deal_of_earlier_revisions(datasets):
    ds = datasets[61]
    for r in range(4):
        a = DistributedPackSampler(ds, 4, r, seed=2, nodes=1, balance="tokens")
        assert list(a) == [int(x) for x in np.asarray(a.assignment()[:, r])]
        state = a.state_dict()
        assert state["nodes"] == 1 and state["deals"] == []


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_sequence_of_shapes_consumes_the_epoch_once(datasets, data):
    """Property: resumes across any worlds and node counts (W -> W', N -> N') keep every pack once per epoch."""
    n = data.draw(st.sampled_from([1, 7, 61, 299]), label="packs")
    ds = datasets[n]
    cfg = dict(seed=data.draw(st.integers(0, 3), label="seed"), epoch=data.draw(st.integers(0, 3), label="epoch"),
               shuffle=data.draw(st.booleans(), label="shuffle"), drop_last=data.draw(st.booleans(), label="drop"),
               balance=data.draw(st.sampled_from(["tokens", "none"]), label="balance"))
    seq, shapes = spec_order(n, cfg["seed"], cfg["epoch"], cfg["shuffle"]), []
    order = list(seq)
    for _ in range(data.draw(st.integers(0, 3), label="interruptions")):
        nodes = data.draw(st.integers(1, 4), label="nodes")
        world = nodes * data.draw(st.integers(1, 3), label="ranks a node")
        t = (len(seq) // world) if cfg["drop_last"] else -(-len(seq) // world)
        rounds = data.draw(st.integers(0, t), label="rounds")
        shapes.append((world, nodes, rounds))
        seq = oracle_left(seq, world, nodes, rounds, cfg["drop_last"])
    nodes = data.draw(st.integers(1, 4), label="last nodes")
    shapes.append((nodes * data.draw(st.integers(1, 3), label="last ranks a node"), nodes, None))
    consumed, order, last = check_shapes(ds, shapes, **cfg)
    assert_once(consumed, order, last, cfg["drop_last"])


@pytest.mark.parametrize("shapes", [[(8, 4, 5), (6, 3, None)], [(4, 2, 3), (8, 4, 2), (4, 4, None)],
                                    [(8, 4, 7), (8, 4, None)], [(2, 1, 9), (4, 2, 4), (3, 1, None)]],
                         ids=["4to3nodes", "2to4to4", "same-shape", "1to2to1"])
def test_elastic_resume_across_nodes(datasets, shapes):
    consumed, order, last = check_shapes(datasets[299], shapes, seed=1, epoch=2, shuffle=True, drop_last=False,
                                         balance="tokens")
    assert_once(consumed, order, last, False)


def test_a_resume_on_the_same_shape_continues_the_deal(datasets):
    ds = datasets[299]
    whole = [DistributedPackSampler(ds, 6, r, nodes=3, seed=4).epoch_indices().tolist() for r in range(6)]
    _, states = run_shape(ds, 6, 3, 0, None, 11, seed=4, drop_last=False, balance="tokens", shuffle=True)
    rest, _ = run_shape(ds, 6, 3, 0, states, None, seed=4, drop_last=False, balance="tokens", shuffle=True)
    assert [w[11:] for w in whole] == rest


def test_with_a_window_each_member_is_read_by_one_node(coll):
    """A collection of 10 members, window=2, 4 ranks on 2 nodes: each member is read by one node but those of the
    window the block boundary cuts (at most 2; a node pads with its own last packs)."""
    ds = index_of(coll, [(m, [1] * DOCS) for m in range(MEMBERS)])  # one document a pack, members in order
    world, nodes, k = 4, 2, 2
    groups = ds.pack_groups()
    read_by = [set() for _ in range(nodes)]
    for r in range(world):
        s = DistributedPackSampler(ds, world, r, nodes=nodes, window=k, seed=0, balance="none")
        read_by[r // (world // nodes)].update(int(g) for g in groups[s.epoch_indices()])
    shared = read_by[0] & read_by[1]
    assert len(shared) <= k, (read_by, shared)
    assert read_by[0] | read_by[1] == set(range(int(groups.max()) + 1))
    one_node = [DistributedPackSampler(ds, world, r, nodes=1, window=k, seed=0, balance="none") for r in range(world)]
    assert all(len({int(g) for g in groups[s.epoch_indices()]}) > len(read_by[0]) for s in one_node)


def test_nodes_must_divide_the_ranks(datasets):
    with pytest.raises(ValueError, match="nodes: expected an integer >= 1 that divides num_replicas"):
        DistributedPackSampler(datasets[61], 6, 0, nodes=4)


def test_nodes_default_to_the_launchers_environment(datasets, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert DistributedPackSampler(datasets[61], 8, 3).nodes == 4
    assert DistributedPackSampler(datasets[61], 4, 3).nodes == 1  # not this launcher's world: one block
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert DistributedPackSampler(datasets[61], 8, 3).nodes == 1


@pytest.mark.parametrize("edit,field", [
    (lambda s: s.update(nodes=4), "nodes"),
    (lambda s: s.update(deals=[[4, 3, 1]]), r"deals\[0\]"),
    (lambda s: s.update(deals=[[4, 2, 10**6]]), r"deals\[0\]"),
    (lambda s: s.update(deals="x"), "deals"),
    (lambda s: s.update(consumed=s["consumed"] + 1), "consumed"),
])
def test_states_with_bad_nodes_or_deals_are_refused(datasets, edit, field):
    ds = datasets[299]
    _, states = run_shape(ds, 4, 2, 0, None, 3, seed=0, drop_last=False, balance="none", shuffle=True)
    _, states = run_shape(ds, 6, 3, 0, states, 2, seed=0, drop_last=False, balance="none", shuffle=True)
    state = dict(states[0])
    assert state["deals"] == [[4, 2, 3]]
    edit(state)
    with pytest.raises(SamplerStateError, match=field):
        DistributedPackSampler(ds, 6, 0, nodes=3, seed=0, balance="none").load_state_dict(state)
