"""A remote collection read streamed (``stream=True``, cache bounded to 10% of it, exact prefetch) vs fully
cached, behind a bandwidth cap.

The collection (lognormal document lengths, uint16 ids, M members, one next-fit pack index of capacity
4096 in document order: ``--packs member`` cuts the packs at member boundaries, as pack-ordered shards lay
them out; ``--packs collection`` fills packs across them, so a pack may hold the end of one member and the
start of the next) is uploaded to moto (S3 protocol, 127.0.0.1); reads go through a local TCP proxy
that caps the bytes it forwards to ``--mbps`` MB/s in total (a token bucket shared by all connections):
the honest stand-in for a network link. Rows: packs read in batches of 8 after ``--warmup``
batches, each followed by a simulated training step of ``--step-ms`` (the time prefetch overlaps; 0 measures
the loader alone, which a streamed read can only feed at the link's rate):

- ``fully cached``: ``PackedDataset(url)``: every member fetched at open (not timed), then read;
- ``streamed``: ``PackedDataset(url, stream=True, cache_limit=10%)`` + ``prefetch(ds, order, threads=T)``:
  members fetched while the batches before them are read, ``T`` at once (``--threads``, one row each).

Each in three orders, side by side (``vs_cached``: streamed over fully cached in the same order):

- ``in order``: packs 0, 1, 2, ... (each member fetched once);
- ``window K`` (``--window``, default 2; 0 leaves it out): ``DistributedPackSampler(ds, window=K)``'s shuffled
  epoch, whole members K at a time (spec/READER.md §6);
- ``shuffle``: the plain shuffle of all packs, only its first ``--shuffle-batches`` batches (a member is fetched
  again each time it comes back after being evicted: a whole epoch takes minutes at 2 MB/s; -1 reads it whole,
  0 leaves it out).

``fetched_x``: member bytes fetched over the member bytes of the packs read (in order: 1.0); with ``--packs shards`` a
shard's bytes include its rows of the layout's index (fetched with it, counted with it by ``cache_limit``).

``--packs shards`` is the real pipeline (issue 18): one ffd index over the whole collection (each pack
mixes members), ``write_shards`` (``packfmt pack --shards``) rewrites its packs in pack order as shards of
``--shard-size``, and the shards are what is uploaded and read (members = shards in the rows).

    python benchmarks/bench_stream.py [--docs 40000] [--members 40] [--mbps 2] [--step-ms 50] [--window 2]
    python benchmarks/bench_stream.py --packs shards --members 200 --shard-size 1MiB
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_remote import start_server  # noqa: E402
from bench_stream_open import node_limit  # noqa: E402
from common import RESULTS_DIR, machine_info, print_table, web_like_corpus, write_json  # noqa: E402

from packfmt.collection import write_collection  # noqa: E402
from packfmt.collection.shards import parse_size, write_shards  # noqa: E402
from packfmt.packindex import build_pack_index  # noqa: E402
from packfmt.storage.errors import StorageError  # noqa: E402
from packfmt.storage.upload import upload_tree  # noqa: E402
from packfmt.torch import DistributedPackSampler, PackedDataset  # noqa: E402
from packfmt.torch.prefetch import prefetch  # noqa: E402
from packfmt.torch.testing import (  # noqa: E402
    next_fit_members,
    next_fit_segments,
    write_flat_dataset,
    write_pack_index,
)

CAPACITY, BATCH = 4096, 8


class Bucket:
    """A token bucket of ``rate`` bytes/s: ``take(n)`` waits until ``n`` bytes may pass."""

    def __init__(self, rate: float) -> None:
        self.rate, self.lock, self.allowance, self.t = rate, threading.Lock(), 0.0, time.monotonic()

    def take(self, n: int) -> None:
        while True:
            with self.lock:
                now = time.monotonic()
                self.allowance = min(self.rate * 0.1, self.allowance + (now - self.t) * self.rate)
                self.t = now
                if self.allowance >= n or self.allowance >= self.rate * 0.05:
                    self.allowance -= n
                    return
                wait = (min(n, self.rate * 0.05) - self.allowance) / self.rate
            time.sleep(wait)


class Throttle:
    """A TCP proxy to ``target`` forwarding at most ``rate`` bytes/s in total (both directions), and at most
    ``per_connection`` bytes/s on each connection when given (an object store's per-stream rate). ``latency``:
    seconds each chunk the client sends (a request) waits before it is forwarded: a round trip to a far bucket."""

    def __init__(self, target: tuple[str, int], rate: float, per_connection: float | None = None,
                 latency: float = 0.0) -> None:
        self.target, self.rate, self.bucket, self.per_connection = target, rate, Bucket(rate), per_connection
        self.latency = latency
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _take(self, n: int) -> None:
        self.bucket.take(n)

    def _pipe(self, a: socket.socket, b: socket.socket, delay: float = 0.0) -> None:
        own = Bucket(self.per_connection) if self.per_connection else None
        try:
            while chunk := a.recv(65536):
                if delay:
                    time.sleep(delay)
                if own is not None:
                    own.take(len(chunk))
                self._take(len(chunk))
                b.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _accept(self) -> None:
        while True:
            c, _ = self.sock.accept()
            u = socket.create_connection(self.target)
            threading.Thread(target=self._pipe, args=(c, u, self.latency), daemon=True).start()
            threading.Thread(target=self._pipe, args=(u, c), daemon=True).start()


def make(root: Path, n_docs: int, members: int, packs: str, shard_bytes: int) -> tuple[Path, int, np.ndarray]:
    """(the tree to upload as ``coll``, its member bytes, bytes of each member)."""
    rng, lengths, offsets, tokens = web_like_corpus(n_docs)
    cuts = np.linspace(0, n_docs, members + 1).astype(np.int64)
    paths = []
    for m in range(members):
        a, b = cuts[m], cuts[m + 1]
        paths.append(root / "members" / f"m{m:05d}")
        write_flat_dataset(paths[-1], tokens[offsets[a]:offsets[b]], offsets[a:b + 1] - offsets[a], vocab_size=50_000)
    coll = write_collection(root / "coll", [(None, p) for p in paths])
    if packs == "shards":  # the real pipeline: one global ffd index (packs mix members), its packs as shards
        build_pack_index(coll, capacity=CAPACITY, algorithm="ffd", name="p")
        coll = write_shards(coll, "p", root / "shards", shard_bytes=shard_bytes)
        paths = [Path(coll.member_path(m)) for m in range(len(coll.members))]
    elif packs == "member":
        write_pack_index(coll, *next_fit_members(lengths, coll.doc_start, CAPACITY), capacity=CAPACITY, name="p")
    else:
        write_pack_index(coll, *next_fit_segments(lengths, CAPACITY), capacity=CAPACITY, name="p")
    member_bytes = np.array([sum(f.stat().st_size for f in p.iterdir() if f.name != "manifest.json") for p in paths])
    if packs == "shards":  # a shard's rows of the layout's index are read (and counted by cache_limit) with it
        member_bytes += np.array([8 * (p + 1) + 24 * int(m.documents) for m, p in
                                  zip(coll.members, coll.manifest.raw["layout"]["member_packs"])])
    return (coll.path if packs == "shards" else root), int(member_bytes.sum()), member_bytes


def read(ds, order: np.ndarray, warmup: int, step_s: float) -> tuple[float, int]:
    batches = [order[j:j + BATCH] for j in range(0, len(order), BATCH)]
    for b in batches[:warmup]:
        ds.__getitems__(b)
    t0, tokens = time.perf_counter(), 0
    for b in batches[warmup:]:
        tokens += int(ds.__getitems__(b).lengths.sum())
        time.sleep(step_s)  # the training step the loader feeds (prefetch overlaps it)
    return time.perf_counter() - t0, tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=40_000)
    ap.add_argument("--members", type=int, default=40)
    ap.add_argument("--mbps", type=float, default=2.0, help="bandwidth cap, MB/s")
    ap.add_argument("--step-ms", type=float, default=50.0, help="simulated training step per batch (0: read only)")
    ap.add_argument("--warmup", type=int, default=4, help="batches read before the timing")
    ap.add_argument("--packs", choices=("member", "collection", "shards"), default="member",
                    help="next fit within each member (as pack-ordered shards lay them out), next fit across the whole "
                         "collection, or shards: a global ffd index over the members written by `pack --shards`")
    ap.add_argument("--threads", default="1,2", type=lambda t: [int(x) for x in t.split(",")],
                    help="prefetch threads of the streamed rows, one row each (default 1,2)")
    ap.add_argument("--shard-size", default="2MiB", help="--packs shards: bytes per shard (default 2MiB)")
    ap.add_argument("--window", type=int, default=2, help="members per window of the window-shuffle rows (0: none)")
    ap.add_argument("--shuffle-batches", type=int, default=16,
                    help="batches of the plain-shuffle rows (0: none; -1: the whole epoch, which refetches members)")
    args = ap.parse_args()
    proc, endpoint = start_server()
    try:
        import s3fs

        s3fs.S3FileSystem().mkdir("bench")
        with tempfile.TemporaryDirectory(prefix="bench_stream_") as tmp:
            tmp = Path(tmp)
            tree, nbytes, member_bytes = make(tmp / "data", args.docs, args.members, args.packs,
                                              parse_size(args.shard_size))
            upload_tree(tree, "s3://bench/data" if args.packs != "shards" else "s3://bench/data/coll")
            shards = len(member_bytes)
            port = int(endpoint.rsplit(":", 1)[1])
            proxy = Throttle(("127.0.0.1", port), args.mbps * 1e6)
            os.environ["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{proxy.port}"
            s3fs.S3FileSystem.clear_instance_cache()
            url, rows = "s3://bench/data/coll", []
            os.environ["PACKFMT_CACHE"] = str(tmp / "cache-full")
            t0 = time.perf_counter()
            full = PackedDataset(url, "p")
            full_open_s = time.perf_counter() - t0
            orders = [("in order", np.arange(len(full)))]
            if args.window:
                orders.append((f"window {args.window}", DistributedPackSampler(
                    full, 1, 0, seed=0, window=args.window).epoch_indices()))
            if args.shuffle_batches:
                shuffled = DistributedPackSampler(full, 1, 0, seed=0).epoch_indices()
                if args.shuffle_batches > 0:
                    shuffled = shuffled[:(args.warmup + args.shuffle_batches) * BATCH]
                orders.append(("shuffle" if args.shuffle_batches < 0 else f"shuffle, first {args.shuffle_batches} "
                               "batches", shuffled))
            for name, order in orders:
                seconds, tokens = read(full, order, args.warmup, args.step_ms / 1e3)
                rows.append({"order": name, "case": "fully cached", "open_s": full_open_s, "tokens": tokens,
                             "seconds": seconds})
                for threads in args.threads:
                    case = f"streamed, limit 10%, {threads} thread{'s' if threads > 1 else ''}"
                    cache = tmp / f"cache-stream-{len(rows)}"
                    os.environ["PACKFMT_CACHE"] = str(cache)
                    t0 = time.perf_counter()
                    limit = node_limit(url, "p", nbytes // 10, cache)  # (untimed: the same members in this packfmt)
                    ds = PackedDataset(url, "p", stream=True, cache_limit=limit)
                    open_s = time.perf_counter() - t0
                    # (threads=1 is left out: this script then also runs against a packfmt without it, for before/after)
                    prefetch(ds, order, batch_size=BATCH, **({"threads": threads} if threads != 1 else {}))
                    try:
                        seconds, tokens = read(ds, order, args.warmup, args.step_ms / 1e3)
                    except StorageError as e:  # a batch touches more members than the limit holds (plain shuffle)
                        rows.append({"order": name, "case": case, "error": str(e).split(":")[1].strip()})
                        print(f"{name}, streamed: {e}", file=sys.stderr)
                        continue
                    fetched = sum(e["bytes"] for e in map(json.loads, (cache / "downloads.log").read_text()
                                                          .splitlines()) if "/members/" in e["url"] or "/shards/" in e["url"]
                                  or e.get("why", "").startswith("rows of shard"))  # a shard's index rows: with it
                    rows.append({"order": name, "case": case, "open_s": open_s, "tokens": tokens,
                                 "seconds": seconds, "fetched_bytes": fetched,
                                 "fetched_x": fetched / _bytes_touched(full, order, member_bytes)})
                    del ds
    finally:
        proc.terminate()
        proc.wait()
    for row in rows:
        if "error" in row:
            continue
        row["tokens_per_s"] = row["tokens"] / row["seconds"]
        cached = next(r for r in rows if r["order"] == row["order"] and r["case"] == "fully cached")
        row["vs_cached"] = row["tokens_per_s"] / cached["tokens_per_s"]
    print_table(rows, ["order", "case", "open_s", "tokens", "seconds", "tokens_per_s", "vs_cached", "fetched_x",
                       "error"],
                title=f"after {args.warmup} warm-up batches, {args.step_ms} ms step per batch, {args.mbps} MB/s cap; "
                      f"{args.members} members, {nbytes:,} bytes, " + (
                          f"global ffd index as {shards} shards of {args.shard_size}" if args.packs == "shards" else
                          f"packs next fit per {args.packs}"))
    write_json(RESULTS_DIR / ("bench_stream.json" if args.packs == "member" else f"bench_stream_{args.packs}.json"), {"rows": rows, "member_bytes": nbytes, "bandwidth_MBps": args.mbps,
                                                   "machine": machine_info(), "args": vars(args)})


def _bytes_touched(ds, order: np.ndarray, member_bytes: np.ndarray) -> int:
    """Bytes of the members the packs of ``order`` touch (each member once)."""
    po, segs = np.asarray(ds.index.pack_offsets), np.asarray(ds.index.segments)
    docs = np.concatenate([segs[po[p]:po[p + 1], 0] for p in order])
    return int(member_bytes[np.unique(ds.store.member_of(docs))].sum())


if __name__ == "__main__":
    main()
