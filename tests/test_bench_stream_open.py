"""benchmarks/bench_stream_open.py runs end to end at a tiny size (in this process, no timing checked)."""

from __future__ import annotations

import json

from bench_runner import run_benchmark


def test_stream_open_bench_runs_tiny(tmp_path, monkeypatch):
    out = tmp_path / "r.json"
    rc, bench = run_benchmark(monkeypatch, "bench_stream_open", [
        "--docs", 400, "--members", 4, "--repeat", 1, "--capacity", 64, "--in-process", "--out", out],
        env={"BENCH_TMP": tmp_path})
    assert rc == 0
    rec = json.loads(out.read_text())
    rows = {(r["mode"], r["stage"]): r for r in rec["rows"]}
    assert set(rows) == {(m, s) for m in bench.MODES for s in bench.STAGES}
    coll = rec["collections"][0]
    assert coll["documents"] == 400 and coll["pack0_members"] < 4
    assert all(rows[("local", s)]["fetched_mb"] == 0 for s in bench.STAGES)
    b = coll["bytes"]
    fetched = {k: round(r["fetched_mb"] * 2**20) for k, r in rows.items()}
    assert fetched["cached", "open"] == b["members"] + b["collection_own"] + b["pack_index"]  # all of it
    own = b["collection_own"] - 8 * coll["documents"]  # its own files but doc_lengths.bin, which streaming never reads
    assert fetched["stream", "open"] == own  # no member, no index
    assert fetched["stream", "ready"] == own + b["pack_index"]
    assert fetched["stream", "ready"] < fetched["stream", "first batch"] < fetched["cached", "open"]  # pack 0's members
    assert rows[("stream", "first batch")]["requests"] > 0
