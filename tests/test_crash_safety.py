"""A writer or a pack-index build killed (SIGKILL) at any moment never leaves a target that opens.

Each trial runs the writer in a subprocess, waits until it has started writing, kills it after a
random delay, and checks that the target either does not exist or (when the kill came after the
atomic publish) validates deeply. A rerun afterwards succeeds and removes the stale temp dirs.

Then the CLI's own exits: SIGTERM / SIGINT mid-build (rc 143 / 130, temp dir removed), SIGINT during
the heavy imports (rc 130, no traceback or C++ abort), a kill between the two renames of an
--overwrite (the next build restores or removes the old copy), and a closed stdout pipe (rc 141, quiet).
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
from shlex import quote as shlex_quote
import time
from pathlib import Path

import numpy as np
import pytest

import limits
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
    import packfmt.index_writer as iw
    import packfmt.packindex as pi
    dataset, pause = sys.argv[1], float(sys.argv[2])
    class SlowFile(pi.HashedFile):
        opened = 0
        def __init__(self, path, **options):  # direct=True for segments.bin
            super().__init__(path, **options)
            SlowFile.opened += 1
            if SlowFile.opened == 1:
                print("ready", flush=True)  # the temp dir exists and the first file is open
        def write(self, data):
            time.sleep(pause)
            super().write(data)
    pi.HashedFile = iw.HashedFile = SlowFile  # packindex writes pack_offsets.bin, index_writer the rest
    iw.MATERIALIZE_CHUNK_TOKENS = 256  # many small writes: the build takes a while
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


# ----------------------------------------------------------------------------- CLI signals, pipes, orphans
TOKENIZER = Path(packfmt.__file__).parent / "sample_data" / "tokenizer"
CLI = [sys.executable, "-c", "import sys; from packfmt.cli import entry_point; sys.argv[0] = 'packfmt'; entry_point()"]
TIMEOUT = limits.scaled(120)  # seconds for any one subprocess (x the load factor): fail rather than hang


def _env() -> dict:
    root = str(Path(packfmt.__file__).parent.parent)
    return {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def _wait_for(condition, proc: subprocess.Popen, what: str, timeout: float = TIMEOUT):
    """Poll ``condition()`` until it returns a true value; fail early if ``proc`` exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if proc.poll() is not None:
            pytest.fail(f"the process exited (rc {proc.returncode}) before {what}: {proc.stderr.read()}")
        time.sleep(0.05)
    proc.kill()
    pytest.fail(f"timed out waiting for {what} ({limits.describe(120, timeout)})")


def _open_fifo_for_writing(fifo: Path, proc: subprocess.Popen) -> int:
    """Open ``fifo`` once ``proc`` has opened it for reading (ENXIO until then)."""
    def try_open():
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK) + 1  # +1: fd 0 would read as false
        except OSError as exc:
            assert exc.errno == errno.ENXIO
            return None
    fd = _wait_for(try_open, proc, "the build opened its input") - 1
    os.set_blocking(fd, True)
    return fd


def _assert_quiet(stderr: str) -> None:
    for bad in ("Traceback", "terminate called", "core dumped", "Exception ignored", "Error"):
        assert bad not in stderr, stderr


@pytest.mark.parametrize("sig, rc, workers", [(signal.SIGTERM, 143, 1), (signal.SIGINT, 130, 1),
                                              (signal.SIGTERM, 143, 2)])
