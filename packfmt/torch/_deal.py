"""An epoch's global order of packs and its deal over ranks (spec/READER.md §6).

Pure functions of (number of packs, seed, epoch, shuffle, start, world size, drop_last): the
sampler deals with them, and its state checks recompute positions with them, so the rule is
written once.

- The *global order* of epoch ``e`` is ``default_rng([seed, e]).permutation(N)`` (``arange(N)``
  without shuffle); it does not depend on the world size.
- A *deal* over ``R`` ranks begins at a global position ``start`` (0, unless the epoch was
  resumed with another world size) and covers ``order[start:]``: cut to a multiple of ``R``
  with ``drop_last``, else padded to one with the first packs of the epoch's order
  (``order[0], order[1], ...``, cyclically), then cut into rounds of ``R`` consecutive packs.
"""

from __future__ import annotations

import numpy as np

__all__ = ["epoch_order", "deal_size", "deal_rounds", "deal_balanced", "done_positions"]


def epoch_order(num_packs: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """int64 ``(num_packs,)``: the epoch's global order of packs."""
    if shuffle:
        return np.random.default_rng([seed, epoch]).permutation(num_packs).astype(np.int64, copy=False)
    return np.arange(num_packs, dtype=np.int64)


def deal_size(num_packs: int, start: int, num_replicas: int, drop_last: bool) -> int:
    """Indices a deal beginning at ``start`` hands out over all ranks (a multiple of ``num_replicas``)."""
    rest, r = num_packs - start, num_replicas
    return (rest // r) * r if drop_last else -(-rest // r) * r


def deal_rounds(order: np.ndarray, start: int, num_replicas: int, drop_last: bool) -> np.ndarray:
    """int64 ``(rounds, num_replicas)``: the deal of ``order[start:]`` in rounds (before any balancing)."""
    size = deal_size(order.shape[0], start, num_replicas, drop_last)
    seq = order[start:start + size]
    if size > seq.shape[0]:  # the padding: the epoch's first packs, cyclically
        seq = np.concatenate([seq, np.resize(order, size - seq.shape[0])])
    return seq.reshape(-1, num_replicas)


def done_positions(num_packs: int, start: int, yielded: int, num_replicas: int, drop_last: bool) -> int:
    """Positions of the global order done after every rank took ``yielded`` packs of a deal at ``start``.

    A finished deal finishes the epoch (its padding repeats, its dropped tail is dropped): ``num_packs``.
    Before that every round holds ``num_replicas`` packs of the order: ``start + yielded * num_replicas``.
    """
    if yielded * num_replicas >= deal_size(num_packs, start, num_replicas, drop_last):
        return num_packs
    return start + yielded * num_replicas


def deal_balanced(rounds: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Deal each round's packs, heaviest first, to the ranks with the lightest running totals.

    Args:
        rounds, weights: int64 ``(num_rounds, R)``: pack ids and their weights.
    Returns:
        int64 ``(num_rounds, R)``: column r = rank r's packs, one per round, in round order.
    """
    by_weight = np.argsort(-weights, axis=1, kind="stable")
    packs = np.take_along_axis(rounds, by_weight, axis=1)
    w = np.take_along_axis(weights, by_weight, axis=1)
    out = np.empty_like(rounds)
    totals = np.zeros(rounds.shape[1], dtype=np.int64)
    for j in range(rounds.shape[0]):  # one small argsort per round; done once per epoch
        lightest = np.argsort(totals, kind="stable")
        out[j, lightest] = packs[j]
        totals[lightest] += w[j]
    return out
