"""An epoch's global order of packs and its deal over ranks (spec/READER.md §6).

Pure functions of (number of packs, seed, epoch, shuffle, window, start, world size, drop_last):
the sampler deals with them, and its state checks recompute positions with them, so the rule is
written once.

- The *global order* of epoch ``e`` is ``default_rng([seed, e]).permutation(N)`` (``arange(N)``
  without shuffle); it does not depend on the world size.
- With a *window* of ``K`` groups (``window_order``; a pack's group is the member holding its first
  segment's document, and each group's packs are consecutive: ``group_runs``), the same generator
  first permutes the ``G`` groups, cut into windows of ``K`` consecutive groups, then draws a sort
  key ``permutation(N)`` for every pack: the order lists the packs by (window, key). A streamed
  collection so reads about ``K`` members at a time, each about once per epoch.
- A *deal* over ``R`` ranks begins at a global position ``start`` (0, unless the epoch was
  resumed with another world size) and covers ``order[start:]``: cut to a multiple of ``R``
  with ``drop_last``, else padded to one with the first packs of the epoch's order
  (``order[0], order[1], ...``, cyclically), then cut into rounds of ``R`` consecutive packs.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["epoch_order", "window_order", "group_runs", "deal_size", "deal_rounds", "deal_balanced", "done_positions"]


def epoch_order(num_packs: int, seed: int, epoch: int, shuffle: bool, window: int | None = None,
                runs: np.ndarray | None = None) -> np.ndarray:
    """int64 ``(num_packs,)``: the epoch's global order of packs.

    ``window`` (with ``shuffle``): the window shuffle of ``window_order`` over the group ``runs`` of
    ``group_runs``; None: a permutation of all packs.
    """
    if shuffle and window is not None:
        return window_order(runs, seed, epoch, window)
    if shuffle:
        return np.random.default_rng([seed, epoch]).permutation(num_packs).astype(np.int64, copy=False)
    return np.arange(num_packs, dtype=np.int64)


def group_runs(groups: np.ndarray) -> tuple[np.ndarray, int]:
    """The runs of equal consecutive ``groups`` (int ``(N,)``: each pack's group, in pack order).

    Returns:
        runs: int64 ``(N,)``: the run of every pack, ``0 .. G-1`` in pack order;
        split: the first pack that starts a run of a group an earlier run already holds (its
            group's packs are not consecutive, and a window cannot hold the group whole), else -1.
    """
    groups = np.asarray(groups, dtype=np.int64).reshape(-1)
    n = groups.shape[0]
    if n and 0 <= groups.min() and groups.max() < max(4 * n, 1 << 20):  # member ids: one pass, a seen-bit per id
        runs = np.empty(n, dtype=np.int32 if n < 2**31 else np.int64)  # (the run count is at most n)
        return runs, int(_runs_of(groups, int(groups.max()) + 1, runs))
    change = np.ones(groups.shape[0], dtype=bool)
    change[1:] = groups[1:] != groups[:-1]
    runs = np.cumsum(change, dtype=np.int64) - 1
    firsts = np.flatnonzero(change)
    _, seen_first = np.unique(groups[firsts], return_index=True)
    repeated = np.setdiff1d(np.arange(firsts.shape[0]), seen_first)  # ascending
    return runs, int(firsts[repeated[0]]) if repeated.size else -1


@njit(cache=True, nogil=True)
def _runs_of(groups, n_ids, runs):  # pragma: no cover - numba
    """``runs`` filled (the run of every pack); returns the first pack that starts a run of a group seen before, or
    -1 (``group_runs``'s two results, in one pass over ``groups``, all ``>= 0`` and ``< n_ids``)."""
    seen = np.zeros(n_ids, dtype=np.bool_)
    split, r = -1, -1
    for p in range(groups.shape[0]):
        g = groups[p]
        if p == 0 or g != groups[p - 1]:
            r += 1
            if seen[g] and split < 0:
                split = p
            seen[g] = True
        runs[p] = r
    return split


def window_order(runs: np.ndarray, seed: int, epoch: int, window: int) -> np.ndarray:
    """int64 ``(N,)``: the window shuffle of epoch ``epoch`` (spec/READER.md §6, "Window order").

    ``runs`` (from ``group_runs``): the group of every pack, ``0 .. G-1`` in pack order, each
    group's packs consecutive. With ``rng = default_rng([seed, epoch])``: ``g = rng.permutation(G)``
    puts group ``g[i]`` in window ``i // window``; ``key = rng.permutation(N)``; the order lists
    the packs by window, then by key.
    """
    runs = np.asarray(runs).reshape(-1)
    if runs.dtype.kind not in "iu":
        runs = runs.astype(np.int64)
    if window < 1:
        raise ValueError(f"window: expected an integer >= 1 (groups per window), found {window!r}")
    n = runs.shape[0]
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    num_groups = int(runs[-1]) + 1
    rng = np.random.default_rng([seed, epoch])
    n_windows = (num_groups - 1) // window + 1
    small = np.int32 if max(n, n_windows) < 2**31 else np.int64  # the kernel's arrays: 4 bytes a pack, not 8
    of_group = np.empty(num_groups, dtype=small)
    of_group[rng.permutation(num_groups)] = np.arange(num_groups, dtype=np.int64) // window
    key = rng.permutation(n)
    return _by_window_then_key(np.asarray(key, dtype=np.int64), of_group[runs], n_windows, np.zeros((0, 2), small))


@njit(cache=True, nogil=True)
def _by_window_then_key(key, win, n_windows, like):  # pragma: no cover - numba
    """``np.lexsort((key, win))`` for ``key`` a permutation of ``0 .. n-1``, in O(n): every pack's (window, id)
    written at its key (one random write a pack), then read in key order and placed stably into its window's slots
    (a counting sort; lexsort takes tens of seconds at 10^8 packs). ``like``: the dtype of the pairs."""
    n = key.shape[0]
    pairs = np.empty((n, 2), dtype=like.dtype)
    slot = np.zeros(n_windows + 1, dtype=np.int64)
    for i in range(n):
        pairs[key[i], 0] = win[i]
        pairs[key[i], 1] = i
        slot[win[i] + 1] += 1
    for w in range(n_windows):
        slot[w + 1] += slot[w]
    out = np.empty(n, dtype=np.int64)
    for j in range(n):
        w = pairs[j, 0]
        out[slot[w]] = pairs[j, 1]
        slot[w] += 1
    return out


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
    rounds = np.ascontiguousarray(rounds, dtype=np.int64)
    weights = np.ascontiguousarray(weights if weights.dtype in (np.int32, np.int64) else weights.astype(np.int64))
    if rounds.shape[1] > 32:
        by_weight = np.argsort(-weights, axis=1, kind="stable")
        return _deal_rounds_balanced(np.take_along_axis(rounds, by_weight, axis=1),
                                     np.take_along_axis(weights, by_weight, axis=1), False)
    return _deal_rounds_balanced(rounds, weights, True)


@njit(cache=True, nogil=True)
def _deal_rounds_balanced(packs, w, sort_rows):  # pragma: no cover - numba
    """Round by round, ``packs[j]`` (heaviest first: sorted here, stably, when ``sort_rows``) to the ranks ordered by
    running total, lightest first, ties by rank (stable sorts: insertion for a few ranks, merge sort for many)."""
    rounds, r = packs.shape
    out = np.empty_like(packs)
    totals = np.zeros(r, dtype=np.int64)
    lightest = np.arange(r)
    heaviest = np.arange(r)
    row_p = np.empty(r, dtype=np.int64)
    row_w = np.empty(r, dtype=np.int64)
    for j in range(rounds):
        for a in range(r):
            heaviest[a] = a
        if sort_rows:  # stable insertion sort of the row by weight, descending (ties: column order)
            for a in range(1, r):
                x = heaviest[a]
                b = a - 1
                while b >= 0 and w[j, heaviest[b]] < w[j, x]:
                    heaviest[b + 1] = heaviest[b]
                    b -= 1
                heaviest[b + 1] = x
        for a in range(r):
            row_p[a] = packs[j, heaviest[a]]
            row_w[a] = w[j, heaviest[a]]
        if r > 32:
            lightest = np.argsort(totals, kind="mergesort")
        for a in range(1, r if r <= 32 else 0):  # stable insertion sort of the ranks by (total, rank)
            x = lightest[a]
            b = a - 1
            while b >= 0 and (totals[lightest[b]] > totals[x] or (totals[lightest[b]] == totals[x] and lightest[b] > x)):
                lightest[b + 1] = lightest[b]
                b -= 1
            lightest[b + 1] = x
        for a in range(r):
            out[j, lightest[a]] = row_p[a]
            totals[lightest[a]] += row_w[a]
    return out
