"""Exact mid-epoch resume through torchdata's StatefulDataLoader (issue 4, spec/READER.md §6).

A training loop checkpoints ``loader.state_dict()`` (through ``torch.save``/``torch.load``), and
a FRESH sampler + loader restored from it must deliver exactly the batches the uninterrupted run
would have delivered next: mid-epoch, after two interruptions, at and across epoch boundaries,
with ``num_workers`` 0 and 2 (where the loader prefetches and restores from snapshots).
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

stateful = pytest.importorskip("torchdata.stateful_dataloader", reason="torchdata is not installed")
StatefulDataLoader = stateful.StatefulDataLoader

from packfmt.torch import DistributedPackSampler, PackedDataset, PackSampler, collate_varlen  # noqa: E402
from packfmt.torch.testing import write_flat_dataset, write_pack_index  # noqa: E402

RANKS, RANK, BATCH, EPOCHS = 4, 1, 4, 2
pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    root = tmp_path_factory.mktemp("stateful")
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 60, 299)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    store = write_flat_dataset(root / "ds", rng.integers(0, 1000, offsets[-1]), offsets, vocab_size=1000)
    segs = np.stack([np.arange(len(lengths)), np.zeros(len(lengths), dtype=np.int64), lengths], axis=1)
    write_pack_index(store, segs, np.arange(len(lengths) + 1), capacity=64, name="one")
    return PackedDataset(store, "one")


def make_loader(ds, num_workers, sampler_cls="distributed", persistent=False):
    if sampler_cls == "distributed":
        sampler = DistributedPackSampler(ds, RANKS, RANK, seed=9, balance="tokens")
    else:
        sampler = PackSampler(ds, seed=9)
    loader = StatefulDataLoader(ds, batch_size=BATCH, sampler=sampler, collate_fn=collate_varlen,
                                num_workers=num_workers, persistent_workers=persistent)
    return sampler, loader


def checkpoint_roundtrip(obj):
    """What a real checkpoint does to the state: torch.save, then torch.load(weights_only=True)."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def train(ds, num_workers, *, stop=None, resume=None, sampler_cls="distributed", persistent=False):
    """A training loop over ``EPOCHS`` epochs that checkpoints and exits after ``stop`` batches.

    ``stop`` counts batches consumed in this run; ``stop = (n, "end")`` checkpoints after the
    epoch loop that consumed the n-th batch has finished (the loader's iterator is exhausted, as
    with a per-epoch checkpoint). Returns (list of pack-id lists, checkpoint or None).
    """
    sampler, loader = make_loader(ds, num_workers, sampler_cls, persistent)
    first_epoch = 0
    if resume is not None:
        loader.load_state_dict(resume["loader"])
        first_epoch = resume["epoch"]
    n_stop, at_end = (stop if isinstance(stop, tuple) else (stop, False))
    batches = []
    for epoch in range(first_epoch, EPOCHS):
        sampler.set_epoch(epoch)
        for batch in loader:
            batches.append(batch["pack_ids"].tolist())
            if len(batches) == n_stop and not at_end:
                return batches, checkpoint_roundtrip({"epoch": epoch, "loader": loader.state_dict()})
        if n_stop is not None and at_end and len(batches) >= n_stop:
            return batches, checkpoint_roundtrip({"epoch": epoch + 1, "loader": loader.state_dict()})
    return batches, None


def interrupted(ds, num_workers, stops, sampler_cls="distributed", persistent=False):
    """Run with a checkpoint/restart at each of ``stops``, then to the end; all batches seen."""
    seen, ckpt = [], None
    for stop in stops:
        got, ckpt = train(ds, num_workers, stop=stop, resume=ckpt, sampler_cls=sampler_cls, persistent=persistent)
        seen += got
        assert ckpt is not None, "the run ended before the planned interruption"
    got, _ = train(ds, num_workers, resume=ckpt, sampler_cls=sampler_cls, persistent=persistent)
    return seen + got


@pytest.fixture(scope="module")
def reference(ds):
    """Uninterrupted batches over EPOCHS epochs (same for 0 and 2 workers, checked below)."""
    return train(ds, 0)[0]


