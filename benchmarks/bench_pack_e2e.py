"""End to end: ``packfmt pack``, ``validate --deep`` and ``inspect`` at 10^7 (and 10^8) documents.

Each command runs as a whole subprocess (Python start, imports, reading the store, writing the
index) and is timed by wall clock, with its peak RSS from ``os.wait4`` (``ru_maxrss`` of that
child alone). Beside them runs "the packing call alone": a process that opens the store, reads
the document lengths and calls ``segment_documents`` and ``pack_items`` (reported both as a whole process
and as the in-process seconds of the call). Aims (issue "Internet scale", point 3): ``pack`` at most
1.5x the packing process and 24 bytes of peak memory per document above the interpreter,
``validate --deep`` at most 40 bytes per document.

    python benchmarks/bench_pack_e2e.py                     # N = 10^7
    python benchmarks/bench_pack_e2e.py --full              # N = 10^7 and 10^8 (~2 GB of disk per 10^8)
    python benchmarks/bench_pack_e2e.py --n 100000 --quick  # seconds, for a smoke test
    python benchmarks/bench_pack_e2e.py --label before --pythonpath /tmp/packfmt-base   # another checkout
    python benchmarks/bench_pack_e2e.py --full --steps pack --repeats 5 --baseline /tmp/packfmt-base
        # this checkout and another interleaved, run by run: the same machine load for both
    python benchmarks/bench_pack_e2e.py --full --members 1000 --label coll1000 \
        --out benchmarks/results/bench_pack_e2e_members.json
        # the same documents as a collection of 1,000 members (written once beside the store)

On a shared machine the wall times move by 2x with the load of others: compare labels measured
in one run with ``--baseline`` (each repeat runs both checkouts back to back), and read the spread
(every run's wall is printed and stored, ``wall_s_all``) beside the best.

Each ``pack`` run writes a new index: the previous run's is removed first, untimed (with
``--overwrite`` replacing an index also unlinks the old one: 0.3-0.5 s for the 2.4 GB of
``segments.bin`` at 10^8 documents on this machine's disk). Columns: wall seconds (best of ``--repeats``), peak RSS, peak RSS per document, the peak RSS above
the same process on a 1,000-document store (Python, imports, numba: what does not grow with N)
per document, and the wall time over the packing process's.

CPU (``ru_utime + ru_stime`` of each process, every thread; what a loaded machine moves less than wall time):
``CPU x call`` is a process's CPU over the packing call's own CPU in the packing process; ``pack``'s own packing
call (``segment_documents`` + ``pack_items``) is also timed inside ``pack`` (``CPU x own call``: the same moment,
repeat by repeat, median), and the ``floor`` step is a process that only reads the store's offsets and writes as
many index rows through the index's writer (hashed, ``O_DIRECT``, fsync): ``CPU-call x floor`` is what ``pack``
does besides packing (its CPU less its own call) over the floor's CPU in the same repeat (median). Issue 31's aims:
``CPU x own call`` <= 1.5, or ``CPU-call x floor`` <= 1.2 where the index's own bytes make that impossible.

Results are stored per ``--label`` in ``benchmarks/results/bench_pack_e2e.json`` (other labels in
the file are kept), and the table shows this run's labels (``--all-labels``: every label stored)
side by side for each N. With two sizes or
more, a scaling model follows: a line through the two largest N of each label and step, read at
10^9 documents (seconds, and GB of peak RSS: the floor plus bytes per document above it), marked
as an extrapolation. ``--profile`` runs
each command under cProfile and prints its 12 most expensive functions (cumulative).

The store: N documents of 1..15 tokens (uniform, mean 8; none longer than the capacity 4096),
uint16 tokens, written with the bulk ``DatasetWriter.add_documents`` in chunks of 2^20 documents;
``--long-every K`` makes every K-th document 8,197 tokens long (cut into 3 segments by ``pack``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from common import RESULTS_DIR, machine_info, print_table, write_json  # noqa: E402

CAPACITY = 4096
ALGORITHM = "ffd"
MAX_LEN = 15
LONG_LEN = 2 * CAPACITY + 5  # --long-every: split into 3 segments
CHUNK_DOCS = 1 << 20
DEFAULT_OUT = RESULTS_DIR / "bench_pack_e2e.json"
FLOOR_DOCS = 1000

#: The packing call alone, as its own process: open the store, read the lengths, cut the long
#: documents (none in the default store: then a min and a max), pack.
PACK_ONLY = """
import json, sys, time
t0 = time.perf_counter()
from packfmt.opening import open_dataset
from packfmt.packing import pack_items, segment_documents
store = open_dataset(sys.argv[1])
lengths = store.doc_lengths
t1, c1 = time.perf_counter(), time.process_time()
result = pack_items(segment_documents(lengths, int(sys.argv[2])).lengths, int(sys.argv[2]), sys.argv[3], seed=0)
t2, c2 = time.perf_counter(), time.process_time()
print(json.dumps({"call_seconds": t2 - t1, "call_cpu_seconds": c2 - c1, "read_seconds": t1 - t0,
                  "packs": result.n_packs, "segments": result.n_items}))
