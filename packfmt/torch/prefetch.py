"""Exact prefetch of a streamed collection's members from the sampler's order (README "Remote data").

``prefetch(ds, order)`` gives a ``PackedDataset`` opened with ``stream=True`` the order it will read packs in
(``DistributedPackSampler.epoch_indices()``); in the process that reads, ``start(ds)`` hands it to the member cache
as a ``packfmt.remote.plan.Plan`` (Belady eviction, background threads fetching the coming members: see there).

With DataLoader workers, give ``batch_size``: worker ``w`` of ``W`` reads batches ``w, w + W, ...``
of the order (the DataLoader's round-robin), and each worker plans its own share.
"""

from __future__ import annotations

import warnings

import numpy as np

from ..remote import plan as P

__all__ = ["DEFAULT_LOOKAHEAD", "prefetch"]

#: How many (position, member) pairs of the order, from the next pack read on, the threads look at.
DEFAULT_LOOKAHEAD = 4096


def prefetch(ds, order, *, batch_size: int | None = None, lookahead: int | None = None, threads: int = 2,
             window: int | None = None) -> None:
    """Plan ``ds`` (a ``PackedDataset`` with ``stream=True``) to read ``order`` (pack ids, e.g. ``sampler.epoch_indices()``)
    and start fetching its members ahead in a background thread. Call again for every epoch.

    ``lookahead``: how far ahead to prefetch: the (position, member) pairs of the order, from the next pack
    read on, the threads consider at a time (default ``DEFAULT_LOOKAHEAD``, 4096; >= 1); ``threads``: how many
    members are fetched at once (>= 1). ``window``: the old name of ``lookahead`` (a ``DeprecationWarning``; it
    goes in the next version): not the samplers' ``window=K``, their shuffle window of members.
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
    for key, value in (("lookahead", lookahead), ("threads", threads)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
            raise ValueError(f"prefetch: {key}: expected an integer >= 1, found {value!r}")
    ds._stream_plan = (np.asarray(order, dtype=np.int64).reshape(-1), batch_size, int(lookahead), int(threads))
    if ds._arrays is not None:
        start(ds)


def start(ds) -> None:
    """In the process that reads (called by the dataset once its arrays are open): this process's plan and threads."""
    spec = getattr(ds, "_stream_plan", None)
    a = ds._views()
    if spec is None or not ds.store.streamed:  # a local read ignores the plan
        return
    order, batch_size, lookahead, threads = spec
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    if info is not None and info.num_workers > 1:
        if batch_size is None:
            return  # which batches this worker reads is not known: fetch on demand
        b = np.arange(order.shape[0]) // batch_size
        order = order[b % info.num_workers == info.id]
    P.start(a["members"], order, np.asarray(a["pack_offsets"]), np.asarray(a["segments"]),
            getattr(ds.index, "shard_of", None), lookahead, threads)


def open_share(url, storage_options, cache_dir, cache_limit):
    """The streamed collection at ``url`` for this process (a DataLoader worker): the node's one budget,
    ``cache_limit``, shared with every process of the node that reads it (``remote.node_cache``)."""
    from ..remote import open_streamed

    return open_streamed(url, storage_options, cache_dir, cache_limit)
