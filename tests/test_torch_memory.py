"""A DataLoader with 2 workers over >= 10^6 documents: worker memory stays flat over an epoch."""

from __future__ import annotations

import numpy as np
import psutil
from torch.utils.data import DataLoader

from packfmt.torch import DistributedPackSampler, PackedDataset, collate_varlen
from packfmt.torch.testing import next_fit_segments, write_flat_dataset, write_pack_index

NUM_DOCS = 1_000_000
CAPACITY = 256
#: Anonymous (non file-backed) memory a worker may gain between early and late in the epoch.
GROWTH_BOUND = 48 * 2**20


def anon_bytes(proc: psutil.Process) -> int:
    """Resident memory not backed by a file: memmapped pages the worker touched don't count."""
    info = proc.memory_info()
    return info.rss - info.shared


def test_worker_memory_flat_over_epoch(tmp_path):
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 9, NUM_DOCS)
    offsets = np.zeros(NUM_DOCS + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    store = write_flat_dataset(tmp_path / "ds", rng.integers(0, 32000, int(offsets[-1]), dtype=np.uint16), offsets,
                               vocab_size=32000)
    assert store.num_documents >= 10**6
    segs, po = next_fit_segments(lengths, CAPACITY)
    write_pack_index(store, segs, po, capacity=CAPACITY, name="nf")
    ds = PackedDataset(store, "nf")
    sampler = DistributedPackSampler(ds, 1, 0, seed=0, balance="none")
    dl = DataLoader(ds, batch_size=32, sampler=sampler, collate_fn=collate_varlen, num_workers=2,
                    persistent_workers=True, prefetch_factor=2)
    it = iter(dl)
    workers = [psutil.Process(w.pid) for w in it._workers]
    n_batches = len(dl)
    early, late, tokens, labels = None, None, 0, 0
    for step, batch in enumerate(it):
        tokens += batch["input_ids"].shape[1]
        labels += int(batch["num_label_tokens"])
        if step == 20:
            early = [anon_bytes(w) for w in workers]
        if step == n_batches - 5:
            late = [anon_bytes(w) for w in workers]
    assert tokens == store.num_tokens  # the whole epoch went through
    assert labels == store.num_tokens - NUM_DOCS  # one unlabeled last token per document, no mask
    growth = [b - a for a, b in zip(early, late)]
    print(f"{n_batches} batches, {tokens} tokens; worker anon memory early {[a >> 20 for a in early]} MiB, "
          f"late {[b >> 20 for b in late]} MiB, growth {[g >> 10 for g in growth]} KiB")
    assert max(growth) < GROWTH_BOUND