"""

#: The floor of ``pack`` (``floor`` step): a process that only reads the store's offsets and writes an index's rows,
#: as many and as large as the index ``pack`` writes (``pack_offsets.bin``: packs + 1 offsets; ``segments.bin``: a
#: row ``(doc, 0, length)`` of 24 bytes per segment, each document's, in document order: the rows of a store whose
#: documents all fit, in pack order), through the index's own writer (hashed, ``O_DIRECT``, fsync), in chunks of the
#: index's; into a folder removed after. Nothing packed, nothing checked, no statistics.
FLOOR = """
import shutil, sys, tempfile
from pathlib import Path
import numpy as np
from packfmt._io import HashedFile, aligned_empty
from packfmt.index_writer import SEGMENT_ROWS_CHUNK as CHUNK
ds, packs = Path(sys.argv[1]), int(sys.argv[2])
out = Path(tempfile.mkdtemp(dir=ds, prefix=".bench-floor-"))
try:
    offsets = np.memmap(ds / "doc_offsets.bin", dtype="<i8", mode="r")
    n = offsets.shape[0] - 1
    f = HashedFile(out / "pack_offsets.bin")
    f.write_array(np.linspace(0, n, packs + 1).astype(np.int64), np.int64)
    f.close()
    f = HashedFile(out / "segments.bin", direct=True)
    rows = aligned_empty((CHUNK, 3), np.int64)
    rows[:, 1] = 0
    for a in range(0, n, CHUNK):
        m = min(n, a + CHUNK) - a
        rows[:m, 0] = np.arange(a, a + m)
        np.subtract(offsets[a + 1:a + m + 1], offsets[a:a + m], out=rows[:m, 2])
        f.write_array(rows[:m], np.int64)
    f.close()
finally:
    shutil.rmtree(out)
"""

#: ``packfmt ARGS`` (the console script's ``main``, then its exit: ``packfmt.cli.exit_now`` in a checkout that has it),
#: profiled into $BENCH_PROFILE when set.
CLI = """
import functools, json, os, sys, time
import packfmt.cli
from packfmt.cli import main
import packfmt.packing
prof = os.environ.get("BENCH_PROFILE")
if prof:
    import cProfile
    profiler = cProfile.Profile()
    profiler.enable()
own = [0.0, 0.0]  # user, system
def timed(f):
    @functools.wraps(f)
    def call(*a, **k):
        t0 = os.times()
        try:
            return f(*a, **k)
        finally:
            t1 = os.times()
            own[0] += t1.user - t0.user
            own[1] += t1.system - t0.system
    return call
for name in ("segment_documents", "pack_items"):  # what the packing process times, timed here in this process
    setattr(packfmt.packing, name, timed(getattr(packfmt.packing, name)))
rc = main(sys.argv[1:])
if prof:
    profiler.disable()
    profiler.dump_stats(prof)
