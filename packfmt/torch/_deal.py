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
- A *deal* over ``R`` ranks on ``Q`` nodes (``L = R / Q`` ranks a node; rank ``r`` on node ``r // L``) covers a
  sequence of the order's packs: ``order[start:]`` for the epoch's first deal (``start`` 0, unless the epoch was
  resumed with another world size), less what each earlier deal of the epoch consumed (``remaining``), ``t``
  packs a rank. Each node takes one consecutive part of the sequence (``node_parts``; with ``drop_last`` the
  last ``len mod R`` are dropped), padded to ``L * t`` entries (one node: with the epoch's first packs, as in
  READER 1.0-1.5; several: with the node's own last packs), and deals it in rounds of ``L``, one entry to each
  of its ranks. With ``Q = 1`` that is rounds of ``R`` consecutive entries of the padded sequence.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["epoch_order", "window_order", "group_runs", "deal_size", "deal_rounds", "deal_balanced", "done_positions",
           "node_parts", "consumed_mask", "consumed_count", "remaining", "rest_after", "check_nodes"]


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


def check_nodes(num_replicas: int, nodes: int) -> None:
    """``nodes`` divides ``num_replicas`` (every node the same number of ranks), else a ``ValueError`` naming both."""
    if isinstance(nodes, bool) or not isinstance(nodes, (int, np.integer)) or nodes < 1 or num_replicas % nodes:
        raise ValueError(f"nodes: expected an integer >= 1 that divides num_replicas ({num_replicas}): every node runs "
                         f"num_replicas / nodes ranks, rank r on node r // (num_replicas / nodes); found {nodes!r}")


def deal_size(rest: int, num_replicas: int, drop_last: bool) -> int:
    """Entries a deal of a sequence of ``rest`` packs hands out over all ranks (a multiple of ``num_replicas``)."""
    r = num_replicas
    return (rest // r) * r if drop_last else -(-rest // r) * r


def node_parts(rest: int, num_replicas: int, nodes: int, drop_last: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(begin, size)``: the part of a deal's sequence of ``rest`` packs each node takes, as positions of it.

    With ``drop_last`` node ``q`` takes ``[q * L * t, (q + 1) * L * t)`` (the last ``rest mod R`` are dropped);
    otherwise the sequence is cut into ``nodes`` consecutive parts of ``floor(rest / nodes)`` packs, the first
    ``rest mod nodes`` of them one more, each then padded to ``L * t`` entries (at most ``L``: its last round)."""
    q = np.arange(nodes, dtype=np.int64)
    t = deal_size(rest, num_replicas, drop_last) // num_replicas
    if drop_last:
        size = num_replicas // nodes * t
        return q * size, np.full(nodes, size, dtype=np.int64)
    size = rest // nodes + (q < rest % nodes)
    return np.concatenate([[0], np.cumsum(size)[:-1]]).astype(np.int64), size


def deal_rounds(seq: np.ndarray, order: np.ndarray, num_replicas: int, drop_last: bool, nodes: int = 1) -> np.ndarray:
    """int64 ``(t, num_replicas)``: the deal of ``seq`` (before any balancing): column ``r`` holds rank ``r``'s packs.

    Node ``q`` takes its part of ``seq`` (``node_parts``), padded to ``L * t`` entries (``L = num_replicas //
    nodes``), in rounds of ``L``: entry ``l`` of each round to rank ``q * L + l``. The padding: on one node the
    epoch's first packs, ``order[0], order[1], ...`` cyclically (READER 1.0-1.5); on several, the node's own last
    packs again (what it read last, still in its cache), or the epoch's first packs for a node with no part."""
    size = deal_size(seq.shape[0], num_replicas, drop_last)
    t, per_node = size // num_replicas, num_replicas // nodes
    if nodes == 1:
        entries = seq[:size]
        if size > entries.shape[0]:  # the padding: the epoch's first packs, cyclically
            entries = np.concatenate([entries, np.resize(order, size - entries.shape[0])])
        return np.ascontiguousarray(entries.reshape(t, num_replicas))
    blocks = np.empty((nodes, per_node * t), dtype=np.int64)
    for q, (begin, real) in enumerate(zip(*node_parts(seq.shape[0], num_replicas, nodes, drop_last))):
        part = seq[begin:begin + real]
        blocks[q, :real] = part
        pad = per_node * t - real
        if pad:
            blocks[q, real:] = part[(real - pad + np.arange(pad)) % real] if real else np.resize(order, pad)
    return np.ascontiguousarray(blocks.reshape(nodes, t, per_node).transpose(1, 0, 2).reshape(t, num_replicas))


def consumed_mask(rest: int, num_replicas: int, nodes: int, yielded: int, drop_last: bool) -> np.ndarray:
    """bool ``(rest,)``: the positions of a deal's sequence of ``rest`` packs consumed once every rank took
    ``yielded`` packs of it: the first ``yielded * L`` of each node's part (no padding is dealt before a node's last
    round); all of them once the deal is done (its padding is then dealt, or its dropped tail dropped: a finished
    deal finishes the epoch)."""
    t = deal_size(rest, num_replicas, drop_last) // num_replicas
    if yielded >= t:
        return np.ones(rest, dtype=bool)
    mask = np.zeros(rest, dtype=bool)
    for begin in node_parts(rest, num_replicas, nodes, drop_last)[0].tolist():
        mask[begin:begin + yielded * (num_replicas // nodes)] = True
    return mask


def remaining(order: np.ndarray, start: int, deals, drop_last: bool) -> np.ndarray:
    """The sequence the next deal of an epoch covers: ``order[start:]`` less what each of ``deals`` (the epoch's
    earlier deals, ``(num_replicas, nodes, yielded)`` in turn, each over what the ones before left) consumed; the
    packs keep their order."""
    seq = order[start:]
    for num_replicas, nodes, yielded in deals:
        seq = seq[~consumed_mask(seq.shape[0], num_replicas, nodes, yielded, drop_last)]
    return seq


def consumed_count(rest: int, num_replicas: int, nodes: int, yielded: int, drop_last: bool) -> int:
    """How many positions ``consumed_mask`` marks, without making it (a deal's length, ``len(sampler)``, stays O(nodes))."""
    t = deal_size(rest, num_replicas, drop_last) // num_replicas
    if yielded >= t:
        return rest
    return int(np.minimum(node_parts(rest, num_replicas, nodes, drop_last)[1], yielded * (num_replicas // nodes)).sum())


def rest_after(num_packs: int, start: int, deals, drop_last: bool) -> int:
    """``len(remaining(...))``, counted: the packs of the epoch that ``start`` and ``deals`` leave to the next deal."""
    rest = num_packs - start
    for num_replicas, nodes, yielded in deals:
        rest -= consumed_count(rest, num_replicas, nodes, yielded, drop_last)
    return rest


def done_positions(num_packs: int, rest: int, yielded: int, num_replicas: int, drop_last: bool,
                   nodes: int = 1) -> int:
    """Positions of the epoch's order done once every rank took ``yielded`` packs of a deal of ``rest`` packs: the
    ``num_packs - rest`` the earlier deals consumed, plus this deal's consumed entries that are not padding;
    ``num_packs`` once the deal is done."""
    if yielded >= deal_size(rest, num_replicas, drop_last) // num_replicas:
        return num_packs
    return num_packs - rest + consumed_count(rest, num_replicas, nodes, yielded, drop_last)


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
