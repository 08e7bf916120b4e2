"""Start-up of the command line as whole processes, this checkout beside a baseline, run in the same invocation.

Cases (each a fresh ``python -m packfmt.cli ...``, as a user runs it):

- ``--help``: the parser, every subcommand's options;
- ``validate``: a small store (the 60 sample records, no pack index), structural;
- ``validate, 1 index``: the same store with one ffd pack index (its segment checks run numba);
- ``build text``: the 60 sample records (``packfmt/sample_data/text.jsonl``) with the sample tokenizer into a
  fresh directory (``--overwrite``).

The baseline is another code tree: ``--baseline REF`` (default ``main``) exports that git commit with ``git
archive`` into a temp folder (the work tree is untouched: an uncommitted change is in this checkout only, so
this is also how ``git stash`` would compare), ``--baseline DIR`` uses a tree on disk, ``--baseline none`` runs
this checkout alone. Children run with ``PYTHONPATH`` = the tree, ``HF_HUB_OFFLINE=1``, alternated this / baseline
(ABBA) ``--repeat`` times after one untimed warm-up each (the page cache); rows give the best and the median wall
seconds and ``vs_baseline`` (best over the baseline's best). The store is written by this checkout. The machine's
load average before and after goes into the results: timings on a shared machine are only comparable side by side.

    python benchmarks/bench_startup.py [--repeat 5] [--baseline main|REF|DIR|none] [--out benchmarks/results/bench_startup.json]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS_DIR, machine_info, print_table, write_json  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "packfmt" / "sample_data"
CASES = ("--help", "validate", "validate, 1 index", "build text")


def argv_of(case: str, work: Path) -> list[str]:
    store, indexed = work / "store", work / "indexed"
    return {"--help": ["--help"], "validate": ["validate", str(store)], "validate, 1 index": ["validate", str(indexed)],
            "build text": ["build", "text", str(SAMPLE / "text.jsonl"), "-o", str(work / "built"), "--tokenizer",
                           str(SAMPLE / "tokenizer"), "--overwrite", "--no-progress"]}[case]


def run(code: Path, argv: list[str]) -> float:
    """Wall seconds of ``python -m packfmt.cli ARGV`` with ``code`` first on the import path (must exit 0)."""
    env = {**os.environ, "PYTHONPATH": str(code), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "packfmt.cli", *argv], env=env, capture_output=True, text=True,
                          cwd=code)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{code}: packfmt {' '.join(argv)} exited {done.returncode}: {done.stderr[-2000:]}")
    return seconds


def export(ref: str, into: Path) -> Path:
    """The tree of git commit ``ref`` of this repository, written under ``into`` (``git archive``)."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], capture_output=True, check=False)
    if archive.returncode != 0:
        raise SystemExit(f"--baseline {ref}: git archive failed: {archive.stderr.decode()[-500:]}")
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def baseline_codes(parser, baseline: str, into: Path) -> dict[str, Path]:
    """``{label: code tree}`` of a ``--baseline`` option: {} for ``none``, a tree on disk ``DIR`` under its name,
    else the git commit ``baseline`` exported under ``into`` (``export``), labelled ``baseline REF``."""
    if baseline == "none":
        return {}
    base = Path(baseline)
    if not base.is_dir():
        return {f"baseline {baseline}": export(baseline, into)}
    if not (base / "packfmt" / "__init__.py").is_file():
        parser.error(f"--baseline {baseline}: expected a code tree with packfmt/__init__.py, found none")
    return {base.resolve().name: base.resolve()}


def make_stores(work: Path) -> None:
    """The validated stores, written by this checkout (a store, and a copy of it with one ffd index)."""
    run(ROOT, ["build", "text", str(SAMPLE / "text.jsonl"), "-o", str(work / "store"), "--tokenizer",
               str(SAMPLE / "tokenizer"), "--no-progress"])
    shutil.copytree(work / "store", work / "indexed")
    run(ROOT, ["pack", str(work / "indexed"), "--capacity", "512"])


def measure(codes: dict[str, Path], work: Path, repeat: int) -> list[dict]:
    times: dict[tuple[str, str], list[float]] = {(c, label): [] for c in CASES for label in codes}
    labels = list(codes)
    for case in CASES:
        argv = argv_of(case, work)
        for label in labels:  # warm-up: the page cache, numba's cache, Python's bytecode caches
            run(codes[label], argv)
        for k in range(repeat):
            for label in (labels if k % 2 == 0 else labels[::-1]):  # ABBA
                times[case, label].append(run(codes[label], argv))
    rows = []
    for case in CASES:
        base = min(times[case, labels[-1]]) if len(labels) > 1 else None
        for label in labels:
            got = times[case, label]
            rows.append({"case": case, "code": label, "best_s": min(got), "median_s": statistics.median(got),
                         "runs": len(got), **({"vs_baseline": min(got) / base} if base else {})})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5, help="timed runs per case and tree (default 5)")
    ap.add_argument("--baseline", default="main", help="a git commit (default main), a code tree DIR, or 'none'")
    ap.add_argument("--out", default=str(RESULTS_DIR / "bench_startup.json"))
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-startup-", dir=os.environ.get("BENCH_TMP")) as tmp:
        tmp = Path(tmp)
        codes = {"this": ROOT, **baseline_codes(ap, args.baseline, tmp / "baseline")}
        work = tmp / "work"
        work.mkdir()
        make_stores(work)
        load_before = os.getloadavg()
        rows = measure(codes, work, args.repeat)
        load_after = os.getloadavg()
    print_table(rows, ["case", "code", "best_s", "median_s", "runs", "vs_baseline"],
                title=f"packfmt start-up, whole processes (load average {load_before[0]:.1f} -> {load_after[0]:.1f} "
                      f"on {os.cpu_count()} cores)")
    write_json(args.out, {"rows": rows, "baseline": args.baseline, "repeat": args.repeat,
                          "load_average_before": load_before, "load_average_after": load_after,
                          "machine": machine_info()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
