"""A writer or a pack-index build killed (SIGKILL) at any moment never leaves a target that opens.

Each trial runs the writer in a subprocess, waits until it has started writing, kills it after a
random delay, and checks that the target either does not exist or (when the kill came after the
atomic publish) validates deeply. A rerun afterwards succeeds and removes the stale temp dirs.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import packfmt
from packfmt import format as F
from packfmt.packindex import build_pack_index
from packfmt.validate import validate

pytestmark = pytest.mark.skipif(os.name != "posix", reason="SIGKILL semantics")

TRIALS = 6

WRITER = textwrap.dedent("""
    import sys, time
    import numpy as np
    import packfmt
    target, n_docs, pause = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    rng = np.random.default_rng(0)
    w = packfmt.DatasetWriter(target, vocab_size=1000, loss_mask=True, overwrite=False)
    print("ready", flush=True)
    for i in range(n_docs):
        n = int(rng.integers(1, 200))
        w.add_document(rng.integers(0, 1000, n), rng.integers(0, 2, n))
        if i % 10 == 0:
            time.sleep(pause)  # slow enough that kills land mid-write
    w.finalize()
    print("done", flush=True)
""")

PACKER = textwrap.dedent("""
    import sys, time
    import packfmt.packindex as pi
    dataset, pause = sys.argv[1], float(sys.argv[2])
    class SlowFile(pi.HashedFile):
        opened = 0
        def __init__(self, path):
            super().__init__(path)
            SlowFile.opened += 1
            if SlowFile.opened == 1:
                print("ready", flush=True)  # the temp dir exists and the first file is open
        def write(self, data):
            time.sleep(pause)
            super().write(data)
    pi.HashedFile = SlowFile
    pi._MATERIALIZE_CHUNK_TOKENS = 256  # many small writes: the build takes a while
    pi.build_pack_index(dataset, capacity=128, algorithm="ffd", name="victim", materialize=True)
    print("done", flush=True)
""")


def _run_and_kill(script: Path, args: list[str], delay: float) -> bool:
    """Start ``script``; SIGKILL it ``delay`` s after it prints "ready". Returns True if it had finished."""
    proc = subprocess.Popen([sys.executable, str(script), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        line = proc.stdout.readline()
        assert line.strip() == "ready", (line, proc.stderr.read() if proc.poll() is not None else "")
        time.sleep(delay)
        finished = proc.poll() is not None
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    return finished and proc.returncode == 0


def _temps(parent: Path, name: str) -> list[Path]:
    return [p for p in parent.iterdir() if p.name.startswith(f".{name}.packfmt-tmp-")]


def test_killed_writer_never_publishes(tmp_path):
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    rng = random.Random(1234)
    killed_mid_write = 0
    for trial in range(TRIALS):
        target = tmp_path / f"ds{trial}"
        finished = _run_and_kill(script, [str(target), "600", "0.01"], rng.uniform(0.0, 0.45))
        if target.exists():
            assert validate(target, deep=True).ok  # killed after the atomic rename: complete and valid
        else:
            killed_mid_write += 1
            assert not finished
            assert len(_temps(tmp_path, target.name)) == 1  # only the hidden temp dir is left
        # a rerun at the same path succeeds and cleans up the dead writer's temp dir
        if not target.exists():
            done = subprocess.run([sys.executable, str(script), str(target), "50", "0"], capture_output=True,
                                  text=True, timeout=120)
            assert done.returncode == 0, done.stderr
            assert done.stdout.split() == ["ready", "done"]
            report = validate(target, deep=True)
            assert report.ok, report.format()
            assert packfmt.open(target).num_documents == 50
            assert _temps(tmp_path, target.name) == []
    assert killed_mid_write >= TRIALS // 2  # the kills really did land mid-write


@pytest.fixture
def packed_dataset(tmp_path) -> Path:
    root = tmp_path / "ds"
    rng = np.random.default_rng(0)
    with packfmt.DatasetWriter(root, vocab_size=5000, loss_mask=True) as w:
        for _ in range(300):
            n = int(rng.integers(1, 120))
            w.add_document(rng.integers(0, 5000, n), rng.integers(0, 2, n))
    build_pack_index(root, capacity=256, algorithm="bfd", name="keep", materialize=True)
    return root


def test_killed_pack_build_leaves_other_indexes_valid(packed_dataset, tmp_path):
    script = tmp_path / "packer.py"
    script.write_text(PACKER)
    packs = packed_dataset / F.PACKS_DIR
    rng = random.Random(99)
    killed_mid_build = 0
    for _ in range(TRIALS):
        victim = packs / "victim"
        finished = _run_and_kill(script, [str(packed_dataset), "0.01"], rng.uniform(0.0, 0.6))
        report = validate(packed_dataset, deep=True)
        assert report.ok, report.format()  # "keep" (and a complete "victim", if any) still validate
        assert packfmt.open(packed_dataset).pack_index("keep").num_packs > 0
        if victim.exists():
            break  # a build that completed is final; later trials would need --overwrite
        killed_mid_build += 1
        assert not finished
        assert any(p.severity == "warning" and ".victim.packfmt-tmp-" in p.file for p in report.problems)
    assert killed_mid_build >= 3
    if not (packs / "victim").exists():
        done = subprocess.run([sys.executable, str(script), str(packed_dataset), "0"], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
    report = validate(packed_dataset, deep=True)
    assert report.ok and report.warnings == [], report.format()  # the rerun removed the stale temp dirs
    assert report.checked["pack_indexes"] == 2
    assert _temps(packs, "victim") == []
