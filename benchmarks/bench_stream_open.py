"""Time to first batch of a remote collection read streamed (``stream=True``) at 10^7 documents, beside the same
collection opened locally and fetched whole.

A collection of ``--docs`` short documents (1-8 tokens, uint16 ids) over ``--members`` members (even cuts;
``write_split_stores`` + ``write_collection``: a member table from 256 members on, the writer's default) with one
ffd pack index of capacity ``--capacity`` (``build_pack_index``) is written once per member count and put on
fsspec's ``memory://`` file system (``memory://bench/data/coll``): the storage layer's own code path
(``packfmt.storage``: manifests re-read, files fetched by ranged ``cat_file`` and hashed, fsync'd into the cache,
markers written) with no network, so what is left is what packfmt itself does. Three stages, each timed
in-process from a cold cache directory every time (best of ``--repeat``):

- ``open``: ``packfmt.open(src, ...)``;
- ``ready``: ``open`` + ``pack_index("p")`` (what ``PackedDataset`` construction does: time to ready-to-read);
- ``first batch``: ``PackedDataset(src, "p", ...)`` + ``__getitems__([0 .. batch))`` (pack 0 by default).

Three modes, side by side: ``stream`` (``src`` the URL, ``stream=True, cache_limit=`` 10% of the member bytes, at
least two members), ``local`` (``src`` the collection's local path: no storage layer) and ``cached`` (``src`` the URL without
``stream``: every member and pack index fetched at open). Every (mode, stage) runs in its own spawned child, so its
peak RSS is its own: ``peak_rss_mb`` is the child's VmHWM, ``added_rss_mb`` the peak above the child's RSS once set
up (Python, imports, and for the URL modes the ``memory://`` copy of the tree, loaded before the peak is reset
through ``/proc/self/clear_refs``). ``fetched_mb``: bytes the storage layer wrote into the cache
(``downloads.log``); ``read_mb`` / ``requests``: bytes and calls of ``cat_file`` on the memory file system
(manifests included). ``--profile``: cProfile of the first-batch stage of each mode and member count (top entries
printed). ``--in-process``: no children (no RSS columns; the smoke test's mode).

    python benchmarks/bench_stream_open.py [--docs 10000000] [--members 100,1000] [--repeat 3] [--capacity 4096]
        [--batch 1] [--profile] [--in-process] [--out benchmarks/results/bench_stream_open.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS_DIR, machine_info, print_table, write_json

URL = "memory://bench/data/coll"
MODES = ("stream", "local", "cached")
STAGES = ("open", "ready", "first batch")
INDEX = "p"
COMMITS = ("manifest.json", "index.json")


def make(root: Path, n_docs: int, members: int, capacity: int) -> dict:
    """Members under ``root/stores``, the collection at ``root/coll`` with pack index ``p``; a summary."""
    from packfmt.collection import write_collection
    from packfmt.packindex import build_pack_index
    from packfmt.torch.testing import write_split_stores

    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 9, n_docs)
    offsets = np.zeros(n_docs + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tokens = rng.integers(0, 50_000, int(offsets[-1]), dtype=np.uint16)
    t0 = time.perf_counter()
    paths = write_split_stores(root / "stores", tokens, offsets, np.linspace(0, n_docs, members + 1).astype(np.int64),
                               vocab_size=50_000)
    del tokens, offsets, lengths
    coll = write_collection(root / "coll", [(None, p) for p in paths])
    idx = build_pack_index(coll, capacity=capacity, algorithm="ffd", name=INDEX)
    def data(folder) -> list[int]:  # bytes of its data files (the manifests aside: what downloads.log counts)
        return [f.stat().st_size for f in Path(folder).iterdir() if f.is_file() and f.name not in COMMITS]

    per_member = [sum(data(p)) for p in paths]
    sizes = {"members": sum(per_member), "largest_member": max(per_member),
             "collection_own": sum(data(root / "coll")), "pack_index": sum(data(idx.path))}
    po, segs = np.asarray(idx.pack_offsets), np.asarray(idx.segments)
    summary = {"documents": n_docs, "members": members, "packs": int(idx.num_packs), "segments": int(segs.shape[0]),
               "bytes": sizes, "member_table": (root / "coll" / "members.bin").exists(),
               "pack0_members": int(np.unique(coll.member_of(segs[po[0]:po[1], 0])).size),
               "build_s": time.perf_counter() - t0}
    print(f"{members:,} members: wrote {n_docs:,} documents, {summary['packs']:,} packs in {summary['build_s']:.1f} s; "
          f"bytes {sizes}", flush=True)
    return summary


def load_memory(root: Path) -> None:
    """Every file under ``root`` (dot folders left out) into ``memory://bench/data/`` (manifests last)."""
    import fsspec

    fs = fsspec.filesystem("memory")
    if fs.exists("/bench"):
        fs.rm("/bench", recursive=True)
    files = sorted(p for p in root.rglob("*") if p.is_file() and not any(
        s.startswith(".") for s in p.relative_to(root).parts))
    files.sort(key=lambda p: p.name in COMMITS)
    for p in files:
        fs.pipe_file(f"/bench/data/{p.relative_to(root).as_posix()}", p.read_bytes())


