"""Pack samplers: deterministic per (seed, epoch), rank-balanced, resumable, elastic (spec/READER.md §6).

``DistributedPackSampler`` splits an epoch's global order of packs across ranks like
``torch.utils.data.DistributedSampler`` (every rank gets exactly ``len(sampler)`` packs, so every
rank runs the same number of batches and no rank hangs at the end of an epoch) and optionally
balances the tokens (or images) each rank receives. It implements torchdata's ``Stateful``
protocol: ``state_dict()`` / ``load_state_dict()`` resume mid-epoch exactly, through a plain
DataLoader (``state_dict(num_consumed=...)``) or torchdata's ``StatefulDataLoader`` with or without
workers (tests/test_torch_stateful.py), on the same or on another number of ranks: a state saved
on W ranks, loaded on W' ranks, re-deals the rest of the epoch's global order over the W' ranks
(tests/test_torch_elastic.py). The order and the deal are the pure functions of ``_deal.py``.
"""

from __future__ import annotations

import os
from typing import Any, Iterator

import numpy as np
import torch.distributed as dist
from torch.utils.data import Sampler

from ..errors import PackfmtError
from ._plan_channel import Channel, publish
from ._deal import check_nodes, deal_balanced, deal_rounds, deal_size, done_positions, epoch_order, group_runs, remaining
from ._state import STATE_KEYS, Position, SamplerStateError, check_state, lockstep_state, next_position

__all__ = ["DistributedPackSampler", "PackSampler", "SamplerStateError", "BALANCE_MODES", "lockstep_state"]

BALANCE_MODES = ("tokens", "images", "none")