def test_reference_is_two_distinct_full_epochs(ds, reference):
    sampler = DistributedPackSampler(ds, RANKS, RANK, seed=9, balance="tokens")
    per_epoch = -(-len(sampler) // BATCH)
    assert len(sampler) % BATCH != 0  # the last batch of an epoch is partial: exercises the tail
    assert len(reference) == EPOCHS * per_epoch
    flat = [p for b in reference for p in b]
    assert flat[: len(sampler)] == sampler.epoch_indices(0).tolist()
    assert flat[len(sampler):] == sampler.epoch_indices(1).tolist()
    assert flat[: len(sampler)] != flat[len(sampler):]
    assert train(ds, 2)[0] == reference  # workers deliver the same batches in the same order


def test_loader_state_holds_the_sampler_state(ds):
    """StatefulDataLoader must use our state_dict (not its fast-forward fallback)."""
    sampler, loader = make_loader(ds, 0)
    sampler.set_epoch(1)
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = loader.state_dict()
    inner = state["_index_sampler_state"] or state["_sampler_iter_state"]["sampler_state"]
    assert inner["epoch"] == 1 and inner["yielded"] == 3 * BATCH and inner["fingerprint"] == sampler.fingerprint


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("stops", [[1], [7], [5, 6], [3, 14]], ids=str)
def test_resume_mid_epoch(ds, reference, num_workers, stops):
    """One or two interruptions inside an epoch (stops count batches per run)."""
    assert interrupted(ds, num_workers, stops) == reference


@pytest.mark.parametrize("num_workers,persistent", [(0, False), (2, False), (2, True)])
def test_resume_across_epoch_boundary(ds, reference, num_workers, persistent):
    per_epoch = len(reference) // EPOCHS
    kw = {"persistent": persistent}
    # saved after the last batch of epoch 0, inside the loop (the loader has not raised StopIteration)
    assert interrupted(ds, num_workers, [per_epoch], **kw) == reference
    # saved after the epoch-0 loop ended (loader finished): the run resumes at epoch 1's start
    assert interrupted(ds, num_workers, [(per_epoch, "end")], **kw) == reference
    # mid epoch 1 after a loader that already went through epoch 0, then again in epoch 1
    assert interrupted(ds, num_workers, [per_epoch + 2, 3], **kw) == reference
    # mid epoch 0, then across the boundary into epoch 1
    assert interrupted(ds, num_workers, [per_epoch - 2, 5], **kw) == reference


def test_pack_sampler_resumes_through_stateful_loader(ds):
    ref = train(ds, 0, sampler_cls="single")[0]
    assert interrupted(ds, 0, [4, 30], sampler_cls="single") == ref


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_interruptions_resume_exactly(ds, reference, data):
    """Property: any sequence of checkpoint/restarts (mid-epoch or at an epoch's end) is invisible."""
    total, per_epoch = len(reference), len(reference) // EPOCHS
    stops, done = [], 0
    for _ in range(data.draw(st.integers(1, 3), label="interruptions")):
        if done >= total:
            break
        n = data.draw(st.integers(1, total - done), label="batches")
        if data.draw(st.booleans(), label="at_epoch_end"):
            stops.append((n, "end"))  # the run finishes the epoch holding its n-th batch, then saves
            done = -(-(done + n) // per_epoch) * per_epoch
        else:
            stops.append(n)
            done += n
    assert interrupted(ds, 0, stops) == reference


@pytest.mark.parametrize("num_workers", [0, 2])
def test_collection_resumes_exactly_and_reads_as_its_store(tmp_path, ds, reference, num_workers):
    """The same documents as a 3-member collection with the same packs: the same batches, and exact resume."""
    from packfmt.collection import write_collection

    store = ds.store
    cuts = [0, 100, 100, 299]  # an empty member in the middle
    members = []
    for m, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])):
        off = np.asarray(store.doc_offsets[a:b + 1])
        members.append(write_flat_dataset(tmp_path / f"m{m}", np.asarray(store.tokens[off[0]:off[-1]]), off - off[0],
                                          vocab_size=1000).path)
    coll = write_collection(tmp_path / "coll", [(None, p) for p in members])
    index = ds.index
    write_pack_index(coll, np.asarray(index.segments), np.asarray(index.pack_offsets), capacity=64, name="one")
    cds = PackedDataset(coll.path, "one")
    assert interrupted(cds, num_workers, [5, 6]) == reference
    for p in range(len(cds)):  # and the batches hold the same rows
        assert torch.equal(cds[p]["input_ids"], ds[p]["input_ids"]) and torch.equal(cds[p]["labels"], ds[p]["labels"])
