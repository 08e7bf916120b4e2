"""One reader (or writer) of ``bench_stream_peers.py``: its own process, under the interpreter that has the library.

packfmt runs under packfmt's virtualenv, MosaicML Streaming and LitData under the peers' one (``--peers-python``,
``benchmarks/peers_env.sh``), so this file imports nothing but numpy, torch and the one library a command names::

    python stream_peers_driver.py read SPEC.json        # one rank's epoch; SPEC["out"] gets its timings
    python stream_peers_driver.py write-mds SPEC.json   # the corpus as MDS shards (streaming.MDSWriter)
    python stream_peers_driver.py write-litdata SPEC.json  # the corpus as LitData chunks (litdata.optimize)

The training loop is the same for every library: each batch's documents are counted (tokens delivered per document
id, saved for the parent's once-per-epoch check), then the process sleeps ``step_s`` per ``batch_tokens`` tokens of
the batch (the GPU step: a fixed time per token, so a library whose batches hold more tokens waits longer). Items
are made comparable by tokens: packfmt's items are packs of ``capacity`` tokens (ffd, ~100% full), the peers' items
are whole documents, batched ``docs_per_batch`` at a time (about the tokens of packfmt's batch); every rate is
tokens delivered per second.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

#: MDS columns of one document (what the LitData items hold too).
MDS_COLUMNS = {"id": "int64", "tokens": "ndarray:uint16"}


def _corpus(spec: dict):
    """(tokens, doc offsets) of the corpus the parent wrote (memory-mapped)."""
    return np.load(spec["tokens"], mmap_mode="r"), np.load(spec["offsets"])


def write_mds(spec: dict) -> None:
    from streaming import MDSWriter

    tokens, offsets = _corpus(spec)
    with MDSWriter(out=spec["out"], columns=MDS_COLUMNS, size_limit=spec["shard_bytes"], compression=None,
                   hashes=[], exist_ok=False) as w:
        for d in range(offsets.shape[0] - 1):
            w.write({"id": d, "tokens": np.asarray(tokens[offsets[d]:offsets[d + 1]])})


_LIT = {}


def _lit_items(span):
    """LitData's ``optimize`` function: the documents ``span`` = (first, end) as items ``{"id", "tokens"}``."""
    tokens, offsets = _LIT["corpus"]
    for d in range(*span):
        yield {"id": d, "tokens": np.asarray(tokens[offsets[d]:offsets[d + 1]])}


