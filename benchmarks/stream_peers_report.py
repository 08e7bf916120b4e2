"""The tables of ``bench_stream_peers.py``: medians per library, issue 30's goals, GET bytes by file, profiles."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np

from stream_peers_setup import LIBRARIES

SUMMARY = ["shard", "library", "fetched_x", "vs_cached", "ttfb_process_s", "ttfb_dataset_s", "tokens_per_s", "disk_x",
           "missing_docs", "extra_docs", "error"]
GOALS = ["shard", "goal", "packfmt", "best_peer", "bound", "met"]


def print_profile(path: Path, title: str, top: int = 30) -> None:
    import io
    import pstats

    buf = io.StringIO()
    pstats.Stats(str(path), stream=buf).sort_stats("cumulative").print_stats(top)
    text = buf.getvalue()
    print(f"--- profile: {title}\n" + text[text.find("ncalls"):], file=sys.stderr, flush=True)


def by_file(got: list, asked: list) -> dict:
    """By file name, digits as ``#`` (``shard.#.mds``, ``manifest.json``; the bucket's listings as ``(bucket)``), all
    nodes together: GET body bytes, objects read, and requests by method."""
    out: dict = {}
    for counts in got:
        for path, n in counts.items():
            row = out.setdefault(kind(path), {"bytes": 0, "objects": 0})
            row["bytes"] += n
            row["objects"] += 1
    for counts in asked:
        for (method, path), n in counts.items():
            row = out.setdefault(kind(path), {"bytes": 0, "objects": 0})
            row[method] = row.get(method, 0) + n
    return dict(sorted(out.items()))


def kind(path: str) -> str:
    """``/bucket/a/b/shard.00012.mds`` -> ``shard.#.mds``; ``/bucket`` (a listing) -> ``(bucket)``."""
    return re.sub(r"\d+", "#", path.rstrip("/").rsplit("/", 1)[-1]) if path.strip("/").count("/") else "(bucket)"


def summarize(rows: list[dict]) -> list[dict]:
    """Per shard size and library: medians of the streamed runs (the documents missing or extra: the most of a run)."""
    out = []
    keys = sorted({(r["shard"], r["library"]) for r in rows}, key=lambda k: (k[0], LIBRARIES.index(k[1])))
    for shard, lib in keys:
        mine = [r for r in rows if r["shard"] == shard and r["library"] == lib]
        s = [r for r in mine if r["run"] == "streamed" and "error" not in r and "vs_cached" in r]
        if not s:  # every repeat failed: the first error
            out.append({"shard": shard, "library": lib, "error": next(r["error"] for r in mine if "error" in r)})
            continue
        med = {k: float(np.median([r[k] for r in s])) for k in SUMMARY[2:-3]}
        out.append({"shard": shard, "library": lib, **med,
                    "missing_docs": max(r["missing_docs"] for r in s), "extra_docs": max(r["extra_docs"] for r in s)})
    return out


def goals(rows: list[dict]) -> list[dict]:
    """Per shard size, issue 30's three numbers: packfmt's bytes fetched <= the best peer's, its streamed rate >= 0.95x
    its fully cached one, its time to first batch <= the fastest peer's."""
    out = []
    by = {(r["shard"], r["library"]): r for r in summarize(rows)}
    for shard in sorted({s for s, _ in by}):
        ours = by.get((shard, "packfmt"))
        peers = [v for (s, lib), v in by.items() if s == shard and lib != "packfmt" and "error" not in v]
        if ours is None or "error" in ours:
            continue
        for key, want in (("fetched_x", "<= best peer"), ("vs_cached", ">= 0.95"), ("ttfb_process_s", "<= best peer")):
            best = min(peers, key=lambda v: v[key]) if peers and key != "vs_cached" else None
            bound = 0.95 if key == "vs_cached" else (best[key] if best else None)
            met = None if bound is None else (ours[key] >= bound if key == "vs_cached" else ours[key] <= bound)
            out.append({"shard": shard, "goal": f"{key} {want}", "packfmt": ours[key],
                        "best_peer": best["library"] if best else "-", "bound": bound, "met": met})
    return out