print(json.dumps({"bench_call_cpu_seconds": own[0] + own[1], "bench_call_user_seconds": own[0]}), file=sys.stderr)
getattr(packfmt.cli, "exit_now", sys.exit)(rc)
"""


def make_store(path: Path, n: int, seed: int = 0, long_every: int = 0) -> float:
    """N short documents (1..MAX_LEN tokens), vectorised in chunks; return seconds.

    ``long_every``: every K-th document instead has LONG_LEN tokens (split into 3 segments), as a
    real corpus has a few documents longer than the capacity.
    """
    from packfmt.writer import DatasetWriter

    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    with DatasetWriter(path, vocab_size=32_000, tokenizer={"name": "synthetic", "hash": None}) as w:
        for start in range(0, n, CHUNK_DOCS):
            lengths = rng.integers(1, MAX_LEN + 1, min(CHUNK_DOCS, n - start), dtype=np.int64)
            if long_every:
                lengths[(np.arange(start, start + lengths.shape[0]) % long_every) == long_every - 1] = LONG_LEN
            tokens = (np.arange(int(lengths.sum()), dtype=np.int64) % 32_000).astype(np.uint16)
            w.add_documents(tokens, lengths)
    return time.perf_counter() - t0


#: Run in its own process: a child's peak RSS (``ru_maxrss``) starts from its parent's at the spawn, so the
#: parent must not touch the store's pages.
SPLIT = """
import sys, numpy as np
from pathlib import Path
from packfmt.collection import write_collection
from packfmt.torch.testing import write_split_stores
store, out, members = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
offsets = np.memmap(store / "doc_offsets.bin", dtype="<i8", mode="r")
tokens = np.memmap(store / "tokens.bin", dtype="<u2", mode="r")
n = offsets.shape[0] - 1
paths = write_split_stores(out.parent / (out.name + "-stores"), tokens, offsets,
                           np.linspace(0, n, members + 1).astype(np.int64), vocab_size=32_000)
write_collection(out, [(None, p) for p in paths])
"""


def make_collection(store: Path, members: int) -> Path:
    """The documents of ``store`` as a collection of ``members`` members (even cuts), written beside it once."""
    out = store.parent / f"{store.name}-coll{members}"
    if not (out / "manifest.json").exists():
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", SPLIT, str(store), str(out), str(members)], check=True,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
        print(f"wrote {members:,} members in {time.perf_counter() - t0:.1f} s -> {out}", flush=True)
    return out


def spawn_wait(argv: list[str], env: dict, profile: Path | None = None) -> dict:
    """Run ``python argv`` to the end, reaped by ``os.wait4`` so ``ru_maxrss`` is that child's own peak RSS."""
    cmd = [sys.executable, "-P"] + argv  # -P: the working directory must not shadow --pythonpath
    env = dict(env, BENCH_PROFILE=str(profile)) if profile else env
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        pid = os.posix_spawn(cmd[0], cmd, env, file_actions=[
            (os.POSIX_SPAWN_DUP2, out.fileno(), 1), (os.POSIX_SPAWN_DUP2, err.fileno(), 2)])
        _, status, usage = os.wait4(pid, 0)
        wall = time.perf_counter() - t0
        cpu = usage.ru_utime + usage.ru_stime
        rc = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    if rc != 0:
        sys.stderr.write(stderr[-4000:])
        raise SystemExit(f"{' '.join(argv)}: exit status {rc}")
    own = [json.loads(ln) for ln in stderr.splitlines() if "bench_call_cpu_seconds" in ln]
    return {"wall_s": wall, "cpu_s": cpu, "user_s": usage.ru_utime, "peak_rss_bytes": usage.ru_maxrss * 1024,
            "stdout": stdout, "own_call_cpu_s": own[-1]["bench_call_cpu_seconds"] if own else None,
            "own_call_user_s": own[-1]["bench_call_user_seconds"] if own else None}


def print_profile(path: Path, title: str) -> None:
    import io
    import pstats

    buf = io.StringIO()
    pstats.Stats(str(path), stream=buf).sort_stats("cumulative").print_stats(12)
    lines = [ln for ln in buf.getvalue().splitlines() if ln.strip()]
    start = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("ncalls"))
    print(f"--- profile: {title}")
    print("\n".join(lines[start:start + 13]))