def test_signal_mid_build_removes_the_temp_dir(tmp_path, sig, rc, workers):
    """The input is a FIFO we keep open: the build is certainly mid-way (temp dir made, records read) when signalled."""
    fifo = tmp_path / "in.jsonl"
    os.mkfifo(fifo)
    out = tmp_path / "ds"
    proc = subprocess.Popen([*CLI, "build", "text", str(fifo), "-o", str(out), "--tokenizer", str(TOKENIZER),
                             "--no-progress", "--batch-size", "4", "--workers", str(workers)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    fd = None
    try:
        fd = _open_fifo_for_writing(fifo, proc)  # the writer makes its temp dir before it reads its input
        assert len(_temps(tmp_path, "ds")) == 1
        os.write(fd, b"".join(json.dumps({"text": f"record {i} " * 30}).encode() + b"\n" for i in range(32)))
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=TIMEOUT)
    finally:
        if fd is not None:
            os.close(fd)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == rc, stderr
    assert "packfmt build: interrupted" in stderr
    _assert_quiet(stderr)
    assert _temps(tmp_path, "ds") == [] and not out.exists()


@pytest.mark.parametrize("mid_import", ["numpy.", "torch."])
def test_sigint_during_heavy_imports_exits_130_quietly(tmp_path, mid_import):
    """-X importtime lists each module as its import completes: a numpy (torch) submodule means numpy (torch)
    is mid-import. numpy loads only after the CLI's handler is installed (packfmt/__init__ is lazy). A chat build
    imports torch (through transformers, which renders the template); a text build does not (fast_tokenizer)."""
    kind = "chat" if mid_import == "torch." else "text"
    proc = subprocess.Popen([sys.executable, "-X", "importtime", *CLI[1:], "build", kind,
                             str(TOKENIZER.parent / f"{kind}.jsonl"), "-o", str(tmp_path / "ds"),
                             "--tokenizer", str(TOKENIZER), "--no-progress"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    lines = []
    try:
        for line in proc.stderr:
            lines.append(line)
            if line.rsplit("|", 1)[-1].strip().startswith(mid_import):
                proc.send_signal(signal.SIGINT)
                break
        else:
            pytest.fail(f"{mid_import} was never imported: " + "".join(lines[-5:]))
        rest, = proc.communicate(timeout=TIMEOUT)[1:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, rest
    stderr = "".join(x for x in rest.splitlines(True) if not x.startswith("import time:"))
    # numpy loads while the subcommands are registered, before the command is known
    assert ("packfmt: interrupted" if mid_import == "numpy." else "packfmt build: interrupted") in stderr
    _assert_quiet(stderr)
    assert not (tmp_path / "ds").exists() and _temps(tmp_path, "ds") == []


KILL_BETWEEN_RENAMES = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    import packfmt, packfmt._io as io
    target, n_docs, kill_at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    renames = []
    real_rename = os.rename
    def rename(a, b):  # publish_dir's renames: 1 old copy aside, 2 new copy in, 3 old copy to the trash name
        renames.append(b)
        if len(renames) == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        real_rename(a, b)
    io.os = type(os)("os_shim")
    io.os.__dict__.update(os.__dict__)
    io.os.rename = rename
    rng = np.random.default_rng(n_docs)
    with packfmt.DatasetWriter(target, vocab_size=100, overwrite=True) as w:
        for _ in range(n_docs):
            w.add_document(rng.integers(0, 100, 20))
""")


def _olds(parent: Path, name: str) -> list[Path]:
    return [p for p in parent.iterdir() if p.name.startswith(f".{name}.packfmt-old-")]


@pytest.mark.parametrize("kill_at", [2, 3])
def test_overwrite_killed_between_renames_is_recovered_by_the_next_build(tmp_path, kill_at):
    """kill_at=2: old copy aside, new not in place -> the next build restores the old copy.
    kill_at=3: new copy in place, old not yet removed -> the next build deletes the old copy."""
    script = tmp_path / "overwrite.py"
    script.write_text(KILL_BETWEEN_RENAMES)
    target = tmp_path / "ds"
    with packfmt.DatasetWriter(target, vocab_size=100) as w:
        w.add_document(np.arange(10))
    killed = subprocess.run([sys.executable, str(script), str(target), "7", str(kill_at)], capture_output=True,
                            text=True, timeout=TIMEOUT, env=_env())
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert len(_olds(tmp_path, "ds")) == 1
    assert target.exists() == (kill_at == 3)

    if kill_at == 2:  # the only complete copy is the hidden old one: a build without overwrite must not lose it
        with pytest.warns(UserWarning, match="restored from .ds.packfmt-old-"):
            with pytest.raises(packfmt.DatasetExistsError):
                packfmt.DatasetWriter(target, vocab_size=100)
        assert packfmt.open(target).num_documents == 1  # the copy from before the interrupted overwrite
    else:
        assert packfmt.open(target).num_documents == 7
        with packfmt.DatasetWriter(target, vocab_size=100, overwrite=True) as w:
            w.add_document(np.arange(5))
        assert packfmt.open(target).num_documents == 1
    assert _olds(tmp_path, "ds") == [] and _temps(tmp_path, "ds") == []
    report = validate(target, deep=True)
    assert report.ok, report.format()


def test_orphaned_old_pack_index_warning_and_cli_reaping(packed_dataset):
    """validate says what the leftover is and what removes it; `packfmt pack` then does exactly that."""
    packs = packed_dataset / F.PACKS_DIR
    dead_pid = _dead_pid()
    orphan = packs / f".keep.packfmt-old-{dead_pid}-{int(time.time()) - 60}"
    shutil.copytree(packs / "keep", orphan)  # what a kill after the second rename leaves: old copy next to new
    detail = [p.message for p in validate(packed_dataset).problems if ".keep.packfmt-old-" in p.file]
    assert detail and "packs/keep is in place" in detail[0] and "packfmt pack --name keep" in detail[0]

    shutil.rmtree(packs / "keep")  # now the old copy is the only one: validate and pack must restore it
    detail = [p.message for p in validate(packed_dataset).problems if ".keep.packfmt-old-" in p.file]
    assert detail and "packs/keep is missing" in detail[0] and "restores it" in detail[0]
    done = subprocess.run([*CLI, "pack", str(packed_dataset), "--capacity", "256", "--name", "keep"],
                          capture_output=True, text=True, timeout=TIMEOUT, env=_env())
    assert done.returncode == 1 and "already exists" in done.stderr, done.stderr  # restored, so not rebuilt
    assert "restored from .keep.packfmt-old-" in done.stderr
    assert not orphan.exists()
    report = validate(packed_dataset, deep=True)
    assert report.ok and report.warnings == [], report.format()
    assert packfmt.open(packed_dataset).pack_index("keep").num_packs > 0


def _dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          timeout=TIMEOUT)
    return int(proc.stdout)


def test_closed_stdout_pipe_exits_141_without_traceback(packed_dataset):
    for args in (["inspect", str(packed_dataset)], ["validate", str(packed_dataset), "--json"],
                 ["inspect", str(packed_dataset), "--show-pack", "0"]):
        proc = subprocess.Popen([*CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
        proc.stdout.close()  # no reader left: the first write fails with EPIPE, whatever the timing
        stderr = proc.stderr.read()
        proc.wait(timeout=TIMEOUT)
        assert proc.returncode == 141, (args, stderr)
        _assert_quiet(stderr)
        assert "BrokenPipe" not in stderr and stderr == "", (args, stderr)


def test_pipe_closed_by_head_is_quiet(packed_dataset):
    """The shell form from the docs: `packfmt inspect DS | head -1`."""
    cmd = " ".join(map(shlex_quote, [*CLI, "inspect", str(packed_dataset)])) + " | head -1"
    done = subprocess.run(["bash", "-c", "set -o pipefail; " + cmd], capture_output=True, text=True, timeout=TIMEOUT,
                          env=_env())
    assert done.stdout.startswith("dataset ") and done.stdout.count("\n") == 1
    assert done.returncode in (0, 141)  # 0 when all output fit in the pipe before head exited
    _assert_quiet(done.stderr)
    assert done.stderr == ""
