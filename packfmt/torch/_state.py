"""A sampler's saved position and the rules that load it (spec/READER.md §6, "State" and "Loading").

A position is where the current deal of an epoch begins (``Position``: a prefix ``start`` of the epoch's order and
the earlier deals of the epoch that followed it) and how many packs every rank took of it (``yielded``). Loading a
state is strict: ``check_state`` recomputes every position from the spec's rule (``_deal``) and refuses a state of
another dataset, pack index or configuration, or one whose numbers do not add up, with a ``SamplerStateError``
that names the field, the expected and the found value and the fix. ``next_position`` is the position a state
resumes at on another shape of ranks (elastic resume).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..errors import PackfmtError
from ._deal import consumed_count, deal_size, done_positions, rest_after

__all__ = ["STATE_KEYS", "Position", "SamplerStateError", "check_state", "lockstep_state", "next_position"]

# keys a state must hold; "start" and "consumed" (READER.md 1.4) may both be absent: start 0
STATE_KEYS = ("epoch", "yielded", "seed", "shuffle", "drop_last", "balance", "num_replicas", "rank",
              "num_packs", "fingerprint")
DATA_KEYS = ("fingerprint", "num_packs")                    # which dataset and pack index
CONFIG_KEYS = ("seed", "shuffle", "window", "drop_last", "balance")  # which order and deal
# keys a state may lack: the value a state of an earlier revision means (READER.md 1.0-1.4: no window)
_OPTIONAL = {"window": None}


class SamplerStateError(PackfmtError, ValueError):
    """A saved sampler state does not belong to this dataset/index or sampler configuration."""


@dataclass(frozen=True)
class Position:
    """Where a deal begins: after the order's first ``start`` packs and the epoch's earlier ``deals`` (each
    ``(num_replicas, nodes, yielded)``, over what the ones before it left)."""

    start: int = 0
    deals: tuple[tuple[int, int, int], ...] = ()

    def rest(self, num_packs: int, drop_last: bool) -> int:
        """Packs of the epoch this position leaves to the deal that begins at it."""
        return rest_after(num_packs, self.start, self.deals, drop_last)


def next_position(pos: Position, num_packs: int, num_replicas: int, nodes: int, yielded: int,
                  drop_last: bool) -> Position:
    """Where a new deal begins after every rank took ``yielded`` packs of the deal at ``pos`` over ``num_replicas``
    ranks on ``nodes`` nodes: what that deal consumed is recorded as a prefix of the order when it is one (a deal on
    one node right after a prefix: the states of READER 1.4-1.5), else as one more earlier deal."""
    rest = pos.rest(num_packs, drop_last)
    done = consumed_count(rest, num_replicas, nodes, yielded, drop_last)
    if done == 0:
        return pos
    if done == rest:
        return Position(num_packs)  # the epoch is finished
    if nodes == 1 and not pos.deals:
        return Position(pos.start + done)
    return Position(pos.start, pos.deals + ((num_replicas, nodes, yielded),))


def _state_int(state: dict[str, Any], key: str, low: int, high: int | None) -> int:
    """``state[key]`` as an int in ``[low, high]`` (no upper bound when ``high`` is None)."""
    value = state[key]
    is_int = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    if not is_int or value < low or (high is not None and value > high):
        raise SamplerStateError(field=key, expected=f"an integer in [{low}, {'inf' if high is None else high}]",
                                found=repr(value))
    return int(value)


def _deals(state: dict[str, Any], num_packs: int, start: int, drop_last: bool) -> tuple[tuple[int, int, int], ...]:
    """``state["deals"]`` (absent: none, READER 1.0-1.5) as checked triples: each ``[num_replicas, nodes, yielded]``
    with ``nodes`` dividing ``num_replicas`` and ``yielded`` within that deal's length."""
    raw = state.get("deals", [])
    if not isinstance(raw, (list, tuple)):
        raise SamplerStateError(field="deals", expected="a list of [num_replicas, nodes, yielded]", found=repr(raw))
    out, rest = [], num_packs - start
    for i, d in enumerate(raw):
        ok = isinstance(d, (list, tuple)) and len(d) == 3 and all(
            isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in d)
        if ok:
            r, q, y = (int(v) for v in d)
            ok = r >= 1 and q >= 1 and r % q == 0 and 0 <= y <= deal_size(rest, r, drop_last) // r
        if not ok:
            raise SamplerStateError(field=f"deals[{i}]", expected="[num_replicas >= 1, nodes dividing it, yielded "
                                    "within that deal]", found=repr(d))
        out.append((r, q, y))
        rest -= consumed_count(rest, r, q, y, drop_last)
    return tuple(out)


