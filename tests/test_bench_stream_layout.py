"""benchmarks/bench_stream_layout.py runs end to end at a tiny size (in this process, no timing checked)."""

from __future__ import annotations

import json

from bench_runner import run_benchmark


def test_stream_layout_bench_runs_tiny(tmp_path, monkeypatch):
    out = tmp_path / "r.json"
    rc, _ = run_benchmark(monkeypatch, "bench_stream_layout", [
        "--docs", 20000, "--members", 4, "--repeat", 1, "--capacity", 64, "--shard-bytes", "16KiB", "--in-process",
        "--out", out], env={"BENCH_TMP": tmp_path})
    assert rc == 0
    rec = json.loads(out.read_text())
    rows = {(r["stage"], r["balance"]): r for r in rec["rows"]}
    assert set(rows) == {("ready", "-")} | {(s, b) for s in ("sampler", "first batch") for b in ("none", "tokens")}
    assert all(r["code"] == "this" and r["documents"] == 20000 for r in rec["rows"])
    coll = rec["collections"][0]
    assert coll["documents"] == 20000 and coll["shards"] > 2  # 16 KiB shards: several
    assert all(r["fetched_mb"] > 0 and r["requests"] > 0 for r in rec["rows"])
    for b in ("none", "tokens"):  # the first batch reads a shard the sampler stage did not
        first, sampler = rows[("first batch", b)], rows[("sampler", b)]
        assert first["fetched_by_folder_mb"].get("shards", 0) > 0
        assert "shards" not in sampler["fetched_by_folder_mb"]
        assert 0 < first["of_index"] <= 1