class Counter:
    """Calls and bytes of ``MemoryFileSystem.cat_file`` (what the storage layer reads from the "bucket")."""

    requests = bytes = 0

    @classmethod
    def install(cls) -> type:
        from fsspec.implementations.memory import MemoryFileSystem

        inner = MemoryFileSystem.cat_file
        if getattr(inner, "_counted", False):
            return cls

        def cat_file(fs, path, start=None, end=None, **kw):
            out = inner(fs, path, start, end, **kw)
            cls.requests += 1
            cls.bytes += len(out)
            return out

        cat_file._counted = True
        cat_file._inner = inner
        MemoryFileSystem.cat_file = cat_file
        return cls

    @staticmethod
    def uninstall() -> None:
        """``cat_file`` as it was, and ``memory://bench/`` emptied (``--in-process``: the caller's process goes on)."""
        import fsspec
        from fsspec.implementations.memory import MemoryFileSystem

        MemoryFileSystem.cat_file = getattr(MemoryFileSystem.cat_file, "_inner", MemoryFileSystem.cat_file)
        fs = fsspec.filesystem("memory")
        if fs.exists("/bench"):
            fs.rm("/bench", recursive=True)


def node_limit(url: str, index: str, limit: int, cache: Path, members: int | None = None) -> int:
    """The ``cache_limit`` of a streamed read that holds ``members`` members (default: as many as ``limit`` bytes of
    member files hold, at least two): where this packfmt bounds the node's cache folder (its fixed files, members
    in allocated blocks: ``remote.node_cache``), the collection's ``cache_limit_for``, found by an untimed open in a
    folder of its own; a packfmt that bounded member file bytes only takes ``limit`` as it is."""
    import packfmt

    try:
        import packfmt.remote.node_cache  # noqa: F401
    except ImportError:
        return limit
    probe = packfmt.open(url, stream=True, cache_dir=str(cache) + "-probe")
    probe.pack_index(index)
    if members is None:
        largest = max(int(t) for t in probe.members.tokens) * np.dtype(probe.np_token_dtype).itemsize
        members = max(2, limit // max(largest, 1))
    return probe.cache_limit_for(members)


def stage_fn(mode: str, stage: str, root: Path, cache: Path, limit: int, batch: int):
    import packfmt
    from packfmt.torch import PackedDataset

    src = str(root / "coll") if mode == "local" else URL
    kw = {} if mode == "local" else {"cache_dir": str(cache)}
    if mode == "stream":
        kw.update(stream=True, cache_limit=node_limit(URL, INDEX, limit, cache))
    if stage == "open":
        return lambda: packfmt.open(src, **kw)
    if stage == "ready":
        def ready():
            ds = packfmt.open(src, **kw)
            return ds, ds.pack_index(INDEX)
        return ready

    def first():
        ds = PackedDataset(src, INDEX, **kw)
        return ds, ds.__getitems__(np.arange(batch))
    return first


def _status(key: str) -> int:
    """``/proc/self/status`` field ``key`` (kB) in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def run_stage(mode: str, stage: str, root: Path, work: Path, limit: int, batch: int, repeat: int, rss: bool,
              profile: bool = False, fn_for=None) -> dict:
    """``repeat`` cold runs of one (mode, stage) in this process after one untimed; the best, the bytes fetched, the peak RSS.

    ``fn_for``: ``cache dir -> the callable timed`` in place of ``stage_fn`` (``bench_stream_layout``'s stages)."""
    counter = Counter.install() if mode != "local" else None
    if mode != "local":
        load_memory(root)
    times, fetched, reads = [], [], []
    base = 0
    for r in range(-1, repeat):  # run -1: untimed warm-up (lazy imports, numba caches), then the peak is reset
        if r == 0:
            times.clear()
            if rss:  # (a collection takes ~0.2 s once torch is imported: children only, where RSS is measured)
                gc.collect()
                Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS: the peak from here on
                base = _status("VmRSS")
        cache = work / f"cache-{mode}-{stage}-{r}".replace(" ", "_")
        fn = stage_fn(mode, stage, root, cache, limit, batch) if fn_for is None else fn_for(cache)
        if counter is not None:
            counter.requests = counter.bytes = 0
        prof = None
        if profile and r == repeat - 1:
            import cProfile

            prof = cProfile.Profile()
            prof.enable()
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
        if prof is not None:
            prof.disable()
            _print_profile(prof, f"{mode}, {stage}")
        log = cache / "downloads.log"
        entries = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
        fetched.append(sum(e["bytes"] for e in entries))
        by_folder = {}
        for e in entries:  # by the collection's top folder (packs, members, shards), its own files as "(own)"
            parts = e["url"][len(URL) + 1:].split("/") if e["url"].startswith(URL + "/") else ["(other)"]
            key = parts[0] if len(parts) > 1 else "(own)"
            by_folder[key] = by_folder.get(key, 0) + e["bytes"]
        reads.append((counter.requests, counter.bytes) if counter is not None else (0, 0))
        del out, fn
        if rss:
            gc.collect()
        shutil.rmtree(cache, ignore_errors=True)
    row = {"mode": mode, "stage": stage, "seconds": min(times), "base_rss_mb": base / 2**20, "times": times, "fetched_mb": fetched[-1] / 2**20,
           "requests": reads[-1][0], "read_mb": reads[-1][1] / 2**20,
           "fetched_by_folder_mb": {k: v / 2**20 for k, v in sorted(by_folder.items())}}
    if rss:
        row.update(peak_rss_mb=_status("VmHWM") / 2**20, added_rss_mb=(_status("VmHWM") - base) / 2**20)
    return row


def _print_profile(prof, title: str) -> None:
    import io
    import pstats

    for key in ("cumulative", "tottime"):
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(25)
        lines = [ln for ln in buf.getvalue().splitlines() if ln.strip()]
        start = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("ncalls"))
        print(f"--- profile ({key}): {title}", file=sys.stderr)
        print("\n".join(lines[start:start + 26]), file=sys.stderr, flush=True)


def spawn_stage(spec: dict, script: str | None = None, env: dict | None = None) -> dict:
    """``run_stage`` in a fresh child (``python -P script --child JSON``, this file by default; ``env``: its
    environment, os.environ by default), its row read from its last stdout line."""
    cmd = [sys.executable, "-P", str(Path(script or __file__).resolve()), "--child", json.dumps(spec)]
    with tempfile.TemporaryFile() as out:
        pid = os.posix_spawn(cmd[0], cmd, dict(os.environ if env is None else env), file_actions=[(os.POSIX_SPAWN_DUP2, out.fileno(), 1)])
        _, status, _ = os.wait4(pid, 0)
        out.seek(0)
        text = out.read().decode(errors="replace")
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"child {spec['mode']}, {spec['stage']}: exit status {os.waitstatus_to_exitcode(status)}")
    return json.loads(text.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=10_000_000)
    ap.add_argument("--members", default="100,1000", type=lambda t: [int(x) for x in t.split(",")])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--capacity", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=1, help="packs of the first batch (0 .. batch-1)")
    ap.add_argument("--modes", default=",".join(MODES), type=lambda t: t.split(","))
    ap.add_argument("--profile", action="store_true", help="cProfile the first-batch stage of each mode (stderr)")
    ap.add_argument("--in-process", action="store_true", help="no child processes (no RSS columns)")
    ap.add_argument("--out", default=str(RESULTS_DIR / "bench_stream_open.json"))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        s = json.loads(args.child)
        row = run_stage(s["mode"], s["stage"], Path(s["root"]), Path(s["work"]), s["limit"], s["batch"], s["repeat"],
                        True, s["profile"])
        print(json.dumps(row))
        return 0
    rows, built = [], []
    with tempfile.TemporaryDirectory(prefix="bench_stream_open_", dir=os.environ.get("BENCH_TMP")) as tmp:
        for members in args.members:
            root = Path(tmp) / f"m{members}"
            summary = make(root, args.docs, members, args.capacity)
            built.append(summary)
            limit = max(summary["bytes"]["members"] // 10, 2 * summary["bytes"]["largest_member"])
            summary["cache_limit"] = limit
            for mode in args.modes:
                for stage in STAGES:
                    spec = {"mode": mode, "stage": stage, "root": str(root), "work": str(Path(tmp) / "work"),
                            "limit": limit, "batch": args.batch, "repeat": args.repeat,
                            "profile": args.profile and stage == "first batch"}
                    if args.in_process:
                        row = run_stage(mode, stage, root, Path(tmp) / "work", limit, args.batch, args.repeat, False)
                    else:
                        row = spawn_stage(spec)
                    row.update(members=members, documents=args.docs)
                    rows.append(row)
                    print(f"  {members:,} members, {mode:6s} {stage:11s} {row['seconds']:8.3f} s "
                          f"fetched {row['fetched_mb']:8.1f} MB" + (f"  peak {row['peak_rss_mb']:7.1f} MB "
                          f"(+{row['added_rss_mb']:.1f})" if "peak_rss_mb" in row else ""), flush=True)
            shutil.rmtree(root)
    if args.in_process:
        Counter.uninstall()
    for row in rows:  # stream vs the local path, same members and stage
        local = next((r for r in rows if r["mode"] == "local" and r["members"] == row["members"]
                      and r["stage"] == row["stage"]), None)
        if local is not None:
            row["vs_local"] = row["seconds"] / local["seconds"]
    cols = ["members", "mode", "stage", "seconds", "vs_local", "fetched_mb", "read_mb", "requests", "peak_rss_mb",
            "added_rss_mb"]
    print_table(rows, cols, title=f"{args.docs:,} documents, ffd capacity {args.capacity}, first batch = packs "
                f"0..{args.batch - 1}, memory:// (best of {args.repeat}, cold cache each)")
    write_json(args.out, {"rows": rows, "collections": built, "url": URL, "machine": machine_info(),
                          "args": {k: v for k, v in vars(args).items() if k != "child"}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
