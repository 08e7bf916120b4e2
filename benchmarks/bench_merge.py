"""Benchmark of ``packfmt merge``: seconds and peak RSS against the number of members M.

    python benchmarks/bench_merge.py [--quick] [--members 10,100,1000,2000] [--docs 1000]
                                     [--large-docs 5000000] [--out benchmarks/results/bench_merge.json]

For each M it writes M small stores (``--docs`` documents each, lengths uniform in [1, 64], with
``packfmt.torch.testing.write_flat_dataset``), then runs, each as a whole fresh subprocess:

* ``logical``: ``write_collection`` (``packfmt merge``: a manifest, no token byte copied);
* ``physical``: ``merge_physical`` (``packfmt merge --physical``: one contiguous store);
* ``read``: open the collection and read one document (tokens) from every member, in order; the
  ``Collection`` keeps at most 64 members open, so open file descriptors and memory maps stay
  bounded: the largest counts seen (every 50 members) are reported.

Peak RSS is the subprocess's own high-water mark (``VmHWM``) (``import packfmt`` alone is reported as
``baseline``); ``rss_over_baseline`` is what the work added. The physical merge also runs on one
member of ``--large-docs`` documents, to show its memory does not grow with a member's size either.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RESULTS_DIR, machine_info, print_table, timed, write_json  # noqa: E402

MEMBERS = (10, 100, 1000, 2000)
QUICK_MEMBERS = (10, 100)
DEFAULT_OUT = RESULTS_DIR / "bench_merge.json"

# Each child prints one JSON line: its own seconds of work and peak RSS (VmHWM of its own address space:
# ru_maxrss would carry the parent's RSS over fork + exec).
CHILD = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
import packfmt
from packfmt.collection import Collection, merge_physical, write_collection
mode, out, srcs = sys.argv[2], sys.argv[3], sys.argv[4:]
t0 = time.perf_counter()
extra = {}
def counts():
    return len(os.listdir("/proc/self/fd")), sum(1 for _ in open("/proc/self/maps"))
if mode == "logical":
    write_collection(out, [(None, s) for s in srcs])
elif mode == "physical":
    store = merge_physical(srcs, out)
    extra["documents"] = store.num_documents
elif mode == "read":
    coll = Collection(srcs[0])
    fds0, maps0 = counts()
    max_fds = max_maps = 0
    tokens = 0
    for m in range(len(coll.members)):
        tokens += len(coll.document(int(coll.doc_start[m])))
        if m % 50 == 0 or m == len(coll.members) - 1:
            fds, maps = counts()
            max_fds, max_maps = max(max_fds, fds - fds0), max(max_maps, maps - maps0)
    extra.update(members_read=len(coll.members), tokens_read=tokens, open_members=len(coll._open),
                 max_extra_fds=max_fds, max_extra_maps=max_maps)
seconds = time.perf_counter() - t0
hwm = [line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:")]
print(json.dumps({"seconds": seconds, "peak_rss_mib": int(hwm[0]) / 1024, **extra}))
"""


def run_child(mode: str, out: Path | str, sources: list[str]) -> dict:
    with timed() as t:
        proc = subprocess.run([sys.executable, "-c", CHILD, str(ROOT), mode, str(out), *sources],
                              capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{mode} failed:\n{proc.stderr}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["process_seconds"] = t.seconds
    return result


def make_members(root: Path, count: int, docs: int, seed: int = 0) -> list[str]:
    from packfmt.torch.testing import write_flat_dataset

    rng = np.random.default_rng(seed)
    paths = []
    for k in range(count):
        lengths = rng.integers(1, 65, docs)
        offsets = np.concatenate(([0], np.cumsum(lengths)))
        path = root / f"m{k:05d}"
        write_flat_dataset(path, rng.integers(0, 32000, int(offsets[-1])), offsets, vocab_size=32000)
        paths.append(str(path))
    return paths


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help=f"members {QUICK_MEMBERS} only, no large member")
    ap.add_argument("--members", help="comma-separated member counts (default: 10,100,1000,2000)")
    ap.add_argument("--docs", type=int, default=1000, help="documents per member (default: 1000)")
    ap.add_argument("--large-docs", type=int, default=5_000_000,
                    help="documents of the one large member (0: skip; default: 5,000,000)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    members = [int(x) for x in args.members.split(",")] if args.members else (QUICK_MEMBERS if args.quick else MEMBERS)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_merge-") as tmp:
        tmp = Path(tmp)
        baseline = run_child("none", tmp / "none", [])["peak_rss_mib"]
        pool = make_members(tmp / "members", max(members), args.docs) if members else []
        for m in members:
            sources = pool[:m]
            logical = run_child("logical", tmp / f"coll{m}", sources)
            physical = run_child("physical", tmp / f"phys{m}", sources)
            read = run_child("read", "-", [str(tmp / f"coll{m}")])
            for case, r in (("logical", logical), ("physical", physical), ("read_every_member", read)):
                row = {"case": case, "members": m, "documents": m * args.docs, "seconds": round(r["seconds"], 3),
                       "process_seconds": round(r["process_seconds"], 3), "peak_rss_mib": round(r["peak_rss_mib"], 1),
                       "rss_over_baseline_mib": round(r["peak_rss_mib"] - baseline, 1)}
                row.update({k: v for k, v in r.items() if k in ("max_extra_fds", "max_extra_maps", "open_members")})
                rows.append(row)
            shutil.rmtree(tmp / f"phys{m}")
        if args.large_docs and not args.quick:
            big = make_members(tmp / "large", 1, args.large_docs, seed=1)
            r = run_child("physical", tmp / "phys_large", big)
            rows.append({"case": "physical_one_large_member", "members": 1, "documents": args.large_docs,
                         "seconds": round(r["seconds"], 3), "process_seconds": round(r["process_seconds"], 3),
                         "peak_rss_mib": round(r["peak_rss_mib"], 1),
                         "rss_over_baseline_mib": round(r["peak_rss_mib"] - baseline, 1)})
    print_table(rows, ["case", "members", "documents", "seconds", "process_seconds", "peak_rss_mib",
                       "rss_over_baseline_mib", "max_extra_fds", "max_extra_maps"],
                title=f"packfmt merge (baseline RSS of `import packfmt`: {baseline:.1f} MiB)")
    write_json(args.out, {"rows": rows, "baseline_rss_mib": baseline, "docs_per_member": args.docs,
                          "machine": machine_info()})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