def write_litdata(spec: dict) -> None:
    from litdata import optimize

    _LIT["corpus"] = _corpus(spec)
    n = _LIT["corpus"][1].shape[0] - 1
    cuts = np.linspace(0, n, max(2, n // 20_000) + 1).astype(int).tolist()
    optimize(fn=_lit_items, inputs=list(zip(cuts[:-1], cuts[1:])), output_dir=spec["out"],
             chunk_bytes=spec["shard_bytes"], num_workers=1, mode=None, start_method="fork")


def _varlen_docs(samples):
    """The peers' collate: the batch's documents end to end in one row (as packfmt's ``collate_varlen``)."""
    import torch

    toks = [np.asarray(s["tokens"]) for s in samples]
    lens = np.fromiter((t.shape[0] for t in toks), dtype=np.int64, count=len(toks))
    return {"input_ids": torch.from_numpy(np.concatenate(toks).astype(np.int64)),
            "document_ids": torch.as_tensor([int(s["id"]) for s in samples], dtype=torch.int64),
            "seq_lens": torch.from_numpy(lens)}


def _peer_unpack(batch):
    return batch["document_ids"].numpy(), batch["seq_lens"].numpy()


def open_packfmt(spec: dict):
    from torch.utils.data import DataLoader

    from packfmt.torch import DistributedPackSampler, PackedDataset, collate_varlen
    from packfmt.torch.prefetch import prefetch

    ds = PackedDataset(spec["url"], "p", stream=True, cache_limit=spec["cache_limit"], cache_dir=spec["cache_dir"])
    sampler = DistributedPackSampler(ds, spec["world"], spec["rank"], seed=spec["seed"], window=spec["window"],
                                     nodes=spec["nodes"], balance=spec["balance"])
    sampler.set_epoch(0)
    prefetch(ds, sampler, batch_size=spec["batch"])  # follows every iter(sampler), in each worker
    loader = DataLoader(ds, batch_size=spec["batch"], sampler=sampler, collate_fn=collate_varlen,
                        num_workers=spec["workers"])
    return loader, lambda b: (b["document_ids"].numpy(), np.diff(b["cu_seqlens"].numpy()))


def open_mds(spec: dict):
    from streaming import StreamingDataset
    from torch.utils.data import DataLoader

    # Streaming reads its S3 endpoint from S3_ENDPOINT_URL (the parent sets it to this node's link); its rank, node
    # and world from RANK / LOCAL_RANK / LOCAL_WORLD_SIZE / WORLD_SIZE.
    ds = StreamingDataset(remote=spec["url"], local=spec["cache_dir"], cache_limit=spec["cache_limit"], shuffle=True,
                          shuffle_seed=spec["seed"], shuffle_block_size=spec["shuffle_block_size"],
                          batch_size=spec["docs_per_batch"], num_canonical_nodes=spec["nodes"], download_timeout=600)
    loader = DataLoader(ds, batch_size=spec["docs_per_batch"], num_workers=spec["workers"], collate_fn=_varlen_docs)
    return loader, _peer_unpack


def open_litdata(spec: dict):
    import warnings

    from litdata import StreamingDataLoader, StreamingDataset
    from litdata.streaming import downloader
    from litdata.streaming.resolver import Dir

    # LitData GETs chunks through obstore, which refuses a plain-http endpoint unless told (no option of LitData's
    # passes it through: its client options are this module dict).
    downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = "true"
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*max_cache_size.*")  # "less than 25GB": the 10% is the point
        ds = StreamingDataset(input_dir=Dir(path=spec["cache_dir"], url=spec["url"]), shuffle=True, seed=spec["seed"],
                              max_cache_size=spec["cache_limit"], storage_options={"endpoint_url": spec["endpoint"]})
    loader = StreamingDataLoader(ds, batch_size=spec["docs_per_batch"], num_workers=spec["workers"],
                                 collate_fn=_varlen_docs)
    return loader, _peer_unpack


OPEN = {"packfmt": open_packfmt, "mds": open_mds, "litdata": open_litdata}
#: What a training script imports at its top, before any dataset is built (not timed as the dataset's).
IMPORTS = {"packfmt": ("packfmt.torch", "packfmt.torch.prefetch"), "mds": ("streaming",),
           "litdata": ("litdata", "litdata.streaming.resolver")}


def train(loader, unpack, spec: dict, delivered: np.ndarray, first=None) -> dict:
    """The epoch: per batch the time it arrived and its tokens; the step sleeps its share of ``step_s``. ``first``:
    called once the first batch is in."""
    times, tokens = [], []
    per_token = spec["step_s"] / spec["batch_tokens"]
    for batch in loader:
        arrived = time.time()
        if first is not None and not times:
            first()
        ids, lens = unpack(batch)
        np.add.at(delivered, ids, lens)
        n = int(lens.sum())
        times.append(arrived)
        tokens.append(n)
        if per_token:
            time.sleep(per_token * n)
    return {"times": times, "tokens": tokens, "t_end": time.time()}


def read(spec: dict, t_main: float) -> None:
    import importlib

    import torch
    import torch.utils.data

    for name in IMPORTS[spec["library"]]:
        importlib.import_module(name)
    dist = spec["world"] > 1
    if dist:  # what a training job has before its loader; Streaming's ranks of a node meet at its barriers
        torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{spec['dist_port']}",
                                             rank=spec["rank"], world_size=spec["world"])
    prof = None
    if spec.get("profile"):  # the dataset built and its first batch read, in this process (workers: not seen)
        import cProfile

        prof = cProfile.Profile()
    t_dist = time.time()
    if prof is not None:
        prof.enable()
    loader, unpack = OPEN[spec["library"]](spec)
    t_constructed = time.time()
    delivered = np.zeros(spec["num_docs"], dtype=np.int64)
    first = None if prof is None else lambda: (prof.disable(), prof.dump_stats(spec["profile"]))
    out = train(loader, unpack, spec, delivered, first)
    np.save(spec["delivered"], delivered)
    out.update(rank=spec["rank"], t_main=t_main, t_dist=t_dist, t_constructed=t_constructed)
    Path(spec["out"]).write_text(json.dumps(out))
    if dist:
        torch.distributed.destroy_process_group()


def main() -> int:
    t_main = time.time()
    command, spec = sys.argv[1], json.loads(Path(sys.argv[2]).read_text())
    {"read": lambda s: read(s, t_main), "write-mds": write_mds, "write-litdata": write_litdata}[command](spec)
    sys.stdout.flush()
    os._exit(0)  # no interpreter teardown: a library's leftover threads (downloaders) cannot hang the exit


if __name__ == "__main__":
    sys.exit(main())
