"""tools/train_example.py runs under torchrun (2 CPU ranks, gloo) and normalises by the global label count."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from packfmt.torch import PackedDataset, collate_hf

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN = Path(sys.executable).with_name("torchrun")


@pytest.mark.parametrize("layout", ["varlen", "padded"])
def test_torchrun_two_cpu_ranks(tmp_path, layout):
    if not TORCHRUN.exists():
        pytest.skip("torchrun not installed next to the interpreter")
    data, out = tmp_path / "demo", tmp_path / "log.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    cmd = [str(TORCHRUN), "--nproc_per_node=2", "--standalone", str(ROOT / "tools" / "train_example.py"),
           "--demo-data", str(data), "--steps", "3", "--batch-size", "2", "--grad-accum", "2", "--layout", layout,
           "--num-workers", "1", "--json-out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stderr[-3000:]
    logs = json.loads(out.read_text())
    assert [r["step"] for r in logs] == [0, 1, 2]
    assert all(math.isfinite(r["loss"]) and r["world_size"] == 2 for r in logs)
    assert logs[0]["loss"] == pytest.approx(math.log(512), abs=0.3)  # random init: about ln(vocab)
    if layout == "varlen":
        assert all(r["padding_fraction"] == 0.0 for r in logs)
    else:
        assert all(0.0 <= r["padding_fraction"] < 1.0 for r in logs)

    # Step 0 must be normalised by the supervised tokens of BOTH ranks' first two micro-batches.
    ds = PackedDataset(data)
    expected = 0
    for rank in range(2):
        sampler = DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=0, drop_last=True)
        sampler.set_epoch(0)
        batches = iter(DataLoader(ds, batch_size=2, sampler=sampler, collate_fn=collate_hf, drop_last=True))
        expected += sum(int(next(batches)["num_label_tokens"]) for _ in range(2))
    assert logs[0]["label_tokens"] == expected
