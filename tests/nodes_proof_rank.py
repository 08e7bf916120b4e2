"""One rank of ``test_storage_nodes_proof.py``, in a process of its own: ``python nodes_proof_rank.py SPEC.json``.

The rank streams the collection at ``SPEC["url"]`` as a training script would (``PackedDataset(url, index,
stream=True, cache_limit=...)`` in its node's cache folder, ``DistributedPackSampler(..., nodes=, window=)``,
``prefetch(ds, sampler, batch_size=B)``, a DataLoader with ``workers`` workers and ``collate_varlen``), through its
node's link (``AWS_ENDPOINT_URL``, set by the test: the node's proxy). Before it iterates it may load a sampler state
(``state_in``, saved by a rank of an earlier run on another number of nodes); it stops after ``stop_after`` batches
(None: the whole deal) and then saves ``sampler.state_dict(num_consumed=...)`` to ``state_out``.

Every batch is compared here with the same packs read locally (``PackedDataset(local, index)``, collated the same
way); ``SPEC["out"]`` gets JSON: the packs read in order, the packs the sampler said this iteration would yield
(``pending_indices()`` before the loop), and the mismatches (batch number and field). A prefetch plan that misses
(the ``UserWarning`` "not the planned order's next") is an error, in the DataLoader workers too (forked: they inherit
the filter).
"""

from __future__ import annotations

import json
import sys
import warnings

import torch
from torch.utils.data import DataLoader

from packfmt.torch import DistributedPackSampler, PackedDataset, collate_varlen
from packfmt.torch.prefetch import prefetch

#: The fields of a batch compared with the local read.
FIELDS = ("input_ids", "labels", "position_ids", "cu_seqlens", "pack_ids")


def run(spec: dict) -> dict:
    ds = PackedDataset(spec["url"], spec["index"], stream=True, cache_limit=spec["cache_limit"],
                       cache_dir=spec["cache_dir"])
    reference = PackedDataset(spec["local"], spec["index"])
    sampler = DistributedPackSampler(ds, num_replicas=spec["world"], rank=spec["rank"], nodes=spec["nodes"],
                                     window=spec["window"], shuffle=True, seed=spec["seed"])
    sampler.set_epoch(spec["epoch"])
    if spec.get("state_in"):
        sampler.load_state_dict(torch.load(spec["state_in"], weights_only=True))
    pending = sampler.pending_indices().tolist()
    prefetch(ds, sampler, batch_size=spec["batch"])
    loader = DataLoader(ds, batch_size=spec["batch"], sampler=sampler, collate_fn=collate_varlen,
                        num_workers=spec["workers"])
    seen, mismatched, stop = [], [], spec.get("stop_after")
    for b, batch in enumerate(loader):
        packs = batch["pack_ids"].tolist()
        want = collate_varlen(reference.__getitems__(packs))
        mismatched += [[b, key] for key in FIELDS if not torch.equal(batch[key], want[key])]
        seen += packs
        if stop is not None and b + 1 == stop:
            break
    if spec.get("state_out"):
        torch.save(sampler.state_dict(num_consumed=len(seen)), spec["state_out"])
    return {"seen": seen, "pending": pending, "mismatched": mismatched}


def main(path: str) -> None:
    spec = json.loads(open(path).read())
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # a prefetch plan that missed is a failure
        out = run(spec)
    with open(spec["out"], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main(sys.argv[1])