def measure(n: int, ds: Path, envs: dict[str, dict], profile_dir: Path | None, repeats: int = 1,
            floors: dict | None = None, steps: tuple[str, ...] = (), fixed_cpu: dict | None = None
            ) -> dict[str, list[dict]]:
    """The processes on one store (best wall of ``repeats`` runs each); one row each, per label.

    ``envs``: label -> environment (its PYTHONPATH picks the checkout). With two labels, each
    repeat runs the step once per label, alternating, so both see the same load on a shared
    machine. ``floors`` (label -> step -> peak RSS MB of the same process on a store of
    FLOOR_DOCS documents: Python, imports, numba) gives ``bytes_per_doc_above_floor``, the memory
    that grows with N. ``steps``: only these (default: all). ``fixed_cpu`` (label -> step -> CPU seconds of the same
    process on that store) gives ``cpu_above_fixed_x_call``: the CPU that grows with N over the packing call's.
    """
    cli = ["-c", CLI]
    all_steps = [
        ("pack_call", ["-c", PACK_ONLY, str(ds), str(CAPACITY), ALGORITHM]),
        ("floor", ["-c", FLOOR, str(ds), "{packs}"]),  # the packs: the packing process's
        ("pack", cli + ["pack", str(ds), "--capacity", str(CAPACITY), "--algorithm", ALGORITHM, "--overwrite",
                        "--json"]),
        ("validate_deep", cli + ["validate", str(ds), "--deep", "--quiet"]),
        ("inspect", cli + ["inspect", str(ds), "--json"]),
        ("shards", cli + ["pack", str(ds), "--capacity", str(CAPACITY), "--algorithm", ALGORITHM, "--name", "shp",
                          "--overwrite", "--shards", str(ds.parent / f"{ds.name}-shards"), "--shard-size", "64MiB",
                          "--json"]),
        ("validate_shards", cli + ["validate", str(ds.parent / f"{ds.name}-shards"), "--deep", "--quiet"]),
    ]
    out: dict[str, list[dict]] = {label: [] for label in envs}
    floor_runs: dict[str, list[dict]] = {}  # label -> the floor's runs, repeat by repeat
    for name, argv in all_steps:
        if steps and name not in steps and name not in ("pack_call", "floor"):  # the ratios need these two
            continue
        if name == "floor":  # as many packs as the packing process made; a store's offsets (not a collection's)
            if not (ds / "doc_offsets.bin").exists():
                continue
            argv = [a.format(packs=out[next(iter(envs))][0]["packs"]) for a in argv]
        runs: dict[str, list[dict]] = {label: [] for label in envs}
        if name == "validate_shards":  # every label validates the same shards: the first label's (untimed)
            shutil.rmtree(ds.parent / f"{ds.name}-shards", ignore_errors=True)
            shutil.rmtree(ds / "packs" / "shp", ignore_errors=True)
            spawn_wait(dict(all_steps)["shards"], next(iter(envs.values())), None)
        for _ in range(repeats):
            for label, env in envs.items():
                prof = profile_dir / f"{label}-{name}-{n}.prof" if profile_dir and name not in ("pack_call", "floor") else None
                if name == "pack":  # every run writes a new index, as the first does (untimed: the
                    shutil.rmtree(ds / "packs", ignore_errors=True)  # unlink of the last run's 24 B/segment)
                if name == "shards":  # the same for the shards (and the index they are cut from)
                    shutil.rmtree(ds.parent / f"{ds.name}-shards", ignore_errors=True)
                    shutil.rmtree(ds / "packs" / "shp", ignore_errors=True)
                runs[label].append(spawn_wait(argv, env, prof))
        for label, found in runs.items():
            r = min(found, key=lambda x: x["wall_s"])
            walls = sorted(x["wall_s"] for x in found)
            row = {"n_docs": n, "step": name, "wall_s": r["wall_s"], "wall_s_all": walls,
                   "cpu_s": min(x["cpu_s"] for x in found), "cpu_s_all": sorted(x["cpu_s"] for x in found),
                   "user_s_all": sorted(x["user_s"] for x in found),
                   "peak_rss_mb": r["peak_rss_bytes"] / 2**20, "bytes_per_doc": r["peak_rss_bytes"] / n}
            if name == "pack_call":
                infos = [json.loads(x["stdout"].strip().splitlines()[-1]) for x in found]
                info = json.loads(r["stdout"].strip().splitlines()[-1])
                row["call_s"] = info["call_seconds"]
                row["call_cpu_s"] = min(x["call_cpu_seconds"] for x in infos)
                row["packs"] = info["packs"]
            if name == "pack":
                stats = json.loads(r["stdout"])["stats"]
                row["packs"] = stats["packs"]
                # its own packing call (segment_documents + pack_items), timed inside it: CPU over that, run by run
                # (the same moment for both: a ratio the machine's load moves less than one across processes)
                own = sorted(x["cpu_s"] / x["own_call_cpu_s"] for x in found)
                row["own_call_cpu_s"] = min(x["own_call_cpu_s"] for x in found)
                row["cpu_x_own_call"], row["cpu_x_own_call_all"] = statistics.median(own), own
                # user CPU alone: what a machine short of free huge pages adds as system time (compaction stalls
                # on every large allocation, inside the call and out) left out
                user = sorted(x["user_s"] / x["own_call_user_s"] for x in found)
                row["user_x_own_call"], row["user_x_own_call_all"] = statistics.median(user), user
                # what it does besides packing (CPU less its own call) over the floor's CPU (reading the offsets,
                # writing as many rows), the floor run of the same repeat
                floor_cpus = [x["cpu_s"] for x in floor_runs.get(label, [])]
                if len(floor_cpus) == len(found):
                    above = sorted((x["cpu_s"] - x["own_call_cpu_s"]) / f for x, f in zip(found, floor_cpus))
                    row["cpu_above_call_x_floor"], row["cpu_above_call_x_floor_all"] = statistics.median(above), above
            out[label].append(row)
            if name == "floor":
                floor_runs[label] = found
            spread = f"  (all: {', '.join(f'{w:.2f}' for w in walls)})" if len(walls) > 1 else ""
            print(f"  {label:>14s} n={n:>11,d} {name:14s} {row['wall_s']:8.2f} s  {row['cpu_s']:7.2f} s CPU  "
                  f"{row['peak_rss_mb']:9.1f} MB  {row['bytes_per_doc']:6.1f} B/doc{spread}", flush=True)
            prof = profile_dir / f"{label}-{name}-{n}.prof" if profile_dir and name not in ("pack_call", "floor") else None
            if prof:
                print_profile(prof, f"{label} {name} n={n}")
    for label, rows in out.items():
        base, call, call_cpu = rows[0]["wall_s"], rows[0]["call_s"], rows[0]["call_cpu_s"]
        for row in rows:
            row["x_pack_process"] = row["wall_s"] / base
            row["x_pack_call"] = row["wall_s"] / call
            row["cpu_x_call"] = row["cpu_s"] / call_cpu  # CPU seconds over the packing call's (in its process)
            if floors and row["step"] in floors[label]:
                row["bytes_per_doc_above_floor"] = (row["peak_rss_mb"] - floors[label][row["step"]]) * 2**20 / n
            if fixed_cpu and row["step"] in fixed_cpu[label]:  # less what a 1,000-document run costs (imports...)
                row["cpu_above_fixed_x_call"] = (row["cpu_s"] - fixed_cpu[label][row["step"]]) / call_cpu
    return out


