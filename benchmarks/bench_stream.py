"""A remote collection read streamed (``stream=True``, cache bounded to 10% of it, exact prefetch) vs fully
cached, behind a bandwidth cap.

The collection (lognormal document lengths, uint16 ids, M members, one next-fit pack index of capacity
4096 in document order) is uploaded to moto (S3 protocol, 127.0.0.1); reads go through a local TCP proxy
that caps the bytes it forwards to ``--mbps`` MB/s in total (a token bucket shared by all connections):
the honest stand-in for a network link. Rows, packs read in order in batches of 8 after ``--warmup``
batches, each followed by a simulated training step of ``--step-ms`` (the time prefetch overlaps; 0 measures
the loader alone, which a streamed read can only feed at the link's rate):

- ``fully cached``: ``PackedDataset(url)``: every member fetched at open (not timed), then read;
- ``streamed``: ``PackedDataset(url, stream=True, cache_limit=10%)`` + ``prefetch(ds, order)``: members
  fetched while the batches before them are read.

    python benchmarks/bench_stream.py [--docs 40000] [--members 40] [--mbps 2] [--step-ms 50]
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
from common import RESULTS_DIR, machine_info, print_table, web_like_corpus, write_json  # noqa: E402

from packfmt.collection import write_collection  # noqa: E402
from packfmt.storage.upload import upload_tree  # noqa: E402
from packfmt.torch import PackedDataset  # noqa: E402
from packfmt.torch.prefetch import prefetch  # noqa: E402
from packfmt.torch.testing import next_fit_segments, write_flat_dataset, write_pack_index  # noqa: E402

CAPACITY, BATCH = 4096, 8


class Throttle:
    """A TCP proxy to ``target`` forwarding at most ``rate`` bytes/s in total (both directions)."""

    def __init__(self, target: tuple[str, int], rate: float) -> None:
        self.target, self.rate, self.lock, self.allowance, self.t = target, rate, threading.Lock(), 0.0, time.monotonic()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _take(self, n: int) -> None:
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

    def _pipe(self, a: socket.socket, b: socket.socket) -> None:
        try:
            while chunk := a.recv(65536):
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
            threading.Thread(target=self._pipe, args=(c, u), daemon=True).start()
            threading.Thread(target=self._pipe, args=(u, c), daemon=True).start()


def make(root: Path, n_docs: int, members: int) -> tuple[Path, int]:
    rng, lengths, offsets, tokens = web_like_corpus(n_docs)
    cuts = np.linspace(0, n_docs, members + 1).astype(np.int64)
    paths = []
    for m in range(members):
        a, b = cuts[m], cuts[m + 1]
        paths.append(root / "members" / f"m{m:05d}")
        write_flat_dataset(paths[-1], tokens[offsets[a]:offsets[b]], offsets[a:b + 1] - offsets[a], vocab_size=50_000)
    coll = write_collection(root / "coll", [(None, p) for p in paths])
    segs, po = next_fit_segments(lengths, CAPACITY)
    write_pack_index(coll, segs, po, capacity=CAPACITY, name="p")
    nbytes = sum(f.stat().st_size for p in paths for f in p.iterdir() if f.name != "manifest.json")
    return coll.path, nbytes


def read(ds, warmup: int, step_s: float) -> tuple[float, int]:
    order = np.arange(len(ds))
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
    args = ap.parse_args()
    proc, endpoint = start_server()
    try:
        import s3fs

        s3fs.S3FileSystem().mkdir("bench")
        with tempfile.TemporaryDirectory(prefix="bench_stream_") as tmp:
            tmp = Path(tmp)
            _, nbytes = make(tmp / "data", args.docs, args.members)
            upload_tree(tmp / "data", "s3://bench/data")
            port = int(endpoint.rsplit(":", 1)[1])
            proxy = Throttle(("127.0.0.1", port), args.mbps * 1e6)
            os.environ["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{proxy.port}"
            s3fs.S3FileSystem.clear_instance_cache()
            url, rows = "s3://bench/data/coll", []
            os.environ["PACKFMT_CACHE"] = str(tmp / "cache-full")
            t0 = time.perf_counter()
            full = PackedDataset(url, "p")
            open_s = time.perf_counter() - t0
            seconds, tokens = read(full, args.warmup, args.step_ms / 1e3)
            rows.append({"case": "fully cached", "open_s": open_s, "tokens": tokens, "seconds": seconds})
            os.environ["PACKFMT_CACHE"] = str(tmp / "cache-stream")
            t0 = time.perf_counter()
            ds = PackedDataset(url, "p", stream=True, cache_limit=nbytes // 10)
            open_s = time.perf_counter() - t0
            prefetch(ds, np.arange(len(ds)), batch_size=BATCH)
            seconds, tokens = read(ds, args.warmup, args.step_ms / 1e3)
            fetched = sum(json.loads(line)["bytes"] for line in (tmp / "cache-stream" / "downloads.log").read_text()
                          .splitlines() if "/members/" in line)
            rows.append({"case": "streamed, limit 10%", "open_s": open_s, "tokens": tokens, "seconds": seconds})
    finally:
        proc.terminate()
        proc.wait()
    for row in rows:
        row["tokens_per_s"] = row["tokens"] / row["seconds"]
        row["vs_cached"] = row["tokens_per_s"] / rows[0]["tokens_per_s"]
    print_table(rows, ["case", "open_s", "tokens", "seconds", "tokens_per_s", "vs_cached"],
                title=f"read in order after {args.warmup} warm-up batches, {args.step_ms} ms step per batch, {args.mbps} MB/s cap; members "
                      f"{nbytes:,} bytes, streamed fetched {fetched:,} bytes of members")
    write_json(RESULTS_DIR / "bench_stream.json", {"rows": rows, "fetched_bytes": fetched, "member_bytes": nbytes,
                                                   "bandwidth_MBps": args.mbps, "machine": machine_info(),
                                                   "args": vars(args)})


if __name__ == "__main__":
    main()
