"""One corpus streamed by packfmt, MosaicML Streaming and LitData under one cap: bytes fetched, time to first batch,
steady rate against the same library fully cached, peak cache on disk, every document once (issue 30, "How fast").

The corpus (``--docs`` web-like documents: lognormal lengths, mean ~250 tokens, uint16 ids; ``common.web_like_corpus``)
is written once per format and uploaded to an S3-protocol server (moto on 127.0.0.1):

- packfmt: one store (``DatasetWriter``), ``packfmt pack STORE --capacity 4096 --name p --shards s3://... --shard-size
  S`` (ffd packs rewritten in pack order as shards of about S: the layout a streamed read shuffles shard by shard);
- MDS: ``streaming.MDSWriter``, ``size_limit`` = S, one sample a document (``id`` int64, ``tokens`` ndarray:uint16);
- LitData: ``litdata.optimize``, ``chunk_bytes`` = S, one item a document (the same two fields), read by its default
  item loader (whole documents: the same documents; its ``TokensLoader`` cuts blocks across documents, drops the
  last partial one, and its ``close`` raised ``KeyError`` after an eviction at a small ``max_cache_size``).

Items are made comparable by tokens: packfmt's batch is ``--batch`` packs of ``--capacity`` tokens, the peers' batch
``docs_per_batch`` whole documents (about as many tokens), and the simulated step sleeps ``--step-ms`` per
``batch x capacity`` tokens it was given, so every library's GPU costs the same per token; rates are tokens/s.

Each run: ``--nodes`` nodes of ``--ranks-per-node`` ranks (one process each, ``torch.distributed`` gloo between them;
``--workers`` DataLoader workers each); each node has its own cache folder, its own ``/dev/shm`` (``unshare``: when
root; Streaming shares memory between a node's ranks by name) and its own link: a ``tests/s3_proxy.FaultProxy`` in
front of the server capped at ``--mbps`` MB/s with ``--latency-ms`` per request (its byte counts are the bytes
fetched). Per library, in one invocation, alternating the library order across ``--repeat`` repeats:

- ``streamed``: a fresh cache limited to 10% (``--cache-fraction``) of that format's bytes per node (packfmt's
  ``cache_limit``, Streaming's ``cache_limit`` and LitData's ``max_cache_size`` are each the node's folder's);
- ``cached``: the same read through the same link with every file already in the cache (an untimed fill run first,
  no limit, the link uncapped, in a second cache folder): the library's fully cached rate.

Columns: ``fetched_x`` (bytes the nodes' links carried / the format's bytes in the bucket), ``requests``,
``ttfb_process_s`` / ``ttfb_dataset_s`` (latest rank's first batch, from spawning the processes / from just before the
dataset is built: after imports and the process group), ``tokens_per_s`` (steady state: per rank the tokens from its
batch at ``--warmup`` of its tokens to the end over that time, summed over ranks), ``vs_cached`` (streamed over
cached, same library and repeat), ``disk_x`` (peak bytes in a node's cache folder, sampled every 10 ms: by
``statvfs`` of a tmpfs mounted there when root, one instant; else a walk; over the node's limit; the largest node), ``missing_docs`` / ``extra_docs`` (documents delivered fewer / more tokens
than they hold, over all ranks: a deal's padding repeats, a forced ``drop_last`` drops).

Configuration traps handled: Streaming 0.13 needs numpy < 2.2 and imports torchvision (its own environment); its
default ``shuffle_block_size`` (262,144 samples: ~60 shards of 2 MiB) with a 10% ``cache_limit`` thrashed, so it is
set to whole shards that keep every reader's block inside half the node's cache (``--shuffle-block-size``; printed
and recorded); LitData downloads through obstore, which refuses a plain-http endpoint (``allow_http`` set in its
client options by the driver).

The peers run under their own interpreter (never packfmt's dependencies): ``--peers-python`` (default
``/work/peers-venv/bin/python``; ``bash benchmarks/peers_env.sh DIR`` creates one: torch 2.14.1 with torchvision
0.29.1, mosaicml-streaming 0.13, numpy < 2.2, litdata 0.2.76); a library whose interpreter is absent or cannot
import it is skipped with a message. Readers: ``benchmarks/stream_peers_driver.py``; set-up:
``benchmarks/stream_peers_setup.py``.

    python benchmarks/bench_stream_peers.py [--shard-size 2MiB[,100KiB,64MiB]] [--docs 400000] [--mbps 20]
        [--latency-ms 75] [--step-ms 20] [--nodes 2] [--ranks-per-node 1] [--workers 0] [--repeat 1]
        [--libraries packfmt,mds,litdata] [--peers-python PATH] [--profile]
        [--out benchmarks/results/bench_stream_peers.json]
    python benchmarks/bench_stream_peers.py --shard-size 64MiB --window 1   # ~3.0 M documents, 1.5 GB a format

The corpus grows past ``--docs`` until one node's cache holds two shards (64 MiB: ~3.0 M documents). With only two
shards in a node's cache, packfmt needs ``--window 1``: a batch that straddles two windows of K shards holds 2K.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import stream_peers_report as report  # noqa: E402
import stream_peers_setup as setup  # noqa: E402
from common import RESULTS_DIR, commit_info, machine_info, print_table, write_json  # noqa: E402

PEERS_PYTHON = "/work/peers-venv/bin/python"
IMPORTS = {"mds": "streaming", "litdata": "litdata"}
COLUMNS = ["shard", "library", "run", "repeat", "fetched_x", "requests", "ttfb_process_s", "ttfb_dataset_s",
           "tokens_per_s", "vs_cached", "disk_x", "epoch_s", "missing_docs", "extra_docs", "error"]


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]i?B?)?\s*", text, re.I)
    if not m:
        raise argparse.ArgumentTypeError(f"a size: expected e.g. 100KiB, 2MiB, 64MiB or bytes, found {text!r}")
    unit = (m.group(2) or "").upper().rstrip("B")
    return int(float(m.group(1)) * {"": 1, "K": 1e3, "KI": 2**10, "M": 1e6, "MI": 2**20, "G": 1e9, "GI": 2**30}[unit])


def peers_usable(python: str, libraries: list[str]) -> dict:
    """``{library: None (usable) or why not}`` for the peer libraries asked for."""
    out = {}
    for lib in (x for x in libraries if x in IMPORTS):
        if not Path(python).exists():
            out[lib] = f"no interpreter at {python} (--peers-python; bash benchmarks/peers_env.sh DIR makes one)"
            continue
        probe = subprocess.run([python, "-c", f"import {IMPORTS[lib]}"], capture_output=True, text=True,
                               env=setup.peers_env())
        out[lib] = None if probe.returncode == 0 else f"{python} cannot import {IMPORTS[lib]}: " + \
            probe.stderr.strip().splitlines()[-1]
    return out


def corpus_docs(args, shard_bytes: int) -> int:
    """``--docs``, or more: enough that one node's cache holds ``--shards-cached`` shards (~500 bytes a document)."""
    need = math.ceil(args.shards_cached * shard_bytes / args.cache_fraction / 500 * 1.1)
    return max(args.docs, need)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shard-size", default="2MiB", type=lambda t: t.split(","),
                    help="shard / chunk size, or several, comma-separated (default 2MiB)")
    ap.add_argument("--docs", type=int, default=400_000,
                    help="documents (more when a node's cache would hold fewer than --shards-cached shards)")
    ap.add_argument("--shards-cached", type=int, default=4,
                    help="shards a node's cache holds at least (Streaming 0.13 refuses a cache_limit below 4 shards)")
    ap.add_argument("--mbps", type=float, default=20.0, help="each node's link, MB/s (0: no cap)")
    ap.add_argument("--latency-ms", type=float, default=75.0, help="each request's added latency")
    ap.add_argument("--step-ms", type=float, default=20.0, help="simulated step per batch x capacity tokens")
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--ranks-per-node", type=int, default=1)
    ap.add_argument("--workers", type=int, default=0, help="DataLoader workers per rank")
    ap.add_argument("--cache-fraction", type=float, default=0.10, help="cache limit of a node / the format's bytes")
    ap.add_argument("--capacity", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=8, help="packs per batch (peers: as many tokens of documents)")
    ap.add_argument("--window", type=int, default=2, help="packfmt: DistributedPackSampler(window=K)")
    ap.add_argument("--balance", default="tokens", help="packfmt: DistributedPackSampler(balance=)")
    ap.add_argument("--shuffle-block-size", type=int, default=0,
                    help="Streaming: samples a shuffle block (0: whole shards keeping each reader in half the cache)")
    ap.add_argument("--warmup", type=float, default=0.1, help="share of a rank's tokens before the steady state")
    ap.add_argument("--profile", action="store_true",
                    help="cProfile rank 0 from building the dataset to its first batch, streamed runs (printed)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--libraries", default=",".join(setup.LIBRARIES), type=lambda t: t.split(","))
    ap.add_argument("--peers-python", default=PEERS_PYTHON)
    ap.add_argument("--run-timeout", type=float, default=1800.0, help="seconds one run's processes may take")
    ap.add_argument("--out", type=Path, default=RESULTS_DIR / "bench_stream_peers.json")
    args = ap.parse_args(argv)
    bad = [x for x in args.libraries if x not in setup.LIBRARIES]
    if bad:
        ap.error(f"--libraries: expected some of {','.join(setup.LIBRARIES)}, found {','.join(bad)}")
    skipped = peers_usable(args.peers_python, args.libraries)
    for lib, why in skipped.items():
        if why:
            print(f"{lib}: skipped: {why}", file=sys.stderr)
    libraries = [x for x in args.libraries if not skipped.get(x)]
    namespaces = setup.shm_namespaces()
    if not namespaces and "mds" in libraries and args.nodes > 1:
        print("mds: skipped: two nodes on one machine need a private /dev/shm each (unshare --mount, as root); "
              "run as root or with --nodes 1", file=sys.stderr)
        libraries.remove("mds")
        skipped["mds"] = "no private /dev/shm per node"
    rows, sizes = [], []
    proc, endpoint = setup_server()
    try:
        for shard in args.shard_size:
            sizes.append(run_size(args, shard, libraries, endpoint, namespaces, rows))
    finally:
        proc.terminate()
        proc.wait()
    summary, goals = report.summarize(rows), report.goals(rows)
    print_table(rows, COLUMNS, title=f"{args.nodes} nodes x {args.ranks_per_node} ranks, {args.workers} workers, "
                f"{args.mbps} MB/s and {args.latency_ms} ms a request per node, cache {args.cache_fraction:.0%} per "
                f"node, step {args.step_ms} ms per {args.batch * args.capacity:,} tokens")
    print_table(summary, report.SUMMARY, title="medians over repeats (streamed runs)")
    if goals:
        print_table(goals, report.GOALS, title="issue 30's goals: packfmt against the best peer (medians)")
    write_json(args.out, {"rows": rows, "summary": summary, "goals": goals, "sizes": sizes, "skipped": skipped,
                          "node_namespaces": namespaces, "args": {k: v for k, v in vars(args).items()},
                          "machine": machine_info(), "code": commit_info()})
    return 0


