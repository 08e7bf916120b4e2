"""Exact prefetch of a streamed collection's members from the sampler's order (README "Remote data").

``prefetch(ds, sampler, batch_size=B)`` gives a ``PackedDataset`` opened with ``stream=True`` the order it will read
packs in: at every ``iter(sampler)`` (each epoch, and after ``load_state_dict`` from the position it resumes at, on
any number of ranks, with or without torchdata's ``StatefulDataLoader``) the sampler publishes the packs that
iteration yields (``_plan_channel``), and every process that reads (the loop's own, or each DataLoader worker) plans
from them before its next batch: a ``packfmt.remote.plan.Plan`` (Belady eviction, background threads fetching the
coming members). A DataLoader worker reads every ``W``-th batch of that order from the one it is handed first (the
DataLoader deals batches round-robin, after a resume from the worker after the last one that yielded): it finds that
batch in the order and plans its own share from there. ``prefetch(ds, order)`` (pack ids, e.g.
``sampler.epoch_indices()``) plans one fixed order instead; call it again for every epoch.
"""

from __future__ import annotations

import warnings

import numpy as np

from ..remote import plan as P
from . import _plan_channel as C

__all__ = ["DEFAULT_LOOKAHEAD", "prefetch"]

#: How many (position, member) pairs of the order, from the next pack read on, the threads look at.
DEFAULT_LOOKAHEAD = 4096


def prefetch(ds, source, *, batch_size: int | None = None, lookahead: int | None = None, threads: int | None = None,
             window: int | None = None) -> None:
    """Plan ``ds`` (a ``PackedDataset`` with ``stream=True``) to read what ``source`` gives and fetch its members ahead.

    ``source``: the sampler (``DistributedPackSampler``, ``PackSampler``), whose every iteration the plan follows
    (the way to use it: resumes and new epochs need nothing more); or an order of pack ids, planned once.
    ``batch_size``: the DataLoader's (needed with workers: which batches a worker reads). ``lookahead``: how far
    ahead to prefetch: the (position, member) pairs of the order, from the next pack read on, the threads consider at
    a time (default ``DEFAULT_LOOKAHEAD``, 4096; >= 1); ``threads``: how many members are fetched at once (>= 1);
    default: adaptive, 2 at first and one more each time a batch has to wait for a member, up to
    ``remote.plan.MOST_THREADS`` (16): small members over a link with latency need many requests in flight, large
    ones few, and the cache limit bounds the bytes in flight either way.
    ``window``: the old name of ``lookahead`` (a ``DeprecationWarning``; it goes in the next version): not the
    samplers' ``window=K``, their shuffle window of members.
    """
    if window is not None:
        if lookahead is not None:
            raise TypeError("prefetch: lookahead= and window= are the same parameter (window= is its old name); "
                            "give lookahead= only")
        warnings.warn("prefetch: window= is renamed lookahead= (how far ahead to prefetch; window=K is the samplers' "
                      "shuffle window of members); use lookahead=, window= goes in the next version",
                      DeprecationWarning, stacklevel=2)
        lookahead = window
    lookahead = DEFAULT_LOOKAHEAD if lookahead is None else lookahead
    for key, value in (("lookahead", lookahead), ("threads", 1 if threads is None else threads)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
            raise ValueError(f"prefetch: {key}: expected an integer >= 1, found {value!r}")
    if hasattr(source, "pending_indices"):  # a sampler: its every iteration published, the plan follows them
        channel = source.plan_channel()
        C.publish(channel.path, source.pending_indices())
        ds._stream_plan = (None, batch_size, int(lookahead), _int_or_none(threads), channel.path)
        ds._plan_seen = None
    else:
        ds._stream_plan = (np.asarray(source, dtype=np.int64).reshape(-1), batch_size, int(lookahead),
                           _int_or_none(threads), None)
        if ds._arrays is not None:
            start(ds)


def start(ds) -> None:
    """A fixed order's plan, in the process that reads (called by the dataset once its arrays are open)."""
    spec = getattr(ds, "_stream_plan", None)
    a = ds._views()
    if spec is None or spec[4] is not None or not ds.store.streamed:  # a sampler's: ``follow``; a local read: none
        return
    order, batch_size, lookahead, threads, _ = spec
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    if info is not None and info.num_workers > 1:
        if batch_size is None:
            return  # which batches this worker reads is not known: fetch on demand
        b = np.arange(order.shape[0]) // batch_size
        order = order[b % info.num_workers == info.id]
    _plan(ds, a, order, lookahead, threads)


def follow(ds, packs: np.ndarray) -> None:
    """Before ``ds`` reads ``packs``: when the sampler published a new iteration since, plan this process's share of
    it from the batch ``packs`` on (``W`` DataLoader workers: every ``W``-th batch of ``batch_size`` from it)."""
    spec = getattr(ds, "_stream_plan", None)
    if spec is None or spec[4] is None:
        return
    key = C.identity(spec[4])
    if key is None or key == getattr(ds, "_plan_seen", None):
        return
    ds._plan_seen = key
    order = C.read(spec[4])
    a = ds._views()
    if order is None or not ds.store.streamed:
        return
    _, batch_size, lookahead, threads, _ = spec
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    workers = info.num_workers if info is not None else 1
    size = batch_size or packs.shape[0] or 1
    first = _batch_at(order, packs, size)
    if first is None or (workers > 1 and batch_size is None):
        return  # not a batch of this iteration (another order is read): fetch on demand
    n = -(-order.shape[0] // size)
    mine = np.arange(first, n, workers)
    share = np.concatenate([order[b * size:(b + 1) * size] for b in mine.tolist()]) if mine.size else order[:0]
    _plan(ds, a, share, lookahead, threads)


def _batch_at(order: np.ndarray, packs: np.ndarray, size: int) -> int | None:
    """The index ``j`` of the batch ``order[j * size : (j + 1) * size]`` that equals ``packs``, the first one."""
    if not packs.shape[0]:
        return None
    heads = order[::size]
    for j in np.flatnonzero(heads == packs[0]).tolist():
        if np.array_equal(order[j * size:j * size + packs.shape[0]], packs):
            return j
    return None


def _int_or_none(threads) -> int | None:
    return None if threads is None else int(threads)


def _plan(ds, a: dict, order: np.ndarray, lookahead: int, threads: int | None) -> None:
    first, most = (P.FIRST_THREADS, P.MOST_THREADS) if threads is None else (threads, threads)
    P.start(a["members"], order, np.asarray(a["pack_offsets"]), np.asarray(a["segments"]),
            getattr(ds.index, "shard_of", None), lookahead, first, most)


def open_share(url, storage_options, cache_dir, cache_limit):
    """The streamed collection at ``url`` for this process (a DataLoader worker): the node's one budget,
    ``cache_limit``, shared with every process of the node that reads it (``remote.node_cache``)."""
    from ..remote import open_streamed

    return open_streamed(url, storage_options, cache_dir, cache_limit)
