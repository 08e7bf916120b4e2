"""benchmarks/bench_layout_open.py runs end to end at a tiny size (in this process, no timing checked)."""

from __future__ import annotations

import json

from bench_runner import run_benchmark


def test_layout_open_bench_runs_tiny(tmp_path, monkeypatch):
    out, data = tmp_path / "r.json", tmp_path / "data"
    argv = ["--shards", "3,12", "--docs", 8, "--capacity", 128, "--repeat", 1, "--batch", 2, "--baseline", "none",
            "--in-process", "--data", data, "--out", out]
    rc, bench = run_benchmark(monkeypatch, "bench_layout_open", argv, env={"BENCH_TMP": tmp_path})
    assert rc == 0
    rec = json.loads(out.read_text())
    assert [(r["code"], r["runs"]) for r in rec["rows"]] == [("this", 1)] * 2
    assert [r["shards"] for r in rec["rows"]] == [x["shards"] for x in rec["layouts"]]
    assert 1 < rec["layouts"][0]["shards"] < rec["layouts"][1]["shards"] <= 12  # about as many shards as asked
    assert all(x["write_s"] is not None for x in rec["layouts"])
    for row in rec["rows"]:
        assert all(row[k] > 0 for k in (*bench.STAGES, "total"))
    rc, _ = run_benchmark(monkeypatch, "bench_layout_open", argv)  # --data: the layouts are reused, not rewritten
    assert rc == 0 and all(x["write_s"] is None for x in json.loads(out.read_text())["layouts"])