def warm_numba(env: dict) -> None:
    """Compile (or load) the numba kernels once so no timed process pays the compile."""
    code = ("import numpy as np; from packfmt.packing import pack_items, segment_documents; "
            "l = np.arange(1, 100) % 17 + 1; segment_documents(l, 8); segment_documents(l, 8, 'truncate'); "
            "segment_documents(l, 64).rows(np.arange(3)); "
            f"pack_items(l, 64, '{ALGORITHM}')")
    subprocess.run([sys.executable, "-c", code], env=env, check=True)


def side_by_side(report: dict) -> list[dict]:
    """One row per (N, step), one wall / MB / B-per-doc / ratio column group per label."""
    table: dict[tuple, dict] = {}
    for label, runs in sorted(report["labels"].items()):
        for row in runs["rows"]:
            key = (row["n_docs"], row["step"])
            t = table.setdefault(key, {"n_docs": row["n_docs"], "step": row["step"]})
            t[f"{label} s"] = row["wall_s"]
            t[f"{label} MB"] = row["peak_rss_mb"]
            t[f"{label} B/doc"] = row["bytes_per_doc"]
            t[f"{label} B/doc>floor"] = row.get("bytes_per_doc_above_floor", float("nan"))
            t[f"{label} x call"] = row["x_pack_process"]
            t[f"{label} CPU s"] = row.get("cpu_s", float("nan"))
            t[f"{label} CPU x call"] = row.get("cpu_x_call", float("nan"))
            t[f"{label} CPU x own call"] = row.get("cpu_x_own_call", float("nan"))
            t[f"{label} user x own call"] = row.get("user_x_own_call", float("nan"))
            t[f"{label} CPU-call x floor"] = row.get("cpu_above_call_x_floor", float("nan"))
    order = {"pack_call": 0, "floor": 1, "pack": 2, "validate_deep": 3, "inspect": 4, "shards": 5}
    return [table[k] for k in sorted(table, key=lambda k: (k[0], order.get(k[1], 9)))]


