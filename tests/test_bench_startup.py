"""benchmarks/bench_startup.py runs end to end with this checkout alone (no timing checked)."""

from __future__ import annotations

import json

from bench_runner import run_benchmark


def test_startup_bench_runs_without_a_baseline(tmp_path, monkeypatch):
    out = tmp_path / "r.json"
    rc, bench = run_benchmark(monkeypatch, "bench_startup", ["--repeat", 1, "--baseline", "none", "--out", out],
                              env={"BENCH_TMP": tmp_path})
    assert rc == 0
    rec = json.loads(out.read_text())
    assert [(r["case"], r["code"], r["runs"]) for r in rec["rows"]] == [(c, "this", 1) for c in bench.CASES]
    assert all(r["best_s"] > 0 and "vs_baseline" not in r for r in rec["rows"])
