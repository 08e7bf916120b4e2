"""benchmarks/bench_stream_peers.py runs end to end at a tiny size: packfmt streamed by two nodes through their
links (moto behind one FaultProxy each), then fully cached; the peers asked for with an interpreter that is absent
are skipped with a message. No timing is checked: what could break is the bookkeeping the table rests on."""

from __future__ import annotations

import json

from bench_runner import run_benchmark


def test_stream_peers_bench_runs_tiny_packfmt_and_skips_absent_peers(tmp_path, monkeypatch):
    out = tmp_path / "r.json"
    rc, bench = run_benchmark(monkeypatch, "bench_stream_peers", [
        "--docs", 3000, "--shard-size", "16KiB", "--capacity", 512, "--batch", 4, "--step-ms", 0, "--mbps", 0,
        "--latency-ms", 0,
        "--cache-fraction", 0.5,  # (at this size 10% is less than the collection's own files and the logs' room)
        "--peers-python", tmp_path / "absent" / "python", "--out", out], env={"BENCH_TMP": tmp_path})
    assert rc == 0
    rec = json.loads(out.read_text())
    assert set(rec["skipped"]) == {"mds", "litdata"} and all("no interpreter" in w for w in rec["skipped"].values())
    rows = {r["run"]: r for r in rec["rows"]}
    assert set(rows) == {"streamed", "cached"} and {r["library"] for r in rec["rows"]} == {"packfmt"}
    streamed, cached = rows["streamed"], rows["cached"]
    size = rec["sizes"][0]
    for row in (streamed, cached):  # every document of the corpus delivered, each once (a deal's padding aside)
        assert row["missing_docs"] == 0
        assert 1.0 <= row["tokens_x"] <= 1 + 512 / size["tokens"]
        assert row["batches"] > 0 and row["ttfb_process_s"] >= row["ttfb_dataset_s"] > 0
    # the nodes= deal: each shard fetched by about one node (both nodes reading every shard would be ~2x)
    assert 0.5 < streamed["fetched_x"] < 1.5, streamed["fetched_x"]
    assert cached["fetched_x"] < 0.25 * streamed["fetched_x"]  # the fill's files reused: manifests re-read only
    assert streamed["disk_x"] > 0 and "disk_x" not in cached
    assert 0 < sum(streamed["disk_at_peak"].values()) <= max(streamed["disk_peak_bytes"])  # what was on disk then
    files = streamed["fetched_by_file"]  # the links' counts by file: every GET byte is some file's
    assert sum(f["bytes"] for f in files.values()) == streamed["fetched_bytes"]
    assert sum(n for f in files.values() for k, n in f.items() if k.isupper()) == streamed["requests"]
    assert files["tokens.bin"]["objects"] >= size["formats"]["packfmt"]["objects"] // 10  # each shard's tokens
    assert rec["code"]["commit"] and rec["summary"][0]["library"] == "packfmt"