def check_state(sampler, state: dict[str, Any]) -> tuple[int, Position, int, int, int, int]:
    """``(epoch, position, yielded, num_replicas, nodes, consumed)`` of a state that belongs to ``sampler``, or a
    ``SamplerStateError`` (READER §6, "Loading")."""
    missing = [k for k in STATE_KEYS if k not in state]
    if ("start" in state) != ("consumed" in state):
        missing.append("consumed" if "start" in state else "start")
    if missing:
        raise SamplerStateError(field=f"state[{missing[0]!r}]", expected="present", found="missing")
    for key in DATA_KEYS + CONFIG_KEYS:
        saved = state.get(key, _OPTIONAL.get(key))
        if saved != getattr(sampler, key):
            fix = ("the state belongs to another pack index or dataset: build the sampler on the dataset and "
                   "index the checkpoint was saved with, or start this run without loading the state"
                   if key in DATA_KEYS else
                   f"the state belongs to another sampler configuration: construct the sampler with "
                   f"{key}={saved!r}")
            raise SamplerStateError(
                f"sampler state: {key}: expected {getattr(sampler, key)!r} (this sampler), found {saved!r} "
                f"(saved); {fix}", field=key, expected=getattr(sampler, key), found=saved)
    n, drop_last = sampler.num_packs, sampler.drop_last
    replicas = _state_int(state, "num_replicas", 1, None)
    _state_int(state, "rank", 0, replicas - 1)
    nodes = _state_int(state, "nodes", 1, replicas) if "nodes" in state else 1
    if replicas % nodes:
        raise SamplerStateError(field="nodes", expected=f"a divisor of num_replicas ({replicas})", found=nodes)
    epoch = _state_int(state, "epoch", 0, None)
    start = _state_int(state, "start", 0, n) if "start" in state else 0
    pos = Position(start, _deals(state, n, start, drop_last))
    rest = pos.rest(n, drop_last)
    length = deal_size(rest, replicas, drop_last) // replicas
    yielded = _state_int(state, "yielded", 0, length)
    done = done_positions(n, rest, yielded, replicas, drop_last, nodes)
    if "consumed" in state and state["consumed"] != done:
        raise SamplerStateError(
            f"sampler state: consumed: expected {done} (the positions of the epoch's order that start {start}, "
            f"the earlier deals {list(map(list, pos.deals))} and yielded {yielded} on num_replicas {replicas} and "
            f"nodes {nodes} consumed, or num_packs once the deal is done), found {state['consumed']!r}; the state "
            f"was edited or written by another program: load a state that state_dict() wrote",
            field="consumed", expected=done, found=state["consumed"])
    return epoch, pos, yielded, replicas, nodes, done


def lockstep_state(states: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The one position that the sampler states of every rank of a run, saved at one step, describe.

    Ranks consume in lockstep, so any rank's state lets a run on any number of ranks resume;
    this checks that assumption on a checkpoint that kept every rank's state (ranks
    ``0 .. num_replicas-1``, each once, at one epoch and one position) and returns one of them
    to load. Raises ``SamplerStateError`` naming the first disagreement.
    """
    states = list(states)
    if not states:
        raise SamplerStateError(field="states", expected="the sampler state of every rank", found="none")
    first = states[0]
    for s in states:
        for k in STATE_KEYS + ("start", "consumed", "window", "nodes", "deals"):
            if k != "rank" and s.get(k) != first.get(k):
                raise SamplerStateError(
                    f"sampler states: {k}: rank {first.get('rank')!r} saved {first.get(k)!r}, rank {s.get('rank')!r} "
                    f"saved {s.get(k)!r}; ranks consume in lockstep, so these states come from different steps or "
                    f"runs: load the states that one checkpoint step saved",
                    field=k, expected=first.get(k), found=s.get(k))
    ranks = sorted(s.get("rank") for s in states)
    if ranks != list(range(first["num_replicas"])):
        raise SamplerStateError(field="rank", expected=f"each of 0..{first['num_replicas'] - 1} once", found=ranks)
    return dict(first)
