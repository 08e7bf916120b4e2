"""The streaming proof of issue 30: 4 nodes x 2 ranks x 2 DataLoader workers on one machine read one collection of
pack-ordered shards from a real S3-protocol server (moto on 127.0.0.1), each node through its own link (a
``tests/s3_proxy.FaultProxy``: bandwidth cap, per-request latency, every byte counted) into its own cache folder,
bounded by one node-wide ``cache_limit`` that its 6 processes share through the node's ledger.

Every rank is a process of its own (``nodes_proof_rank.py``), all 8 at once, reading as a training script does:
``PackedDataset(url, "g", stream=True, cache_limit=L)``, ``DistributedPackSampler(ds, num_replicas=8, rank=r,
nodes=4, window=2, shuffle=True, seed=...)``, ``prefetch(ds, sampler, batch_size=B)``, a DataLoader with 2 workers
and ``collate_varlen``; it compares every batch with the same packs read locally. Asserted:

1. every pack of the epoch is read exactly once over the 8 ranks, plus the padding spec/READER.md §6 defines (the
   spec's deal written out independently: ``test_torch_nodes.oracle_deal``), each node its own part; every item
   equals the local read;
2. the bytes all 4 links carried are at most 1.1x the collection's bytes in the bucket (shards, manifests, index);
3. each node's cache folder, sampled every 10 ms by a thread here for the whole run (allocated blocks,
   ``stream_bounds.disk_use``), never holds more than ``cache_limit``: the collection's own files and 10% of its
   shards, as the other streaming tests bound it (a node reads ~38 of the ~150; the peak comes near the limit);
4. an epoch stopped part-way on 4 nodes (each rank saves ``sampler.state_dict(num_consumed=n)``) and resumed on 3
   nodes x 2 ranks (each new rank loads some old rank's state; nodes 0-2 keep their caches) reads every pack once
   over both parts, plus the padding of the deal that finishes it, every item equal to the local read, the bound
   kept.

Why ~150 shards of ~160 KiB rather than a few dozen of a few KiB: with ``nodes=4, window=2`` the spec lets the 3
windows that node boundaries cut be read by two nodes (up to 6 shards twice), and every process (24 here) fetches the
collection's manifest (~190 bytes a shard) when it opens the collection; both must stay well under the 10% that (2)
allows, so that (2) measures what the deal and the node's cache fetch again, not the size of the test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import packfmt
from packfmt.cli import main
from packfmt.collection import write_collection
from packfmt.torch import PackedDataset

import limits
from s3_proxy import FaultProxy
from s3_server import BUCKET, ENV, s3_key, s3_server, time_limit  # noqa: F401  (fixtures)
from stream_bounds import disk_use, limit_for
from test_torch_elastic import spec_order
from test_torch_nodes import oracle_deal, oracle_left

NODES, PER_NODE, WORKERS, WINDOW, BATCH = 4, 2, 2, 2, 16
INDEX, SEED, CAPACITY = "g", 11, 1024
#: Each node's link: bytes/s and seconds a request.
RATE, LATENCY = 4e6, 0.005
RANK = Path(__file__).with_name("nodes_proof_rank.py")


@pytest.fixture(scope="module")
def corpus(s3_server, tmp_path_factory):  # noqa: F811
    """The source collection (40 members of 400 documents, 8 M tokens), packed by one ffd index over all its members
    and rewritten in pack order as ~150 shards in the bucket. Returns a dict: ``local`` (the source), ``url``, ``bytes``
    (every object under ``url``), ``limit`` (a node's ``cache_limit``), ``packs``, ``groups`` (each pack's shard)."""
    root = tmp_path_factory.mktemp("nodes-proof")
    rng = np.random.default_rng(5)
    paths = [root / "members" / f"m{m:02d}" for m in range(40)]
    for path in paths:
        lengths = rng.integers(100, 900, 400)
        n = int(lengths.sum())
        with packfmt.DatasetWriter(path, vocab_size=1000, loss_mask=True, tokenizer={"name": "t", "hash": None}) as w:
            w.add_documents(rng.integers(0, 1000, n), lengths, rng.integers(0, 2, n))
    src = write_collection(root / "src", [(None, p) for p in paths])
    url = f"s3://{BUCKET}/nodes-proof/shards"
    with limits.time_limit(240, "packing 16,000 documents and uploading ~150 shards"), \
            pytest.MonkeyPatch.context() as mp:
        mp.setenv("PACKFMT_CACHE", str(root / "writer-cache"))
        assert main(["pack", str(src.path), "--capacity", str(CAPACITY), "--name", INDEX, "--algorithm", "ffd",
                     "--shards", url, "--shard-size", "160KiB"]) == 0
        shards = PackedDataset(url, INDEX, cache_dir=root / "writer-cache")  # (uploaded from there: no fetch)
        limit = limit_for(url, INDEX, len(shards.store.members) // 10, root / "probe")
    s3_server.invalidate_cache()
    sizes = s3_server.du(s3_key(url), total=False)
    return {"local": str(src.path), "url": url, "bytes": int(sum(sizes.values())), "limit": limit,
            "packs": len(shards), "groups": shards.pack_groups().tolist()}


class DiskPeak:
    """Allocated bytes under each folder (``disk_use``), sampled every 10 ms by a thread until ``stop()``: the most
    seen per folder, and how many samples were taken."""

    def __init__(self, folders: list[Path]) -> None:
        self.folders, self.peak, self.samples = folders, [0] * len(folders), 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="disk-peak")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            for q, folder in enumerate(self.folders):
                self.peak[q] = max(self.peak[q], disk_use(folder))
            self.samples += 1

    def stop(self) -> list[int]:
        self._stop.set()
        self._thread.join()
        return self.peak


def _run_nodes(corpus, work: Path, links: list[FaultProxy], nodes: int, epoch: int, *, stop_after=None,
               states=None) -> tuple[list[dict], list[int]]:
    """Every rank of ``nodes`` nodes (``PER_NODE`` each) in a process of its own, all at once, node ``q`` through
    ``links[q]`` into ``work/cache{q}``; ``states[r]``: the sampler state rank ``r`` loads first. Waits for all.
    Returns (each rank's result, with its state's path when ``stop_after``; each node's peak disk use)."""
    work.mkdir(parents=True, exist_ok=True)
    world, procs, specs = nodes * PER_NODE, [], []
    caches = [work.parent / f"cache{q}" for q in range(nodes)]
    env = dict(os.environ, **ENV, PYTHONPATH=os.pathsep.join([str(RANK.parent.parent), str(RANK.parent)]),
               OMP_NUM_THREADS="1", PACKFMT_CACHE_WAIT="120")
    peak = DiskPeak(caches)
    try:
        for r in range(world):
            spec = {"url": corpus["url"], "index": INDEX, "local": corpus["local"],
                    "cache_dir": str(caches[r // PER_NODE]), "cache_limit": corpus["limit"], "world": world, "rank": r, "nodes": nodes, "window": WINDOW,
                    "seed": SEED, "epoch": epoch, "batch": BATCH, "workers": WORKERS, "stop_after": stop_after,
                    "state_in": states[r] if states else None,
                    "state_out": str(work / f"state{r}.pt") if stop_after else None, "out": str(work / f"out{r}.json")}
            specs.append(spec)
            (work / f"spec{r}.json").write_text(json.dumps(spec))
            log = open(work / f"rank{r}.log", "wb")
            procs.append(subprocess.Popen(
                [sys.executable, str(RANK), str(work / f"spec{r}.json")], stdout=log, stderr=subprocess.STDOUT,
                env={**env, "AWS_ENDPOINT_URL": links[r // PER_NODE].endpoint}, start_new_session=True))
            log.close()
        _wait(procs, work, limits.scaled(150))
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)  # this rank and its DataLoader workers (its own session)
                p.wait()
        peaks = peak.stop()
    assert peak.samples > 10, peak.samples
    results = [json.loads(Path(s["out"]).read_text()) for s in specs]
    return [dict(res, state=s["state_out"]) for res, s in zip(results, specs)], peaks


def _wait(procs, work: Path, seconds: float) -> None:
    """Wait for every rank; a rank that failed or ran past ``seconds`` fails the test with its log's tail."""
    failed = []
    for r, p in enumerate(procs):
        try:
            rc = p.wait(max(1.0, seconds))
        except subprocess.TimeoutExpired:
            rc = f"still running after {seconds:.0f} s"
        if rc != 0:
            failed.append(f"--- rank {r} ({rc}):\n" + (work / f"rank{r}.log").read_text(errors="replace")[-3000:])
    assert not failed, "rank processes failed:\n" + "\n".join(failed)


def _links(n: int) -> list[FaultProxy]:
    return [FaultProxy(os.environ["AWS_ENDPOINT_URL"], latency=LATENCY, rate=RATE) for _ in range(n)]


def _check_items(results: list[dict]) -> None:
    for r, res in enumerate(results):
        assert res["mismatched"] == [], (r, res["mismatched"][:5])  # every item equals the local read


def _check_nodes(results: list[dict], want: list[list[int]], per_rank: int | None = None) -> None:
    """Each node's ranks read, between them, the node's packs of the spec's deal (``want``: each rank's, before
    balancing, which only permutes a round among the node's ranks); each rank the packs its sampler listed."""
    for r, res in enumerate(results):
        assert res["seen"] == res["pending"][:len(res["seen"])], r
        assert per_rank is None or len(res["seen"]) == per_rank, (r, len(res["seen"]))
    for q in range(len(results) // PER_NODE):
        ranks = range(q * PER_NODE, (q + 1) * PER_NODE)
        n = len(results[ranks[0]]["seen"])
        assert Counter(p for r in ranks for p in results[r]["seen"]) == Counter(p for r in ranks for p in want[r][:n])


def _fetched(what: str, corpus, links, peaks) -> tuple[float, str]:
    """(bytes the links carried / the collection's bytes in the bucket, what they were), printed with the disk peaks:
    the bytes of the collection's own files (outside its shards) by file, and how many times a node fetched a shard
    it had fetched before (a shard's ``tokens.bin``: one GET each time, under 8 MiB)."""
    counts = [link.take() for link in links]
    fetched = sum(sum(c.values()) for c in counts)
    shards = f"/{s3_key(corpus['url'])}/shards/"
    own, again = Counter(), 0
    for c, link in zip(counts, links):
        own.update({p.rsplit("/", 1)[-1] or p: n for p, n in c.items() if not p.startswith(shards)})
        again += sum(k - 1 for (method, p), k in link.asked.items()
                     if method == "GET" and p.startswith(shards) and p.endswith("/tokens.bin"))
        link.asked.clear()
    ratio = fetched / corpus["bytes"]
    text = (f"{what}: fetched {fetched:,} of {corpus['bytes']:,} bytes ({ratio:.3f}x); the collection's own files "
            f"{sum(own.values()):,} ({', '.join(f'{p} {n:,}' for p, n in own.most_common(3))}); shards fetched again "
            f"by a node: {again}; disk peak / cache_limit {corpus['limit']:,}: "
            + ", ".join(f"{p / corpus['limit']:.3f}" for p in peaks))
    print("\n" + text)
    return ratio, text


def test_four_nodes_read_the_epoch_once_within_their_links_and_bounds(corpus, tmp_path):
    n, world, epoch = corpus["packs"], NODES * PER_NODE, 0
    assert 120 <= max(corpus["groups"]) + 1 <= 200  # shards
    links = _links(NODES)
    try:
        with limits.time_limit(240, "4 nodes x 2 ranks x 2 workers streaming an epoch"):
            results, peaks = _run_nodes(corpus, tmp_path / "epoch", links, NODES, epoch)
        ratio, fetched = _fetched("one epoch, 4 nodes", corpus, links, peaks)
    finally:
        for link in links:
            link.close()
    _check_items(results)
    order = spec_order(n, SEED, epoch, True, WINDOW, corpus["groups"])
    _check_nodes(results, oracle_deal(order, order, world, NODES, False), per_rank=-(-n // world))
    seen = Counter(p for res in results for p in res["seen"])
    assert set(seen) == set(range(n)) and sum(seen.values()) == n + (-n) % world  # each pack once, + padding
    assert ratio <= 1.1, fetched  # each shard fetched by about one node, once
    assert max(peaks) <= corpus["limit"], (peaks, corpus["limit"])  # the bound, at every sample, on every node


def test_an_epoch_stopped_on_four_nodes_resumes_on_three(corpus, tmp_path):
    n, epoch = corpus["packs"], 1
    order = spec_order(n, SEED, epoch, True, WINDOW, corpus["groups"])
    per_rank = -(-n // (NODES * PER_NODE))
    stop = per_rank * 2 // (5 * BATCH)  # batches each rank reads before the stop (~40% of the epoch)
    links = _links(NODES)
    try:
        with limits.time_limit(300, "an epoch streamed on 4 nodes, stopped, resumed on 3"):
            first, peaks1 = _run_nodes(corpus, tmp_path / "part1", links, NODES, epoch, stop_after=stop)
            _fetched("part 1, 4 nodes", corpus, links, peaks1)
            old = [res["state"] for res in first]
            states = [old[(5 * r + 3) % len(old)] for r in range((NODES - 1) * PER_NODE)]  # any old rank's state
            rest, peaks2 = _run_nodes(corpus, tmp_path / "part2", links[:NODES - 1], NODES - 1, epoch, states=states)
            _fetched("part 2, 3 nodes (the caches of nodes 0-2 kept)", corpus, links, peaks2)
    finally:
        for link in links:
            link.close()
    _check_items(first + rest)
    y = stop * BATCH
    _check_nodes(first, oracle_deal(order, order, NODES * PER_NODE, NODES, False), per_rank=y)
    left = oracle_left(order, NODES * PER_NODE, NODES, y, False)
    world2 = (NODES - 1) * PER_NODE
    _check_nodes(rest, oracle_deal(left, order, world2, NODES - 1, False), per_rank=-(-len(left) // world2))
    seen = Counter(p for res in first + rest for p in res["seen"])
    assert set(seen) == set(range(n)) and sum(seen.values()) == n + (-len(left)) % world2  # once, + padding
    assert max(peaks1 + peaks2) <= corpus["limit"], (peaks1, peaks2, corpus["limit"])