def scaling_model(report: dict, at: int = 10**9) -> list[dict]:
    """Seconds and peak GB at ``at`` documents, from a line through the two largest N measured."""
    out = []
    for label, runs in sorted(report["labels"].items()):
        by_step: dict[str, list[dict]] = {}
        for row in runs["rows"]:
            by_step.setdefault(row["step"], []).append(row)
        for step, rows in by_step.items():
            rows = sorted(rows, key=lambda r: r["n_docs"])[-2:]
            if len(rows) < 2 or "bytes_per_doc_above_floor" not in rows[-1]:
                continue
            (a, b), floor = rows, runs.get("floor_rss_mb", {}).get(step, 0.0)
            per_doc_s = (b["wall_s"] - a["wall_s"]) / (b["n_docs"] - a["n_docs"])
            out.append({"label": label, "step": step, "from N": f"{a['n_docs']:.0e}, {b['n_docs']:.0e}",
                        "s per 10^9 (extrapolated)": b["wall_s"] + per_doc_s * (at - b["n_docs"]),
                        "B/doc>floor at largest N": b["bytes_per_doc_above_floor"],
                        "GB at 10^9 (extrapolated)": (floor * 2**20 + b["bytes_per_doc_above_floor"] * at) / 1e9})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=float, action="append", help="documents (repeatable; default 1e7, with --full 1e7 1e8)")
    ap.add_argument("--full", action="store_true", help="also N = 10^8")
    ap.add_argument("--label", default="after", help="name of this run in the JSON / table (default: after)")
    ap.add_argument("--pythonpath", default=str(ROOT), help="the packfmt checkout the commands run (default: this one)")
    ap.add_argument("--baseline", metavar="DIR", help="also run this checkout, interleaved with --pythonpath's "
                                                      "(same load for both), as --baseline-label")
    ap.add_argument("--baseline-label", default="before", help="label of --baseline (default: before)")
    ap.add_argument("--steps", help="comma-separated: only these of pack, validate_deep, inspect, shards (`pack --shards`, "
                    "64 MiB shards), validate_shards (`validate --deep` of shards the first label wrote); pack_call "
                    "always")
    ap.add_argument("--all-labels", action="store_true", help="tables show every label stored, not only this run's")
    ap.add_argument("--data-dir", help="keep the generated stores here and reuse them (default: a temp dir)")
    ap.add_argument("--profile", action="store_true", help="cProfile each command; print its top functions")
    ap.add_argument("--repeats", type=int, help="runs per process, best wall kept (default 3 below 10^8, 1 from 10^8 on)")
    ap.add_argument("--long-every", type=int, default=0, metavar="K",
                    help=f"every K-th document has {LONG_LEN} tokens (cut into 3 segments; use a --label of its own)")
    ap.add_argument("--members", type=int, default=0, metavar="K",
                    help="measure the same documents as a collection of K members instead of one store (use a "
                         "--label and --out of its own; the floor stays one store's: per-member costs count as growth)")
    ap.add_argument("--quick", action="store_true", help="do not write the JSON (smoke runs)")
    ap.add_argument("--out", default=str(DEFAULT_OUT), help="JSON output path")
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.n] if args.n else ([10**7, 10**8] if args.full else [10**7])
    steps = tuple(x.strip() for x in args.steps.split(",")) if args.steps else ()
    paths = {args.label: args.pythonpath}
    if args.baseline:
        if args.baseline_label == args.label:
            ap.error("--baseline-label must differ from --label")
        paths[args.baseline_label] = args.baseline
    envs = {label: dict(os.environ, PYTHONPATH=path, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
            for label, path in paths.items()}
    for env in envs.values():
        warm_numba(env)
    tmp = None if args.data_dir else tempfile.mkdtemp(prefix="bench_pack_e2e_")
    data_dir = Path(args.data_dir or tmp)
    rows: dict[str, list[dict]] = {label: [] for label in envs}
    try:
        floor_ds = data_dir / f"short-{FLOOR_DOCS}"
        if not (floor_ds / "manifest.json").exists():
            make_store(floor_ds, FLOOR_DOCS)
        shutil.rmtree(floor_ds / "packs", ignore_errors=True)
        small = measure(FLOOR_DOCS, floor_ds, envs, None, steps=steps)
        floors = {label: {r["step"]: r["peak_rss_mb"] for r in found} for label, found in small.items()}
        fixed_cpu = {label: {r["step"]: r["cpu_s"] for r in found} for label, found in small.items()}
        for n in sizes:
            ds = data_dir / (f"short-{n}" + (f"-long{args.long_every}" if args.long_every else ""))
            gen = None
            if not (ds / "manifest.json").exists():
                gen = make_store(ds, n, long_every=args.long_every)
                print(f"generated {n:,} documents in {gen:.1f} s -> {ds}", flush=True)
            shutil.rmtree(ds / "packs", ignore_errors=True)
            prof = Path(tempfile.mkdtemp(prefix="bench_prof_")) if args.profile else None
            repeats = args.repeats or (3 if n < 10**8 else 1)
            print(f"load average before n={n:,}: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs", flush=True)
            target = make_collection(ds, args.members) if args.members else ds
            for label, found in measure(n, target, envs, prof, repeats, floors, steps, fixed_cpu).items():
                if gen is not None:
                    found[0]["generate_s"] = gen
                found[0]["load_average"] = os.getloadavg()[0]
                rows[label] += found
            if tmp:
                for gone in (ds, ds.parent / f"{ds.name}-coll{args.members}", ds.parent / f"{ds.name}-coll{args.members}-stores"):
                    shutil.rmtree(gone, ignore_errors=True)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    out = Path(args.out)
    report = json.loads(out.read_text()) if out.exists() else {}
    report.setdefault("labels", {})
    for label, path in paths.items():
        previous = report["labels"].get(label, {}).get("rows", [])
        kept = [r for r in previous if r["n_docs"] not in sizes]
        checkout = "(this checkout)" if Path(path).resolve() == ROOT else "(another checkout, see the label)"
        report["labels"][label] = {"rows": kept + rows[label], "floor_rss_mb": floors[label], "pythonpath": checkout,
                                   "machine": machine_info(), "long_every": args.long_every or None,
                                   "members": args.members or None}
        if args.baseline:
            report["labels"][label]["interleaved_with"] = sorted(set(paths) - {label})
    report["setup"] = {"capacity": CAPACITY, "algorithm": ALGORITHM, "doc_lengths": f"uniform 1..{MAX_LEN}",
                       "command": "python benchmarks/bench_pack_e2e.py [--full] [--label L --pythonpath DIR] "
                                  "[--baseline DIR --baseline-label B]"}
    print()
    ran = {label: {"rows": rows[label], "floor_rss_mb": floors[label]} for label in paths}
    shown = report if args.all_labels and not args.quick else {"labels": ran}
    table = side_by_side(shown)
    cols = ["n_docs", "step"] + [c for c in table[0] if c not in ("n_docs", "step")] if table else []
    print_table(table, cols, title="wall seconds, peak RSS, bytes per document, wall / packing process")
    model = scaling_model(shown)
    if model:
        print()
        print_table(model, list(model[0]), title="scaling model: a line through the two largest N, read at 10^9 "
                                                 "documents (extrapolated, not measured)")
        if not args.quick:
            report["scaling_model"] = scaling_model(report)
    if not args.quick:
        write_json(out, report)
        print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
