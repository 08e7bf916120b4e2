"""Tiny shared helpers for the benchmark scripts: a plain-text table and a JSON result file.

Every benchmark prints a table to stdout and writes the same numbers to
``benchmarks/results/<name>.json`` so runs can be compared by machine.

    from common import print_table, write_json, machine_info
    rows = [{"case": "memmap", "docs_per_s": 1.2e6}]
    print_table(rows, ["case", "docs_per_s"])
    write_json(RESULTS_DIR / "bench_read.json", {"rows": rows, "machine": machine_info()})
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

#: ``benchmarks/results/`` (created on first write).
RESULTS_DIR = Path(__file__).resolve().parent / "results"

__all__ = ["RESULTS_DIR", "format_value", "print_table", "write_json", "machine_info", "commit_info", "timed"]


def format_value(value: Any) -> str:
    """Human formatting for a table cell: thousands separators, 3-4 significant digits for floats."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value != value:  # NaN
            return "nan"
        magnitude = abs(value)
        if magnitude >= 1e5:
            return f"{value:,.0f}"
        if magnitude >= 100:
            return f"{value:,.1f}"
        if magnitude >= 1 or magnitude == 0:
            return f"{value:.3f}"
        return f"{value:.4g}"
    return str(value)


def print_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str], *, title: str | None = None,
                file=None) -> str:
    """Print ``rows`` (dicts) as an aligned text table of ``columns``; return the text.

    Text cells are left-aligned, numbers right-aligned; a missing key prints as ``-``.
    """
    file = sys.stdout if file is None else file
    cells = [[format_value(r.get(c, "-")) if c in r else "-" for c in columns] for r in rows]
    numeric = [all(isinstance(r.get(c), (int, float)) and not isinstance(r.get(c), bool) for r in rows if c in r)
               for c in columns]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]

    def line(values: Iterable[str]) -> str:
        parts = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)]
        return "  ".join(parts).rstrip()

    out = []
    if title:
        out.append(title)
    out.append(line(columns))
    out.append("  ".join("-" * w for w in widths))
    out.extend(line(row) for row in cells)
    text = "\n".join(out)
    print(text, file=file, flush=True)
    return text


def write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Write ``obj`` as sorted, indented JSON (parents created); return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True, default=_json_default)
        f.write("\n")
    return path


def _json_default(obj: Any) -> Any:
    """numpy scalars / arrays and paths -> plain JSON values."""
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


def machine_info() -> dict:
    """Where the numbers were measured (CPU count, Python, numpy, platform, UTC time)."""
    import numpy as np

    return {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def commit_info() -> dict:
    """The code measured: this checkout's commit and whether tracked files differ from it (``git``; None outside a
    checkout)."""
    import subprocess

    root = Path(__file__).resolve().parents[1]

    def git(*cmd: str) -> str | None:
        done = subprocess.run(["git", "-C", str(root), *cmd], capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else None

    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


class timed:
    """Context manager measuring wall seconds: ``with timed() as t: ...; t.seconds``."""

    def __enter__(self) -> "timed":
        self._t0 = time.perf_counter()
        self.seconds = 0.0
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.perf_counter() - self._t0


def best_of(fn, repeats: int) -> float:
    """The fastest of ``repeats`` timed calls of ``fn`` (seconds): what the benchmarks report."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def web_like_corpus(n_docs: int, *, seed: int = 0, max_len: int = 8192, vocab: int = 50_000):
    """``(rng, lengths, doc_offsets, uint16 tokens)`` of ``n_docs`` web-like documents (lognormal lengths, mean ~250)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(5.0, 1.0, n_docs).astype(np.int64), 1, max_len)
    offsets = np.zeros(n_docs + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return rng, lengths, offsets, rng.integers(0, vocab, int(offsets[-1]), dtype=np.uint16)


def add_gpu_args(parser, results_name: str, smoke_help: str = "run on the CPU (a check that the script works)") -> None:
    """The two options every GPU benchmark has: ``--cpu-smoke`` and ``--out`` (default ``results/<results_name>``)."""
    parser.add_argument("--cpu-smoke", action="store_true", help=smoke_help)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / results_name)


def gpu_device(parser, args, name: str):
    """What a GPU benchmark checks first: ``--cpu-smoke`` (a run on the CPU that only shows the script works) never
    writes the default results file; without CUDA and without it, nothing is measured (a message, then None). Else
    the device to run on: the GPU, or the CPU for a smoke run."""
    import torch

    if args.cpu_smoke and args.out == parser.get_default("out"):
        parser.error("--cpu-smoke needs an --out other than the results file")
    if not torch.cuda.is_available() and not args.cpu_smoke:
        print(f"{name}: no CUDA GPU here; nothing measured.")
        return None
    return torch.device("cuda" if torch.cuda.is_available() and not args.cpu_smoke else "cpu")
