"""Cold fetch of a remote store through the cache with 1, 2, 4, 8 ranged GETs in flight per file, behind a link
that caps each connection (an object store's per-stream throughput) and all of them together.

A store of ``--mib`` MiB of uint16 tokens (random ids, 1,000 documents) is written locally and uploaded to moto
(the S3 protocol, 127.0.0.1); reads go through a TCP proxy that forwards at most ``--conn-mbps`` MB/s on each
connection and ``--mbps`` MB/s over all of them (token buckets; the stand-in for a real bucket, where one stream runs
at tens to a few hundred MB/s and the node's link is wider). Each row is ``packfmt.open(url)`` from an empty cache
(every file fetched, hashed and checked before it is mapped) with ``$PACKFMT_FETCH_RANGES`` set to the row's value:
``fetch_s`` best of ``--repeat``, ``MB_per_s`` the store's bytes over that, ``speedup`` against one range at a time
(the fetch before ranges were kept in flight).

``--members N``: instead, a collection of N small members (``--member-kib`` KiB of tokens each) behind a proxy that
delays every request by ``--latency-ms`` (a far bucket's round trip), opened whole with ``$PACKFMT_FETCH_MEMBERS``
set to each of ``--members-in-flight``: ``fetch_s``, ``members_per_s`` and ``speedup`` against one member at a time.
``--memory``: the collection on fsspec's ``memory://`` file system instead (no server, no network): what packfmt's
own work costs a member (files hashed, written, fsync'd, markers, locks), ``ms_per_member``, and of it the CPU time
of this process, ``cpu_ms_per_member`` (steadier than wall time where fsync latency varies, as on this machine).
``mirror_open_s``: then ``packfmt.open`` of the mirror's local path, as a DataLoader worker re-opens what its parent
fetched (every member's cached files checked against their markers, ``remote.check_mirror``).

    python benchmarks/bench_fetch.py [--mib 64] [--conn-mbps 8] [--mbps 64] [--in-flight 1,2,4,8] [--repeat 2]
    python benchmarks/bench_fetch.py --members 200 [--member-kib 4] [--latency-ms 20] [--members-in-flight 1,4,8,16]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_remote import start_server  # noqa: E402
from bench_stream import Throttle  # noqa: E402
from common import RESULTS_DIR, machine_info, print_table, write_json  # noqa: E402

import packfmt  # noqa: E402
from packfmt.storage.download import RANGES_ENV  # noqa: E402
from packfmt.storage.upload import upload_tree  # noqa: E402
from packfmt.torch.testing import write_flat_dataset  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=64, help="MiB of tokens in the store")
    ap.add_argument("--conn-mbps", type=float, default=8.0, help="MB/s on each connection")
    ap.add_argument("--mbps", type=float, default=64.0, help="MB/s over all connections")
    ap.add_argument("--in-flight", default="1,2,4,8", help="values of $PACKFMT_FETCH_RANGES, one row each")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--out", default=None, help="file name under benchmarks/results/ (default bench_fetch.json, "
                    "bench_fetch_members.json with --members)")
    ap.add_argument("--members", type=int, default=0, help="time a collection of this many members instead")
    ap.add_argument("--member-kib", type=int, default=4)
    ap.add_argument("--latency-ms", type=float, default=20.0, help="with --members: delay of every request")
    ap.add_argument("--members-in-flight", default="1,4,8,16", help="values of $PACKFMT_FETCH_MEMBERS, one row each")
    ap.add_argument("--memory", action="store_true", help="with --members: memory:// instead of moto (no network)")
    args = ap.parse_args()
    if args.members:
        return members(args)
    args.out = args.out or "bench_fetch.json"
    import s3fs

    root = Path(tempfile.mkdtemp(prefix="bench_fetch_"))
    proc, endpoint = start_server()
    try:
        n_tokens = args.mib * (1 << 20) // 2
        tokens = np.random.default_rng(0).integers(0, 50_000, n_tokens, dtype=np.uint16)
        offsets = np.linspace(0, n_tokens, 1001).astype(np.int64)
        write_flat_dataset(root / "ds", tokens, offsets, vocab_size=50_000)
        store_bytes = sum(f.stat().st_size for f in (root / "ds").iterdir())
        s3fs.S3FileSystem().mkdir("bench")
        upload_tree(root / "ds", "s3://bench/ds")
        host, port = endpoint.rsplit(":", 1)
        proxy = Throttle((host.split("//")[1], int(port)), args.mbps * 1e6, per_connection=args.conn_mbps * 1e6)
        os.environ["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{proxy.port}"
        rows, base = [], None
        for k in [int(x) for x in args.in_flight.split(",")]:
            os.environ[RANGES_ENV] = str(k)
            best = float("inf")
            for _ in range(args.repeat):
                s3fs.S3FileSystem.clear_instance_cache()
                cache = root / f"cache-{k}"
                shutil.rmtree(cache, ignore_errors=True)
                t0 = time.perf_counter()
                ds = packfmt.open("s3://bench/ds", cache_dir=cache)
                best = min(best, time.perf_counter() - t0)
                assert ds.num_tokens == n_tokens
                del ds
            base = base or best
            rows.append({"in_flight": k, "store_MiB": round(store_bytes / (1 << 20), 1), "fetch_s": round(best, 2),
                         "MB_per_s": round(store_bytes / best / 1e6, 1), "speedup": round(base / best, 2)})
            print(rows[-1], flush=True)
    finally:
        proc.terminate()
        shutil.rmtree(root, ignore_errors=True)
    print_table(rows, ["in_flight", "store_MiB", "fetch_s", "MB_per_s", "speedup"])
    write_json(RESULTS_DIR / args.out, {"machine": machine_info(), "args": vars(args), "rows": rows})


def members(args) -> None:
    """``--members``: one collection of small members, opened whole from an empty cache per row."""
    import s3fs

    from packfmt.collection import write_collection
    from packfmt.storage.in_flight import MEMBERS_ENV
    from packfmt.torch.testing import write_split_stores

    args.out = args.out or "bench_fetch_members.json"
    root = Path(tempfile.mkdtemp(prefix="bench_fetch_members_"))
    proc, endpoint = start_server()
    try:
        per = args.member_kib * 512  # uint16 tokens of a member
        tokens = np.random.default_rng(0).integers(0, 50_000, per * args.members, dtype=np.uint16)
        offsets = np.linspace(0, tokens.shape[0], 4 * args.members + 1).astype(np.int64)  # 4 documents a member
        paths = write_split_stores(root / "src" / "members", tokens, offsets, np.arange(0, 4 * args.members + 1, 4),
                                   vocab_size=50_000)
        write_collection(root / "src" / "coll", [(None, p) for p in paths])
        if args.memory:
            import fsspec

            mem = fsspec.filesystem("memory")
            for p in sorted((root / "src").rglob("*")):
                if p.is_file():
                    mem.pipe_file(f"memory://bench/m/{p.relative_to(root / 'src')}", p.read_bytes())
            url, args.latency_ms = "memory://bench/m/coll", 0.0
        else:
            s3fs.S3FileSystem().mkdir("bench")
            upload_tree(root / "src", "s3://bench/m")
            host, port = endpoint.rsplit(":", 1)
            proxy = Throttle((host.split("//")[1], int(port)), 1e12, latency=args.latency_ms / 1000)
            os.environ["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{proxy.port}"
            url = "s3://bench/m/coll"
        rows, base = [], None
        for k in [int(x) for x in args.members_in_flight.split(",")]:
            os.environ[MEMBERS_ENV] = str(k)
            best = cpu = float("inf")
            for _ in range(args.repeat):
                s3fs.S3FileSystem.clear_instance_cache()
                cache = root / f"cache-{k}"
                shutil.rmtree(cache, ignore_errors=True)
                t0, c0 = time.perf_counter(), time.process_time()
                ds = packfmt.open(url, cache_dir=cache)
                best = min(best, time.perf_counter() - t0)
                cpu = min(cpu, time.process_time() - c0)  # this process's CPU (not the waits on fsync or the server)
                assert len(ds.members) == args.members and ds.num_tokens == tokens.shape[0]
                mirror = ds.path
                del ds
            reopen = float("inf")  # a local open of the mirror (a DataLoader worker's): every member's markers checked
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                packfmt.open(mirror)
                reopen = min(reopen, time.perf_counter() - t0)
            base = base or best
            rows.append({"members": args.members, "latency_ms": args.latency_ms, "members_in_flight": k,
                         "fetch_s": round(best, 2), "members_per_s": round(args.members / best, 1),
                         "ms_per_member": round(1e3 * best / args.members, 2),
                         "cpu_ms_per_member": round(1e3 * cpu / args.members, 2), "speedup": round(base / best, 2),
                         "mirror_open_s": round(reopen, 3)})
            print(rows[-1], flush=True)
    finally:
        proc.terminate()
        shutil.rmtree(root, ignore_errors=True)
    print_table(rows, ["members", "latency_ms", "members_in_flight", "fetch_s", "members_per_s", "ms_per_member",
                       "cpu_ms_per_member", "speedup", "mirror_open_s"])
    write_json(RESULTS_DIR / args.out, {"machine": machine_info(), "args": vars(args), "rows": rows})


if __name__ == "__main__":
    main()
