"""What a training job's sampler costs before its first batch, at 10^6 to 10^8 packs: ``DistributedPackSampler``
constructed, then its first index (``next(iter(sampler))``: the epoch's global order, the deal over the ranks).

The dataset is a stand-in with ``--packs`` packs over ``--groups`` members (each member's packs consecutive, as in
a pack-ordered layout), random pack lengths in [1000, 8192): what a ``PackedDataset`` hands the sampler
(``len``, ``pack_num_tokens()``, ``pack_groups()``, ``fingerprint``). Each (code, packs, balance, window) runs in a
fresh child process (peak RSS is its VmHWM); ``--baseline DIR`` runs every case also with ``PYTHONPATH=DIR``,
alternated, so the two codes are compared in one run.

    python benchmarks/bench_sampler.py [--packs 1e6,1e7,1e8] [--ranks 8] [--balance none,tokens]
        [--window 4] [--groups 4000] [--repeat 1] [--baseline DIR] [--out benchmarks/results/bench_sampler.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS_DIR, machine_info, print_table, write_json  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def child(spec: dict) -> dict:
    import time

    import numpy as np

    from packfmt.torch import DistributedPackSampler

    P, K = spec["packs"], spec["groups"]

    class Stand:
        fingerprint = "bench"

        def __len__(self) -> int:
            return P

        def pack_num_tokens(self):
            return np.random.default_rng(0).integers(1000, 8192, P).astype(np.uint32)

        def pack_groups(self):
            return np.repeat(np.arange(K, dtype=np.int64), np.diff(np.linspace(0, P, K + 1).astype(np.int64)))

    t0 = time.perf_counter()
    s = DistributedPackSampler(Stand(), num_replicas=spec["ranks"], rank=0, balance=spec["balance"],
                               window=spec["window"], seed=1)
    t1 = time.perf_counter()
    first = next(iter(s))
    t2 = time.perf_counter()
    with open("/proc/self/status") as f:
        hwm = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    return {"construct_s": t1 - t0, "first_index_s": t2 - t1, "total_s": t2 - t0, "peak_rss_mb": hwm / 1024,
            "first": int(first), "packfmt": str(Path(sys.modules["packfmt"].__file__).parent.parent)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--packs", default="1e6,1e7,1e8", type=lambda t: [int(float(x)) for x in t.split(",")])
    ap.add_argument("--groups", type=int, default=4000)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--balance", default="none,tokens", type=lambda t: t.split(","))
    ap.add_argument("--window", type=int, default=4, help="members per window (0: a plain shuffle)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--baseline")
    ap.add_argument("--out", default=str(RESULTS_DIR / "bench_sampler.json"))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    codes = {"this": str(ROOT)}
    if args.baseline:
        codes[Path(args.baseline).name] = str(Path(args.baseline).resolve())
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    rows = []
    for packs in args.packs:
        for balance in args.balance:
            spec = {"packs": packs, "groups": args.groups, "ranks": args.ranks, "balance": balance,
                    "window": args.window or None}
            best: dict = {}
            for rep in range(args.repeat):
                names = list(codes) if rep % 2 == 0 else list(codes)[::-1]
                for code in names:
                    out = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True,
                                         text=True, env=dict(env, PYTHONPATH=codes[code]), check=True)
                    r = json.loads(out.stdout.strip().splitlines()[-1])
                    if code not in best or r["total_s"] < best[code]["total_s"]:
                        best[code] = r
            firsts = {r["first"] for r in best.values()}
            for code, r in best.items():
                rows.append({"packs": packs, "balance": balance, "window": args.window or None, "code": code,
                             "construct_s": r["construct_s"], "first_index_s": r["first_index_s"],
                             "total_s": r["total_s"], "vs_this": r["total_s"] / best["this"]["total_s"],
                             "peak_rss_mb": r["peak_rss_mb"], "same_first": len(firsts) == 1, "packfmt": r["packfmt"]})
                print(f"{packs:,} packs, balance={balance}, code={code}: {r['total_s']:.2f} s "
                      f"(construct {r['construct_s']:.2f}, first index {r['first_index_s']:.2f}), "
                      f"peak {r['peak_rss_mb']:,.0f} MB", flush=True)
    print_table(rows, ["packs", "balance", "code", "construct_s", "first_index_s", "total_s", "vs_this", "peak_rss_mb",
                       "same_first"], title=f"DistributedPackSampler, {args.ranks} ranks, window={args.window or None}, "
                                            f"{args.groups} members")
    write_json(args.out, {"machine": machine_info(), "args": vars(args), "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
