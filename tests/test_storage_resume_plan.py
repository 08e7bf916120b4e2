"""A streamed read planned from its sampler (``prefetch(ds, sampler, batch_size=B)``) plans what the loop reads next,
in every process that reads, after a resume too (issue 30 item 6; README "Remote data").

Through torchdata's ``StatefulDataLoader`` with 0 and 2 workers over a real S3-protocol server (moto): an epoch is
interrupted, its loader state saved; a new dataset, sampler and loader load it and read the rest, and the next
epoch. Every batch equals the local read, and no process reads a batch its plan did not have next (a plan that
missed warns "not the planned order's next", in the worker's own stderr, which ``capfd`` sees); the old way
(``prefetch(ds, sampler.epoch_indices())``) is the control: after a resume it plans the epoch from its start and
warns.
"""

from __future__ import annotations

import gc
import warnings

import pytest
import torch

from packfmt.torch import DistributedPackSampler, PackedDataset, collate_varlen
from packfmt.torch.prefetch import prefetch

from s3_server import cache, s3_server, time_limit  # noqa: F401  (fixtures)
from test_storage_window import remote  # noqa: F401  (200 members; index "m": each member's packs consecutive)

BATCH, MISSED = 4, "not the planned order's next"


def _loader(ds, sampler, workers: int):
    from torchdata.stateful_dataloader import StatefulDataLoader

    return StatefulDataLoader(ds, batch_size=BATCH, sampler=sampler, num_workers=workers, collate_fn=collate_varlen)


def _setup(local, url, limit, workers, plan_from_sampler: bool):
    ds = PackedDataset(url, "m", stream=True, cache_limit=limit)
    sampler = DistributedPackSampler(ds, num_replicas=2, rank=1, nodes=2, window=2, seed=7)
    if plan_from_sampler:
        prefetch(ds, sampler, batch_size=BATCH)
    else:
        prefetch(ds, sampler.epoch_indices(), batch_size=BATCH)
    return ds, sampler, _loader(ds, sampler, workers)


def _check(batches, reference, order) -> list[int]:
    seen = []
    for a in batches:
        packs = a["pack_ids"].tolist()
        b = collate_varlen(reference.__getitems__(packs))
        for key in ("input_ids", "labels", "position_ids", "cu_seqlens"):
            assert torch.equal(a[key], b[key]), key
        seen += packs
    return seen


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resumed_loop_reads_what_its_plan_has_next(remote, cache, capfd, workers):  # noqa: F811
    local, url, _, limit = remote
    reference = PackedDataset(local, "m")
    ds, sampler, loader = _setup(local, url, limit, workers, True)
    sampler.set_epoch(3)
    it = iter(loader)
    first = [next(it) for _ in range(5)]
    state = loader.state_dict()
    del it, loader, ds
    gc.collect()  # the old dataset lets go of its members (its prefetch threads hold it weakly)
    order = DistributedPackSampler(reference, num_replicas=2, rank=1, nodes=2, window=2, seed=7).epoch_indices(3)
    assert _check(first, reference, order) == order[:5 * BATCH].tolist()

    ds, sampler, loader = _setup(local, url, limit, workers, True)  # a new process would do just this
    sampler.set_epoch(3)
    loader.load_state_dict(state)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # a missed plan raises, in the workers too (forked inside)
        rest = _check(loader, reference, order)
        assert rest == order[5 * BATCH:].tolist()  # the rest of the epoch, exactly
        sampler.set_epoch(4)  # the next epoch: planned again, nothing to call
        assert _check(loader, reference, order) == sampler.epoch_indices(4).tolist()
    assert MISSED not in capfd.readouterr().err  # every process read what its plan had next


def test_a_fixed_order_plans_the_epoch_from_its_start(remote, cache, capfd):  # noqa: F811
    """The control: a plan made from ``epoch_indices()`` before a resume misses (the loop does not read the epoch
    from its start), warns, and falls back to fetching on demand; items are still right."""
    local, url, _, limit = remote
    reference = PackedDataset(local, "m")
    ds, sampler, loader = _setup(local, url, limit, 0, True)
    sampler.set_epoch(3)
    it = iter(loader)
    for _ in range(5):
        next(it)
    state = loader.state_dict()
    del it, loader, ds
    gc.collect()
    ds, sampler, loader = _setup(local, url, limit, 0, False)
    sampler.set_epoch(3)
    loader.load_state_dict(state)
    order = sampler.epoch_indices(3)
    with pytest.warns(UserWarning, match=MISSED):
        assert _check(loader, reference, order) == order[5 * BATCH:].tolist()
