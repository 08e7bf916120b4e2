"""benchmarks/bench_gpu_train.py runs end to end (on the CPU, tiny): a GPU session only has to run it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bench_runner import run_benchmark

ROOT = Path(__file__).resolve().parents[1]
OFFLINE = {"HF_HUB_OFFLINE": "1"}


def test_gpu_bench_runs_on_cpu_smoke(tmp_path, monkeypatch):
    out = tmp_path / "r.json"
    rc, bench = run_benchmark(monkeypatch, "bench_gpu_train", [
        "--cpu-smoke", "--docs", 60, "--capacity", 1024, "--steps", 3, "--warmup", 1, "--batch-size", 2, "--hidden", 32,
        "--layers", 1, "--heads", 2, "--out", out], env=OFFLINE)
    assert rc == 0
    rec = json.loads(out.read_text())
    rows = {r["config"]: r for r in rec["rows"]}
    assert len(rows) == len(bench.CONFIGS)
    for name in ("pad-to-max (naive)", "pad-to-longest", "packed ffd, B x cap + doc mask (sdpa)"):
        r = rows[name]
        assert r["status"] == "ok", r
        assert r["useful_tokens_per_s"] > 0 and r["final_loss"] > 0
    # The same batches (same seed): pad-to-longest never pads more than pad-to-max, packing pads least.
    pad_max, pad_longest = rows["pad-to-max (naive)"], rows["pad-to-longest"]
    packed = rows["packed ffd, B x cap + doc mask (sdpa)"]
    assert pad_longest["padding_fraction"] <= pad_max["padding_fraction"]
    assert packed["padding_fraction"] < pad_max["padding_fraction"]
    assert pad_max["padding_fraction"] > 0
    assert "speedup_vs_pad_to_max" in rows["pad-to-longest"]
    assert all(r["status"] == "ok" or r["status"].startswith("skipped") for r in rows.values())
    # torch's varlen_attn needs CUDA; on the CPU the same implementation runs its SDPA form, so the row runs
    varlen = rows["packed ffd, varlen (torch varlen_attn)"]
    assert varlen["status"] == "ok", varlen
    assert varlen["padding_fraction"] == 0.0 and varlen["data_wait_s"] >= 0 and varlen["step_s"] > 0
    assert rec["gpu"].startswith("cpu")


def test_gpu_bench_smoke_refuses_the_results_file():
    import subprocess

    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_gpu_train.py"), "--cpu-smoke"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "--out" in r.stderr


def test_gpu_equivalence_bench_runs_on_cpu_smoke(tmp_path, monkeypatch):
    """benchmarks/bench_gpu_equivalence.py end to end on the CPU (fp32, tiny): every path that runs here equals the
    documents alone, and the negative control misses by far more than the tolerance."""
    out = tmp_path / "eq.json"
    rc, _ = run_benchmark(monkeypatch, "bench_gpu_equivalence", [
        "--cpu-smoke", "--hidden", 32, "--layers", 1, "--heads", 2, "--docs", 10, "--capacity", 128, "--packs", 3,
        "--vocab", 97, "--out", out], env=OFFLINE)
    assert rc == 0
    rows = {r["path"]: r for r in json.loads(out.read_text())["rows"]}
    for name in ("sdpa, position_ids", "sdpa, 4-D document mask", "packfmt_varlen"):
        assert rows[name]["status"] == "pass" and rows[name]["max_abs_logit_diff"] <= 1e-4, rows[name]
    assert rows["negative control"]["status"] == "pass"
    assert rows["negative control"]["max_abs_logit_diff"] > 100 * rows["negative control"]["tolerance"]


def test_gpu_vlm_bench_runs_on_cpu_smoke(tmp_path, monkeypatch):
    """benchmarks/bench_gpu_vlm.py end to end on the CPU (tiny): real PNG images through a vision tower into packed
    rows, three rows (ffd, balanced, ffd with the image-balanced sampler); the balanced index spreads images at
    least as evenly as ffd under the same budget."""
    out = tmp_path / "vlm.json"
    rc, _ = run_benchmark(monkeypatch, "bench_gpu_vlm", [
        "--cpu-smoke", "--docs", 80, "--capacity", 512, "--side", 16, "--max-images", 4, "--batch-size", 2,
        "--ranks", 2, "--steps", 2, "--warmup", 1, "--vocab", 500, "--hidden", 32, "--layers", 1, "--heads", 2,
        "--vision-width", 32, "--vision-layers", 1, "--num-workers", 0, "--out", out], env=OFFLINE)
    assert rc == 0
    rows = {(r["index"], r["balance"]): r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {("ffd", "none"), ("balanced", "none"), ("ffd", "images")}
    for r in rows.values():
        assert r["status"] == "ok" and r["step_s"] > 0 and r["spread_max_over_mean"] >= 1.0, r
        assert r["images_per_pack_max"] <= 4  # the budget
    assert rows[("balanced", "none")]["images_per_pack_std"] <= rows[("ffd", "none")]["images_per_pack_std"]