def setup_server():
    from bench_remote import start_server

    proc, endpoint = start_server()
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    s3fs.S3FileSystem().mkdir("bench")
    return proc, endpoint


def run_size(args, shard: str, libraries: list[str], endpoint: str, namespaces: bool, rows: list) -> dict:
    """Every library at one shard size: the corpus written, each format uploaded, the runs; returns what was built."""
    from s3_proxy import FaultProxy

    shard_bytes = parse_size(shard)
    with tempfile.TemporaryDirectory(prefix="bench_stream_peers_", dir=os.environ.get("BENCH_TMP")) as tmp:
        tmp = Path(tmp)
        n_docs = corpus_docs(args, shard_bytes)
        t0 = time.perf_counter()
        corpus = setup.write_corpus(tmp / "corpus", n_docs)
        built = {"shard": shard, "shard_bytes": shard_bytes, "documents": n_docs, "tokens": corpus["tokens"],
                 "formats": {}}
        print(f"{shard}: corpus of {n_docs:,} documents, {corpus['tokens']:,} tokens", flush=True)
        for lib in libraries:
            url = "s3://" + setup.PREFIX[lib].format(shard=shard)
            t1 = time.perf_counter()
            if lib == "packfmt":
                setup.write_packfmt(tmp / "packfmt", corpus, url, shard, args.capacity, endpoint)
            else:
                setup.write_peer(lib, tmp, corpus, url, shard_bytes, args.peers_python)
            nbytes, objects = setup.remote_bytes(url)
            built["formats"][lib] = {"url": url, "bytes": nbytes, "objects": objects,
                                     "write_s": time.perf_counter() - t1}
            print(f"  {lib}: {nbytes:,} bytes in {objects:,} objects ({time.perf_counter() - t1:.1f} s)", flush=True)
        built["write_s"] = time.perf_counter() - t0
        lengths = {lib: (corpus["lengths"], 0) for lib in libraries}
        if "packfmt" in libraries:  # checked against the layout's own documents
            lengths["packfmt"] = layout_lengths(built["formats"]["packfmt"]["url"], tmp / "probe")
        proxies = [FaultProxy(endpoint, latency=args.latency_ms / 1e3, rate=args.mbps * 1e6 or None)
                   for _ in range(args.nodes)]
        try:
            for r in range(args.repeat):
                for lib in (libraries if r % 2 == 0 else libraries[::-1]):
                    ctx = Context(args, shard, shard_bytes, lib, built, lengths[lib], proxies, endpoint, namespaces,
                                  tmp, r)
                    rows.extend(ctx.runs())
        finally:
            for p in proxies:
                p.close()
    return built