class DistributedPackSampler(Sampler[int]):
    """Pack indices for one rank.

    Per epoch: the global order permutes the packs with ``default_rng([seed, epoch])`` (or keeps
    index order when ``shuffle=False``); it is padded by wrapping around to a multiple of
    ``num_replicas`` (or its tail is dropped when ``drop_last``), then dealt round by round: each
    round of ``num_replicas`` consecutive packs gives one pack to every rank. With
    ``balance="tokens"`` (or ``"images"``) the packs of a round are dealt largest first to the
    ranks with the smallest running totals, so after every round the per-rank sums differ by at
    most the largest pack's weight. An epoch resumed from a state saved on another number of
    ranks deals only what that run had not consumed (``start`` > 0; spec/READER.md §6).

    With ``window=K`` the shuffle keeps members together (for a collection streamed with
    ``stream=True``): a pack's group is the member holding its first segment's document; the
    groups are permuted and cut into windows of ``K`` groups, and each window's packs are
    permuted among themselves, so the order reads about ``K`` members at a time and each about
    once per epoch. The index's packs of each member must be consecutive (pack-ordered shards:
    ``packfmt pack COLL --capacity N --shards OUT``, or any pack index in document order).

    With ``nodes=Q`` (ranks ``r`` on node ``r // (num_replicas / Q)``, as torchrun numbers them) each node takes
    one contiguous block of the deal and deals it round by round to its own ranks, so with ``window`` every
    member is read by one node in an epoch (a streamed collection: each node fetches its share, once, into its
    own cache), except the members of the windows a block boundary cuts.

    Args:
        dataset: a ``PackedDataset`` (for its size, pack weights and fingerprint).
        num_replicas, rank: default to the initialised process group, else 1 and 0.
        shuffle, seed, drop_last: as ``DistributedSampler``.
        balance: ``"tokens"``, ``"images"`` or ``"none"`` (plain strided split).
        window: ``None`` (a permutation of all packs) or the number of groups (members) per
            window of the window shuffle (needs ``shuffle=True``).
        nodes: how many nodes the ranks run on (it divides ``num_replicas``); ``None``: ``WORLD_SIZE /
            LOCAL_WORLD_SIZE`` as torchrun sets them when ``num_replicas`` is ``WORLD_SIZE``, else 1 (one block).
    """

    STATE_KEYS = STATE_KEYS

    def __init__(self, dataset, num_replicas: int | None = None, rank: int | None = None, *, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = False, balance: str = "tokens", window: int | None = None,
                 nodes: int | None = None) -> None:
        if num_replicas is None:
            num_replicas = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        if rank is None:
            rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank: expected in [0, {num_replicas}), found {rank}")
        if balance not in BALANCE_MODES:
            raise ValueError(f"balance: expected one of {BALANCE_MODES}, found {balance!r}")
        self.num_replicas, self.rank = int(num_replicas), int(rank)
        self.nodes = _default_nodes(self.num_replicas) if nodes is None else nodes
        check_nodes(self.num_replicas, self.nodes)
        self.nodes = int(self.nodes)
        self.shuffle, self.seed, self.drop_last, self.balance = bool(shuffle), int(seed), bool(drop_last), balance
        self.num_packs = len(dataset)
        self.fingerprint = getattr(dataset, "fingerprint", None)
        self.window, self._runs = self._window_runs(dataset, window, self.shuffle)
        self._weights = self._pack_weights(dataset, balance)
        self.epoch = 0
        self._epoch_set = False  # set_epoch was called on this sampler
        self._resume: tuple[int, Position, int] | None = None  # (epoch, deal, yielded) for the next __iter__ of that epoch
        self._iter_epoch = 0     # epoch of the newest iterator
        self._iter_at = Position()  # where its deal begins
        self._yielded = 0        # indices that iterator handed out (its position in the deal)
        self._cache: tuple[tuple[int, Position], np.ndarray] | None = None  # ((epoch, deal), its assignment)
        self._channel: Channel | None = None  # where each iteration's packs are published (``plan_channel``)

    @staticmethod
    def _pack_weights(dataset, balance: str) -> np.ndarray | None:
        if balance == "none":
            return None
        w = np.asarray(dataset.pack_num_tokens() if balance == "tokens" else dataset.pack_num_images(), dtype=np.int64)
        if w.size and 0 <= w.min() and w.max() < 2**31:
            return w.astype(np.int32)  # what the deal gathers every epoch: 4 bytes a pack (10^8 packs: 0.4 GB less twice)
        return w

    @staticmethod
    def _window_runs(dataset, window, shuffle: bool) -> tuple[int | None, np.ndarray | None]:
        """(window, the group run of every pack) of a window shuffle; (None, None) without one."""
        if window is None:
            return None, None
        if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1:
            raise ValueError(f"window: expected None or an integer >= 1 (members per window), found {window!r}")
        if not shuffle:
            raise ValueError("window: a window shuffle needs shuffle=True (without shuffle the order is the "
                             "index's own pack order); pass shuffle=True, or leave window=None")
        runs, split = group_runs(dataset.pack_groups())
        if split >= 0:
            index = getattr(dataset, "index", None)
            where = str(index.path) if index is not None else "the pack index"
            raise PackfmtError(
                f"{where}: packs of one member: expected consecutive (window={window} shuffles whole members), "
                f"found pack {split} in member {int(dataset.pack_groups()[split])} after packs of other members; "
                f"write pack-ordered shards (`packfmt pack COLL --capacity N --shards OUT`) and read their index, "
                f"or shuffle without window (window=None)",
                file=where, field="window", expected="each member's packs consecutive",
                found=f"pack {split} apart from its member's earlier packs")
        return int(window), runs

    # ------------------------------------------------------------------ sizes
    @property
    def total_size(self) -> int:
        """Indices dealt over all ranks in the current epoch's deal (the whole epoch unless resumed elsewhere)."""
        at, _ = self._position()
        return deal_size(at.rest(self.num_packs, self.drop_last), self.num_replicas, self.drop_last)

    def __len__(self) -> int:
        return self.total_size // self.num_replicas

    def set_epoch(self, epoch: int) -> None:
        """Select the permutation of ``epoch`` (call before iterating, as with DistributedSampler).

        A position loaded by ``load_state_dict`` is kept for its own epoch only: selecting
        another epoch makes the next iteration start at that epoch's beginning.
        """
        self.epoch = int(epoch)
        self._epoch_set = True

    # ------------------------------------------------------------------ order
    def epoch_indices(self, epoch: int | None = None, start: int | Position = 0) -> np.ndarray:
        """int64 ``(len,)``: this rank's packs for ``epoch``, in order, dealt from ``start`` (a global position, or
        the ``Position`` of a resumed deal)."""
        return self.assignment(epoch, start)[:, self.rank]

    def pending_indices(self) -> np.ndarray:
        """int64: the packs the next ``iter(self)`` yields, in order: this rank's share of the current epoch from the
        position ``load_state_dict`` loaded (a resume, on this or another number of ranks), else the whole epoch.
        What a streamed dataset's prefetch should plan after a resume: ``prefetch(ds, sampler.pending_indices(),
        batch_size=B)`` (``epoch_indices()`` is the whole epoch, which the resumed loop does not read from its start)."""
        at, yielded = Position(), 0
        if self._resume is not None and self._resume[0] == self.epoch:
            _, at, yielded = self._resume
        return self.epoch_indices(start=at)[yielded:]

    def assignment(self, epoch: int | None = None, start: int | Position = 0) -> np.ndarray:
        """int64 ``(rounds, num_replicas)``: column r holds rank r's packs for ``epoch``.

        ``start``: where the deal begins: a global position (0: the whole epoch; a resume on another number of
        ranks deals from the position the saved run had reached) or a ``Position`` (a prefix and earlier deals).
        """
        epoch = self.epoch if epoch is None else int(epoch)
        at = start if isinstance(start, Position) else Position(int(start))
        if not 0 <= at.start <= self.num_packs:
            raise ValueError(f"start: expected in [0, {self.num_packs}] (a position of the epoch's order), found "
                             f"{at.start}")
        if self._cache is not None and self._cache[0] == (epoch, at):
            return self._cache[1]  # (prefetch(ds, sampler.epoch_indices()) and iter(sampler): one order, made once)
        order = epoch_order(self.num_packs, self.seed, epoch, self.shuffle, self.window, self._runs)
        seq = remaining(order, at.start, at.deals, self.drop_last)
        out = deal_rounds(seq, order, self.num_replicas, self.drop_last, self.nodes)
        per_node = self.num_replicas // self.nodes
        if self._weights is not None and per_node > 1:  # balanced among the ranks of each node
            for q in range(0, self.num_replicas, per_node):
                block = out[:, q:q + per_node]
                out[:, q:q + per_node] = deal_balanced(block, self._weights[block])
        out.flags.writeable = False  # shared by every call for this epoch: nobody's edit reaches another's order
        self._cache = ((epoch, at), out)
        return out

    def __iter__(self) -> Iterator[int]:
        """This rank's packs of ``self.epoch``, from the loaded position if one is pending for it.

        The start is fixed when ``iter()`` is called (not at the first ``next()``), and a
        loaded position serves one iterator only: after a finished epoch the next one starts at 0.
        """
        at, yielded = Position(), 0
        if self._resume is not None and self._resume[0] == self.epoch:
            _, at, yielded = self._resume
        self._resume = None
        indices = self.epoch_indices(start=at)
        self._iter_epoch, self._iter_at, self._yielded = self.epoch, at, yielded
        if self._channel is not None:  # what this iteration yields, for the processes that read it (``prefetch``)
            publish(self._channel.path, indices[yielded:])
        return self._iterate(indices, yielded)

    def plan_channel(self) -> Channel:
        """Where every ``iter(self)`` from now on publishes the packs it yields (``packfmt.torch.prefetch``)."""
        if self._channel is None:
            self._channel = Channel()
        return self._channel

    def _iterate(self, indices: np.ndarray, start: int) -> Iterator[int]:
        for j in range(start, indices.shape[0]):
            self._yielded = j + 1  # set before the yield: a state taken now counts this index
            yield int(indices[j])

    # ------------------------------------------------------------------ torchdata Stateful protocol
    def state_dict(self, num_consumed: int | None = None) -> dict[str, Any]:
        """Position in the current epoch.

        Args:
            num_consumed: indices actually consumed in this epoch's deal. A plain DataLoader
                pulls indices ahead of the training loop (prefetch), so pass the number of
                samples the loop has consumed. torchdata's StatefulDataLoader needs no argument:
                it calls ``state_dict()`` right after drawing each batch's indices and keeps the
                snapshot that matches the batch the loop last received.
        Returns:
            ``{epoch, start, deals, yielded, consumed, nodes, ...}`` (spec/READER.md §6): the deal of ``epoch``
            began after the order's first ``start`` packs and the epoch's earlier ``deals``, every rank took
            ``yielded`` of its packs, so ``consumed`` positions of the epoch's global order are done.
        """
        at, yielded = self._position()
        if num_consumed is not None:
            yielded = int(num_consumed)
        if not 0 <= yielded <= len(self):
            raise ValueError(f"num_consumed: expected in [0, {len(self)}], found {yielded}")
        rest = at.rest(self.num_packs, self.drop_last)
        return {"epoch": self.epoch, "start": at.start, "deals": [list(d) for d in at.deals], "yielded": yielded,
                "consumed": done_positions(self.num_packs, rest, yielded, self.num_replicas, self.drop_last,
                                           self.nodes),
                "seed": self.seed, "shuffle": self.shuffle, "window": self.window, "drop_last": self.drop_last,
                "balance": self.balance, "num_replicas": self.num_replicas, "nodes": self.nodes, "rank": self.rank,
                "num_packs": self.num_packs, "fingerprint": self.fingerprint}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the next ``__iter__`` of the saved epoch yields this rank's share of what is left.

        Saved on as many ranks and nodes as this sampler has: the same deal continues after ``yielded``
        (exactly the packs the uninterrupted run would have yielded). Saved on another number
        of ranks or nodes (any rank's state; ranks consume in lockstep): the packs of the epoch's
        order not yet consumed are dealt anew over this sampler's ranks and nodes.

        Strict: raises ``SamplerStateError`` if the state belongs to another dataset, pack index
        or sampler configuration, or its positions do not add up. A mid-epoch state also selects
        its epoch (no ``set_epoch`` needed). A state saved at the end of its epoch leaves an epoch
        chosen by an earlier ``set_epoch`` in place, so a training loop that calls
        ``set_epoch(e + 1)`` and then restores a StatefulDataLoader checkpoint taken after epoch
        ``e`` runs epoch ``e + 1`` in full; if that is still epoch ``e``, it yields nothing more.
        """
        epoch, at, yielded, replicas, nodes, done = check_state(self, state)
        if (replicas, nodes) == (self.num_replicas, self.nodes):
            self._resume = (epoch, at, yielded)  # continue the saved deal
        else:  # deal the rest of the epoch anew
            self._resume = (epoch, next_position(at, self.num_packs, replicas, nodes, yielded, self.drop_last), 0)
        if done < self.num_packs or not self._epoch_set:
            self.epoch = epoch
        # else: the saved epoch is complete, and set_epoch already chose the epoch that comes next
        # (StatefulDataLoader loads the state inside iter(loader), after the loop's set_epoch).

    def _position(self) -> tuple[Position, int]:
        """(where ``self.epoch``'s deal begins, how many of its indices are handed out)."""
        if self._resume is not None and self._resume[0] == self.epoch:
            return self._resume[1], self._resume[2]
        if self._iter_epoch == self.epoch:
            return self._iter_at, self._yielded
        return Position(), 0


def _default_nodes(num_replicas: int) -> int:
    """Nodes the ranks run on, as torchrun (and most launchers) set the environment: ``WORLD_SIZE /
    LOCAL_WORLD_SIZE`` when ``num_replicas`` is ``WORLD_SIZE`` and the division is exact; else 1."""
    try:
        world, local = int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_WORLD_SIZE"])
    except (KeyError, ValueError):
        return 1
    return world // local if world == num_replicas and local >= 1 and world % local == 0 else 1


class PackSampler(DistributedPackSampler):
    """Single-process ``DistributedPackSampler`` (``num_replicas=1``): a seeded, resumable shuffle."""

    def __init__(self, dataset, *, shuffle: bool = True, seed: int = 0, window: int | None = None) -> None:
        super().__init__(dataset, 1, 0, shuffle=shuffle, seed=seed, drop_last=False, balance="none", window=window)
