"""Pack samplers: deterministic per (seed, epoch), rank-balanced, resumable (spec/READER.md §6).

``DistributedPackSampler`` splits an epoch's permutation of packs across ranks like
``torch.utils.data.DistributedSampler`` (every rank gets exactly ``len(sampler)`` packs, so every
rank runs the same number of batches and no rank hangs at the end of an epoch) and optionally
balances the tokens (or images) each rank receives. It implements torchdata's ``Stateful``
protocol: ``state_dict()`` / ``load_state_dict()`` resume mid-epoch exactly, through a plain
DataLoader (``state_dict(num_consumed=...)``) or torchdata's ``StatefulDataLoader`` with or without
workers (tests/test_torch_stateful.py).
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import torch.distributed as dist
from torch.utils.data import Sampler

from ..errors import PackfmtError

__all__ = ["DistributedPackSampler", "PackSampler", "SamplerStateError", "BALANCE_MODES"]

BALANCE_MODES = ("tokens", "images", "none")


class SamplerStateError(PackfmtError, ValueError):
    """A saved sampler state does not belong to this dataset/index or sampler configuration."""


class DistributedPackSampler(Sampler[int]):
    """Pack indices for one rank.

    Per epoch: permute the packs with ``default_rng([seed, epoch])`` (or keep index order when
    ``shuffle=False``), pad by wrapping around to a multiple of ``num_replicas`` (or drop the
    tail when ``drop_last``), then deal round by round: each round of ``num_replicas``
    consecutive packs gives one pack to every rank. With ``balance="tokens"`` (or ``"images"``)
    the packs of a round are dealt largest first to the ranks with the smallest running totals,
    so after every round the per-rank sums differ by at most the largest pack's weight.

    Args:
        dataset: a ``PackedDataset`` (for its size, pack weights and fingerprint).
        num_replicas, rank: default to the initialised process group, else 1 and 0.
        shuffle, seed, drop_last: as ``DistributedSampler``.
        balance: ``"tokens"``, ``"images"`` or ``"none"`` (plain strided split).
    """

    STATE_KEYS = ("epoch", "yielded", "seed", "shuffle", "drop_last", "balance", "num_replicas", "rank",
                  "num_packs", "fingerprint")

    def __init__(self, dataset, num_replicas: int | None = None, rank: int | None = None, *, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = False, balance: str = "tokens") -> None:
        if num_replicas is None:
            num_replicas = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        if rank is None:
            rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank: expected in [0, {num_replicas}), found {rank}")
        if balance not in BALANCE_MODES:
            raise ValueError(f"balance: expected one of {BALANCE_MODES}, found {balance!r}")
        self.num_replicas, self.rank = int(num_replicas), int(rank)
        self.shuffle, self.seed, self.drop_last, self.balance = bool(shuffle), int(seed), bool(drop_last), balance
        self.num_packs = len(dataset)
        self.fingerprint = getattr(dataset, "fingerprint", None)
        self._weights = self._pack_weights(dataset, balance)
        self.epoch = 0
        self._epoch_set = False  # set_epoch was called on this sampler
        self._resume: tuple[int, int] | None = None  # (epoch, position) for the next __iter__ of that epoch
        self._iter_epoch = 0     # epoch of the newest iterator
        self._yielded = 0        # indices that iterator handed out (its position in the epoch)
        self._cache: tuple[int, np.ndarray] | None = None  # (epoch, assignment): one int64 array

    @staticmethod
    def _pack_weights(dataset, balance: str) -> np.ndarray | None:
        if balance == "tokens":
            return np.asarray(dataset.pack_num_tokens(), dtype=np.int64)
        if balance == "images":
            return np.asarray(dataset.pack_num_images(), dtype=np.int64)
        return None

    # ------------------------------------------------------------------ sizes
    @property
    def total_size(self) -> int:
        """Indices dealt over all ranks in one epoch."""
        R, N = self.num_replicas, self.num_packs
        return (N // R) * R if self.drop_last else -(-N // R) * R

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
    def epoch_indices(self, epoch: int | None = None) -> np.ndarray:
        """int64 ``(total_size / num_replicas,)``: this rank's packs for ``epoch``, in order."""
        return self.assignment(epoch)[:, self.rank]

    def assignment(self, epoch: int | None = None) -> np.ndarray:
        """int64 ``(rounds, num_replicas)``: column r holds rank r's packs for ``epoch``."""
        epoch = self.epoch if epoch is None else int(epoch)
        N, R = self.num_packs, self.num_replicas
        order = np.random.default_rng([self.seed, epoch]).permutation(N) if self.shuffle else np.arange(N, dtype=np.int64)
        order = np.resize(order, self.total_size) if self.total_size > N else order[: self.total_size]
        rounds = order.reshape(-1, R)
        if self._weights is None or R == 1:
            return rounds
        if self._cache is not None and self._cache[0] == epoch:
            return self._cache[1]
        out = _deal_balanced(rounds, self._weights[rounds])
        self._cache = (epoch, out)
        return out

    def __iter__(self) -> Iterator[int]:
        """This rank's packs of ``self.epoch``, from the loaded position if one is pending for it.

        The start is fixed when ``iter()`` is called (not at the first ``next()``), and a
        loaded position serves one iterator only: after a finished epoch the next one starts at 0.
        """
        indices = self.epoch_indices()
        start = 0
        if self._resume is not None and self._resume[0] == self.epoch:
            start = self._resume[1]
        self._resume = None
        self._iter_epoch, self._yielded = self.epoch, start
        return self._iterate(indices, start)

    def _iterate(self, indices: np.ndarray, start: int) -> Iterator[int]:
        for j in range(start, indices.shape[0]):
            self._yielded = j + 1  # set before the yield: a state taken now counts this index
            yield int(indices[j])

    # ------------------------------------------------------------------ torchdata Stateful protocol
    def state_dict(self, num_consumed: int | None = None) -> dict[str, Any]:
        """Position in the current epoch.

        Args:
            num_consumed: indices actually consumed in this epoch. A plain DataLoader pulls
                indices ahead of the training loop (prefetch), so pass the number of samples the
                loop has consumed. torchdata's StatefulDataLoader needs no argument: it calls
                ``state_dict()`` right after drawing each batch's indices and keeps the snapshot
                that matches the batch the loop last received.
        Returns:
            ``{epoch, yielded, ...}`` (spec/READER.md §6): ``yielded`` indices of ``epoch`` are done.
        """
        yielded = self._position() if num_consumed is None else int(num_consumed)
        if not 0 <= yielded <= len(self):
            raise ValueError(f"num_consumed: expected in [0, {len(self)}], found {yielded}")
        return {"epoch": self.epoch, "yielded": yielded, "seed": self.seed, "shuffle": self.shuffle,
                "drop_last": self.drop_last, "balance": self.balance, "num_replicas": self.num_replicas,
                "rank": self.rank, "num_packs": self.num_packs, "fingerprint": self.fingerprint}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the next ``__iter__`` of the saved epoch yields the packs after the saved position.

        Strict: raises ``SamplerStateError`` if the state belongs to another dataset, pack index
        or sampler configuration. A mid-epoch state also selects its epoch (no ``set_epoch``
        needed). A state saved at the end of its epoch (``yielded == len(self)``) leaves an epoch
        chosen by an earlier ``set_epoch`` in place, so a training loop that calls
        ``set_epoch(e + 1)`` and then restores a StatefulDataLoader checkpoint taken after epoch
        ``e`` runs epoch ``e + 1`` in full; if that is still epoch ``e``, it yields nothing more.
        """
        missing = [k for k in self.STATE_KEYS if k not in state]
        if missing:
            raise SamplerStateError(field=f"state[{missing[0]!r}]", expected="present", found="missing")
        for key in ("fingerprint", "num_packs", "seed", "shuffle", "drop_last", "balance", "num_replicas", "rank"):
            if state[key] != getattr(self, key):
                raise SamplerStateError(
                    f"sampler state: {key}: expected {getattr(self, key)!r} (this sampler), found {state[key]!r} "
                    f"(saved); the state belongs to another "
                    f"{'pack index or dataset' if key in ('fingerprint', 'num_packs') else 'sampler configuration'}",
                    field=key, expected=getattr(self, key), found=state[key])
        yielded = int(state["yielded"])
        if not 0 <= yielded <= len(self):
            raise SamplerStateError(field="yielded", expected=f"in [0, {len(self)}]", found=yielded)
        epoch = int(state["epoch"])
        self._resume = (epoch, yielded)
        if yielded < len(self) or not self._epoch_set:
            self.epoch = epoch
        # else: the saved epoch is complete, and set_epoch already chose the epoch that comes next
        # (StatefulDataLoader loads the state inside iter(loader), after the loop's set_epoch).

    def _position(self) -> int:
        """Indices of ``self.epoch`` already handed out (or loaded as done)."""
        if self._resume is not None and self._resume[0] == self.epoch:
            return self._resume[1]
        return self._yielded if self._iter_epoch == self.epoch else 0


def _deal_balanced(rounds: np.ndarray, weights: np.ndarray) -> np.ndarray:
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


class PackSampler(DistributedPackSampler):
    """Single-process ``DistributedPackSampler`` (``num_replicas=1``): a seeded, resumable shuffle."""

    def __init__(self, dataset, *, shuffle: bool = True, seed: int = 0) -> None:
        super().__init__(dataset, 1, 0, shuffle=shuffle, seed=seed, drop_last=False, balance="none")