def layout_lengths(url: str, cache: Path) -> tuple[np.ndarray, int]:
    """(each document's length in the layout, its ``layout.lookahead_tokens``): the layout numbers its documents in
    pack order, and a piece of a split document keeps one token past what its pack reads (the last label;
    spec/COLLECTION.md §9.2), which no batch delivers as an input."""
    import packfmt

    coll = packfmt.open(url, stream=True, cache_dir=cache)
    return np.asarray(coll.doc_lengths), int(coll.manifest.raw["layout"]["lookahead_tokens"])


class Context:
    """One library's runs in one repeat: streamed, then the untimed fill and the cached read."""

    def __init__(self, args, shard, shard_bytes, lib, built, lengths, proxies, endpoint, namespaces, tmp, repeat):
        self.args, self.shard, self.lib, self.proxies = args, shard, lib, proxies
        (self.lengths, self.lookahead), self.corpus_tokens = lengths, built["tokens"]
        self.endpoint, self.namespaces, self.tmp, self.repeat = endpoint, namespaces, tmp, repeat
        fmt = built["formats"][lib]
        self.url, self.nbytes = fmt["url"], fmt["bytes"]
        self.node_limit = int(self.nbytes * args.cache_fraction)
        mean_len = built["tokens"] / built["documents"]
        self.docs_per_batch = max(1, round(args.batch * args.capacity / mean_len))
        self.block = args.shuffle_block_size or self._shuffle_block(built, shard_bytes)
        fmt.update(docs_per_batch=self.docs_per_batch, node_cache_limit=self.node_limit,
                   **({"shuffle_block_size": self.block} if lib == "mds" else {}))

    def _shuffle_block(self, built, shard_bytes: int) -> int:
        """Streaming's shuffle block: whole shards, so that every reader of a node keeps its block (and the next
        shard) inside half the node's cache."""
        shards = max(1, round(self.nbytes / shard_bytes))
        per_shard = max(1, built["documents"] // shards)
        readers = self.args.ranks_per_node * max(1, self.args.workers)
        in_cache = self.node_limit // max(1, self.nbytes // shards)
        return per_shard * max(1, in_cache // (2 * readers) - 1)

    def runs(self) -> list[dict]:
        """The streamed and the cached row; a run that fails ends the library's repeat with a row naming the error
        (the other libraries go on)."""
        out, mode = [], "streamed"
        try:
            out.append(self.run(mode, self.node_limit))
            mode = "fill"
            self.run(mode, None)
            mode = "cached"
            out.append(self.run(mode, None))
        except RuntimeError as exc:
            print(f"{self.lib}, {self.shard}: {exc}", file=sys.stderr, flush=True)
            errors = re.findall(r"^(?:\[rank\d+\]: )?([\w.]+(?:Error|Exception): .*)$", str(exc), re.M)
            out.append({"shard": self.shard, "library": self.lib, "run": mode,
                        "repeat": self.repeat, "error": (errors or [str(exc).splitlines()[0]])[-1][:160]})
        shutil.rmtree(self.tmp / "runs", ignore_errors=True)
        if len(out) == 2:
            base = out[-1]["tokens_per_s"]
            out[0]["vs_cached"] = out[0]["tokens_per_s"] / base if base else float("nan")
        for row in out:
            print("  " + ", ".join(f"{k} {row[k]:.3g}" if isinstance(row[k], float) else f"{k} {row[k]}"
                                   for k in COLUMNS if k in row), flush=True)
        return out

    def run(self, mode: str, node_limit: int | None) -> dict:
        a = self.args
        work = self.tmp / "runs" / f"{self.lib}-{mode}"
        work.mkdir(parents=True)
        folder = "cached" if mode in ("fill", "cached") else "streamed"
        caches = [self.tmp / "runs" / f"cache-{folder}" / f"node{q}" for q in range(a.nodes)]
        world, port = a.nodes * a.ranks_per_node, setup.free_port()
        specs = []
        for q in range(a.nodes):
            specs.append([self.spec(q, l, world, port, caches[q], self.proxies[q].endpoint, node_limit, mode, work)
                          for l in range(a.ranks_per_node)])
        for p in self.proxies:  # the fill goes through the same endpoint (packfmt's cache is keyed by it), unlimited
            p.set(latency=0.0 if mode == "fill" else a.latency_ms / 1e3, rate=0 if mode == "fill" else a.mbps * 1e6)
            p.take()
            p.requests, p.asked = 0, type(p.asked)()
        mounted = setup.mount_tmpfs(caches, 4 * node_limit + (64 << 20)) if node_limit else []
        disk = setup.DiskPeak(caches)
        try:
            t0, results = setup.spawn_nodes(specs, work, self.namespaces, a.run_timeout)
        finally:
            peaks = disk.stop()
            setup.unmount(mounted)
        at_peak = max(range(a.nodes), key=lambda q: peaks[q])
        counts = [p.take() for p in self.proxies]
        got = [sum(c.values()) for c in counts]
        row = {"shard": self.shard, "library": self.lib, "run": mode, "repeat": self.repeat,
               "fetched_bytes": sum(got), "fetched_x": sum(got) / self.nbytes,
               "fetched_by_file": report.by_file(counts, [p.asked for p in self.proxies]),
               "requests": sum(p.requests for p in self.proxies), "disk_peak_bytes": peaks,
               "disk_walk_peak_bytes": disk.walk_peak,
               "disk_measure": "statvfs of a tmpfs a node" if all(disk.mounted) else "a walk of the folder",
               "disk_at_peak": dict(sorted(disk.at_peak[at_peak].items(), key=lambda kv: -kv[1])[:12])}
        if node_limit:
            row["disk_x"] = max(peaks) / node_limit
        if a.profile and mode == "streamed":
            report.print_profile(work / "first_batch.prof",
                                 f"{self.lib}, {self.shard}: rank 0, dataset built to first batch")
        row.update(self.timing(results, t0))
        row.update(self.once(results))
        return row

    def spec(self, q, l, world, port, cache, link, node_limit, mode, work) -> dict:
        a = self.args
        rank = q * a.ranks_per_node + l
        limit = node_limit  # every library's limit is the node's (packfmt's ledger shares it among the node's processes)
        env = {"RANK": rank, "WORLD_SIZE": world, "LOCAL_RANK": l, "LOCAL_WORLD_SIZE": a.ranks_per_node,
               "NODE_RANK": q, "GLOBAL_RANK": rank, "NNODES": a.nodes, "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": port, "AWS_ENDPOINT_URL": link, "S3_ENDPOINT_URL": link, "OMP_NUM_THREADS": 1}
        if self.lib == "packfmt":
            env.update(PYTHONPATH=str(setup.ROOT))
        return {"library": self.lib, "url": self.url, "cache_dir": str(cache), "cache_limit": limit, "rank": rank,
                "world": world, "nodes": a.nodes, "workers": a.workers, "batch": a.batch,
                "docs_per_batch": self.docs_per_batch, "batch_tokens": a.batch * a.capacity,
                "step_s": 0.0 if mode == "fill" else a.step_ms / 1e3, "seed": 0, "window": a.window,
                "balance": a.balance, "shuffle_block_size": self.block, "endpoint": link,
                "num_docs": int(self.lengths.shape[0]), "dist_port": port, "out": str(work / f"out{rank}.json"),
                "delivered": str(work / f"delivered{rank}.npy"),
                "profile": str(work / "first_batch.prof") if a.profile and mode == "streamed" and rank == 0 else None,
                "env": {k: str(v) for k, v in env.items()},
                "python": sys.executable if self.lib == "packfmt" else self.args.peers_python}

    def timing(self, results: list[dict], t0: float) -> dict:
        rates = []
        for r in results:
            toks, times = np.asarray(r["tokens"], dtype=np.int64), np.asarray(r["times"])
            if toks.size < 2:
                continue
            w = int(np.searchsorted(np.cumsum(toks), self.args.warmup * toks.sum()))
            w = min(w, toks.size - 1)
            rates.append(toks[w:].sum() / max(1e-9, r["t_end"] - times[w]))
        first = [r["times"][0] for r in results if r["times"]]
        return {"ttfb_process_s": max(first) - t0 if first else float("nan"),
                "ttfb_dataset_s": max(r["times"][0] - r["t_dist"] for r in results if r["times"]),
                "import_s": max(r["t_dist"] - t0 for r in results),
                "tokens_per_s": float(sum(rates)), "epoch_s": max(r["t_end"] for r in results) - t0,
                "batches": sum(len(r["tokens"]) for r in results)}

    def once(self, results: list[dict]) -> dict:
        """Documents delivered short / over, all ranks together; ``lookahead`` documents may be one token short (a
        layout's split pieces)."""
        got = sum(r["delivered"] for r in results)
        short = int(np.count_nonzero(got < self.lengths - 1))
        short += max(0, int(np.count_nonzero(got == self.lengths - 1)) - self.lookahead)
        return {"missing_docs": short, "extra_docs": int(np.count_nonzero(got > self.lengths)),
                "tokens_x": float(got.sum() / self.corpus_tokens)}


if __name__ == "__main__":
    sys.exit(main())
