"""benchmarks/bench_stream_open.py runs end to end at a tiny size (in this process, no timing checked)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_stream_open_bench_runs_tiny(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    monkeypatch.setenv("BENCH_TMP", str(tmp_path))
    import bench_stream_open

    out = tmp_path / "r.json"
    try:
        assert bench_stream_open.main(["--docs", "400", "--members", "4", "--repeat", "1", "--capacity", "64",
                                       "--in-process", "--out", str(out)]) == 0
    finally:
        sys.modules.pop("bench_stream_open", None)
    rec = json.loads(out.read_text())
    rows = {(r["mode"], r["stage"]): r for r in rec["rows"]}
    assert set(rows) == {(m, s) for m in bench_stream_open.MODES for s in bench_stream_open.STAGES}
    coll = rec["collections"][0]
    assert coll["documents"] == 400 and coll["pack0_members"] < 4
    assert all(rows[("local", s)]["fetched_mb"] == 0 for s in bench_stream_open.STAGES)
    b = coll["bytes"]
    fetched = {k: round(r["fetched_mb"] * 2**20) for k, r in rows.items()}
    assert fetched["cached", "open"] == b["members"] + b["collection_own"] + b["pack_index"]  # all of it
    own = b["collection_own"] - 8 * coll["documents"]  # its own files but doc_lengths.bin, which streaming never reads
    assert fetched["stream", "open"] == own  # no member, no index
    assert fetched["stream", "ready"] == own + b["pack_index"]
    assert fetched["stream", "ready"] < fetched["stream", "first batch"] < fetched["cached", "open"]  # pack 0's members
    assert rows[("stream", "first batch")]["requests"] > 0
