"""Cold and warm read of a remote collection through the cache, against the same collection on local disk.

The collection of ``bench_collection_read.py`` (lognormal document lengths, uint16 ids, M member
stores, one shuffled next-fit pack index of capacity 4096) is written locally, then uploaded as it
is to an S3-protocol server started here: moto in server mode on 127.0.0.1 (nothing leaves the
machine; moto is a Python server, so the cold figure measures packfmt's cache over a slow loopback
S3, not a real bucket's bandwidth). Each row is ``PackedDataset(path)`` opened and every pack read
in batches of 8 (``__getitems__`` + ``collate_varlen``), timed end to end from the open:

- ``local``: the collection on local disk;
- ``remote, cold cache``: ``s3://`` with an empty ``$PACKFMT_CACHE``: every member file is fetched,
  hashed while it streams and checked against its manifest before it is mapped;
- ``remote, warm cache``: ``s3://`` again with the cache from the cold run: manifests re-read from
  the bucket (they are the commit points), files reused without a byte downloaded.

Best of ``--repeat`` runs (a fresh cache for every cold run).

    python benchmarks/bench_remote.py [--docs 100000] [--members 20] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_collection_read import make, read_all as _read_batches  # noqa: E402
from common import RESULTS_DIR, machine_info, print_table, write_json  # noqa: E402

from packfmt.torch import PackedDataset  # noqa: E402


def start_server() -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(300):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.1)
    os.environ.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_ACCESS_KEY_ID="bench",
                      AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true")
    return proc, f"http://127.0.0.1:{port}"


def timed_read(path: str) -> tuple[float, int]:
    """Open (fetching what the cache lacks) and read every pack; seconds from before the open."""
    t0 = time.perf_counter()
    PackedDataset(path, "p")
    opened = time.perf_counter() - t0
    seconds, tokens = _read_batches(path)  # reopens: warm now, so this is the read alone
    return opened + seconds, tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=100_000)
    ap.add_argument("--members", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    proc, endpoint = start_server()
    try:
        import s3fs

        fs = s3fs.S3FileSystem()
        fs.mkdir("bench")
        with tempfile.TemporaryDirectory(prefix="bench_remote_") as tmp:
            tmp = Path(tmp)
            _, coll = make(tmp / "data", args.docs, args.members)
            fs.put(str(tmp / "data") + "/", "bench/data/", recursive=True)
            nbytes = sum(f.stat().st_size for f in (tmp / "data").rglob("*") if f.is_file() and "single" not in f.parts)
            url = "s3://bench/data/coll"
            cache = tmp / "cache"
            os.environ["PACKFMT_CACHE"] = str(cache)
            best = {k: (float("inf"), 0) for k in ("local", "remote, cold cache", "remote, warm cache")}
            fetched = 0
            for _ in range(args.repeat):
                best["local"] = min(best["local"], timed_read(str(coll)))
                shutil.rmtree(cache, ignore_errors=True)
                best["remote, cold cache"] = min(best["remote, cold cache"], timed_read(url))
                fetched = sum(json.loads(line)["bytes"] for line in (cache / "downloads.log").read_text().splitlines())
                best["remote, warm cache"] = min(best["remote, warm cache"], timed_read(url))
    finally:
        proc.terminate()
        proc.wait()
    rows = [{"case": case, "members": args.members, "tokens": tokens, "seconds": seconds,
             "tokens_per_s": tokens / seconds} for case, (seconds, tokens) in best.items()]
    for row in rows:
        row["vs_local"] = row["tokens_per_s"] / rows[0]["tokens_per_s"]
    print_table(rows, ["case", "members", "tokens", "seconds", "tokens_per_s", "vs_local"],
                title=f"open + read every pack, best of {args.repeat}; cold run fetched {fetched:,} bytes "
                      f"({nbytes:,} bytes of member and index files) from moto at {endpoint}")
    write_json(RESULTS_DIR / "bench_remote.json", {"rows": rows, "fetched_bytes": fetched, "dataset_bytes": nbytes,
                                                   "server": "moto (server mode, 127.0.0.1)", "machine": machine_info(),
                                                   "args": vars(args)})


if __name__ == "__main__":
    main()
