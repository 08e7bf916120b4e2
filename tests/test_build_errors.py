"""Bad input never crashes a build halfway and never disappears: a clear error, or a counted skip."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import packfmt
from packfmt import cli
from packfmt.build import build_text
from packfmt.errors import InputError, PackfmtError
from packfmt.workers import KILL_AT_BATCH_ENV
from packfmt.tokenize import load_tokenizer

from limits import time_limit

os.environ["HF_HUB_OFFLINE"] = "1"
SAMPLE_TOK = Path(packfmt.__file__).parent / "sample_data" / "tokenizer"
GOOD = "The quick brown fox jumps over the lazy dog."

#: (raw JSONL line, reason it must be skipped for)
BAD_LINES = [
    ('{"text": "unterminated', "malformed_json"),
    ("[1, 2, 3]", "not_an_object"),
    ('{"body": "no text field"}', "missing_field"),
    ('{"text": null}', "missing_field"),
    ('{"text": 42}', "not_a_string"),
    ('{"text": "   \\n "}', "empty_text"),
]


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def mixed_input(tmp_path: Path) -> tuple[Path, dict]:
    lines, expected = [], {}
    for k, (line, reason) in enumerate(BAD_LINES):
        lines += [json.dumps({"text": f"{GOOD} {k}"}), line]
        expected[reason] = expected.get(reason, 0) + 1
    lines.append(json.dumps({"text": "last good record"}))
    return write_lines(tmp_path / "mixed.jsonl", lines), expected


@pytest.mark.parametrize("line,reason", BAD_LINES)
def test_fail_names_file_line_reason_and_publishes_nothing(tmp_path, line, reason):
    src = write_lines(tmp_path / "in.jsonl", [json.dumps({"text": GOOD}), json.dumps({"text": GOOD}), line])
    out = tmp_path / "ds"
    with pytest.raises(InputError) as info:
        build_text([src], out, SAMPLE_TOK, batch_size=2)
    err = info.value
    assert err.reason == reason and err.line == 3 and err.file == str(src)
    assert f"{src}:3" in str(err) and reason in str(err)
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["in.jsonl"]  # no temp directory left behind


def test_skip_counts_every_reason_and_keeps_good_records(tmp_path):
    src, expected = mixed_input(tmp_path)
    skip_log = tmp_path / "skips.jsonl"
    result = build_text([src], tmp_path / "ds", SAMPLE_TOK, on_error="skip", batch_size=3, skip_log=skip_log)
    r = result.report
    assert r["skipped"] == expected
    assert r["records_read"] == r["documents_written"] + sum(r["skipped"].values()) == 2 * len(BAD_LINES) + 1
    assert r["documents_written"] == len(BAD_LINES) + 1
    logged = [json.loads(x) for x in skip_log.read_text().splitlines()]
    assert [x["line"] for x in logged] == [2 * k + 2 for k in range(len(BAD_LINES))]
    assert [x["reason"] for x in logged] == [reason for _, reason in BAD_LINES]
    tok = load_tokenizer(SAMPLE_TOK)
    store = packfmt.open(result.path)
    assert store.document(0).tolist() == tok(f"{GOOD} 0")["input_ids"]
    assert store.document(len(store) - 1).tolist() == tok("last good record")["input_ids"]
    assert store.manifest.raw["build_report"]["skipped"] == expected


def test_skip_with_two_workers_same_report(tmp_path):
    src, expected = mixed_input(tmp_path)
    one = build_text([src], tmp_path / "a", SAMPLE_TOK, on_error="skip", batch_size=2)
    two = build_text([src], tmp_path / "b", SAMPLE_TOK, on_error="skip", batch_size=2, workers=2)
    assert one.report["skipped"] == two.report["skipped"] == expected
    assert (one.path / "tokens.bin").read_bytes() == (two.path / "tokens.bin").read_bytes()


def test_worker_killed_twice_on_a_batch_fails_in_one_line_and_leaves_nothing(tmp_path):
    """A tokenizing worker SIGKILLed (as by the out-of-memory killer) on batch 3 of 15, and its replacement on the
    same batch again: the CLI says it retried (one warning line), then exits 1 with one line naming the records, both
    deaths and the signal; no temp dir beside -o (multiprocessing.Pool waited forever)."""
    src = write_lines(tmp_path / "in.jsonl", [json.dumps({"text": f"{GOOD} {k}"}) for k in range(60)])
    out = tmp_path / "ds"
    root = str(Path(packfmt.__file__).parent.parent)
    env = {**os.environ, KILL_AT_BATCH_ENV: "3", "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with time_limit(120, "a build whose worker was killed (a hang?)"):
        proc = subprocess.run([sys.executable, "-m", "packfmt.cli", "build", "text", str(src), "-o", str(out),
                               "--tokenizer", str(SAMPLE_TOK), "--workers", "2", "--batch-size", "4", "--no-progress"],
                              capture_output=True, text=True, env=env, timeout=110)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 2, proc.stderr
    assert lines[0].startswith("packfmt build: worker ") and " was killed by SIGKILL while tokenizing records " \
        f"{src}:9-12; tokenizing them again in a fresh worker" in lines[0], lines[0]
    first = lines[0].split(" of 2 (pid ")[1].split(")")[0]
    assert lines[1].startswith("packfmt build: error: worker ") and " of 2 (pid " in lines[1]
    assert "was killed by SIGKILL" in lines[1] and "--workers" in lines[1] and "--batch-size" in lines[1]
    assert f"while tokenizing the batch that starts at {src}:9 (records {src}:9-12), its second try (the " \
        f"first: worker " in lines[1] and f"(pid {first}) was killed by SIGKILL; retried in a fresh worker)" in lines[1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]  # neither -o nor its temp sibling


def test_worker_killed_once_its_batch_is_retried_and_the_build_is_the_same(tmp_path, caplog, monkeypatch):
    """The worker holding batch 3 SIGKILLed (its first try only): a fresh worker tokenizes that batch (and the one
    queued behind it) again; the store is byte for byte the one-worker build's, every record read is written or
    skipped once, and a warning names the worker, its signal and the records."""
    src, expected = mixed_input(tmp_path)
    one = build_text([src], tmp_path / "a", SAMPLE_TOK, on_error="skip", batch_size=2)
    monkeypatch.setenv(KILL_AT_BATCH_ENV, "3:once")  # read by each worker as it starts (forked from this process)
    with time_limit(120, "a build whose worker was killed (a hang?)"), caplog.at_level("WARNING"):
        two = build_text([src], tmp_path / "b", SAMPLE_TOK, on_error="skip", batch_size=2, workers=2)
    r = two.report
    assert r["skipped"] == one.report["skipped"] == expected
    assert r["records_read"] == r["documents_written"] + sum(r["skipped"].values()) == one.report["records_read"]
    assert r["documents_written"] == one.report["documents_written"]
    for name in ("tokens.bin", "doc_offsets.bin"):
        assert (one.path / name).read_bytes() == (two.path / name).read_bytes(), name
    warned = [rec.getMessage() for rec in caplog.records if "was killed by SIGKILL" in rec.getMessage()]
    assert len(warned) == 1 and f"while tokenizing records {src}:5-6; tokenizing them again in a fresh worker" \
        in warned[0], warned
    assert packfmt.open(two.path).num_documents == r["documents_written"]


def test_worker_killed_from_outside_is_replaced(tmp_path):
    """A worker SIGKILLed by another process (psutil here, the OOM killer in life) mid-build: the input is a FIFO,
    so the build has surely started (temp dir made, records read) and waits for more input. The worker is replaced
    (what it held tokenized again) and the build ends with every record written once."""
    psutil = pytest.importorskip("psutil")
    fifo = tmp_path / "in.jsonl"
    os.mkfifo(fifo)
    root = str(Path(packfmt.__file__).parent.parent)
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    records = b"".join(json.dumps({"text": f"{GOOD} {k}"}).encode() + b"\n" for k in range(40))
    with time_limit(120, "a build whose worker was killed (a hang?)"):
        proc = subprocess.Popen([sys.executable, "-m", "packfmt.cli", "build", "text", str(fifo), "-o",
                                 str(tmp_path / "ds"), "--tokenizer", str(SAMPLE_TOK), "--workers", "2",
                                 "--batch-size", "4", "--no-progress"], stderr=subprocess.PIPE, text=True, env=env)
        try:
            with open(fifo, "wb") as feed:  # opens once the build opens its input (after making its temp dir)
                feed.write(records)
                feed.flush()
                while len(workers := psutil.Process(proc.pid).children()) < 2:
                    assert proc.poll() is None, proc.stderr.read()
                    time.sleep(0.05)
                victim = workers[-1].pid
                os.kill(victim, signal.SIGKILL)
                feed.write(records)
            _, err = proc.communicate()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 0, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("packfmt build: worker "), err
    assert f" of 2 (pid {victim}) was killed by SIGKILL " in lines[0] and lines[0].endswith(" a fresh worker"), err
    store = packfmt.open(tmp_path / "ds")
    report = store.manifest.raw["build_report"]
    assert report["records_read"] == report["documents_written"] == store.num_documents == 80, report
    assert store.document(79).tolist() == load_tokenizer(SAMPLE_TOK)(f"{GOOD} 39")["input_ids"]


def test_workers_exit_when_the_build_is_killed(tmp_path):
    """SIGKILL of the build itself (no cleanup can run): its workers see their task pipes end and exit, none
    is left behind blocked on a pipe (each closes the copies of the parent's pipe ends a fork gave it)."""
    psutil = pytest.importorskip("psutil")
    fifo = tmp_path / "in.jsonl"
    os.mkfifo(fifo)
    root = str(Path(packfmt.__file__).parent.parent)
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with time_limit(120, "workers of a killed build (orphans?)"):
        proc = subprocess.Popen([sys.executable, "-m", "packfmt.cli", "build", "text", str(fifo), "-o",
                                 str(tmp_path / "ds"), "--tokenizer", str(SAMPLE_TOK), "--workers", "2",
                                 "--batch-size", "4", "--no-progress"], stderr=subprocess.DEVNULL, env=env)
        try:
            with open(fifo, "wb") as feed:
                feed.write(b"".join(json.dumps({"text": f"{GOOD} {k}"}).encode() + b"\n" for k in range(40)))
                feed.flush()
                while len(workers := psutil.Process(proc.pid).children()) < 2:
                    assert proc.poll() is None
                    time.sleep(0.05)
                proc.kill()
                proc.wait()
                gone, alive = psutil.wait_procs(workers, timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for w in alive:
        w.kill()
    assert alive == [] and len(gone) == 2


def test_worker_killed_api_error_names_the_options(tmp_path, monkeypatch):
    src = write_lines(tmp_path / "in.jsonl", [json.dumps({"text": f"{GOOD} {k}"}) for k in range(20)])
    monkeypatch.setenv(KILL_AT_BATCH_ENV, "1")  # read by each worker as it starts (forked from this process)
    with time_limit(120, "a build whose worker was killed (a hang?)"), pytest.raises(PackfmtError) as info:
        build_text([src], tmp_path / "ds", SAMPLE_TOK, workers=2, batch_size=3)
    msg = str(info.value)
    assert "was killed by SIGKILL" in msg and "workers= (now 2)" in msg and "batch_size= (now 3)" in msg
    assert f"the batch that starts at {src}:1 (records {src}:1-3), its second try" in msg and "\n" not in msg
    assert [p.name for p in tmp_path.iterdir()] == ["in.jsonl"]


def test_worker_that_cannot_load_the_tokenizer_fails_in_one_line_without_a_traceback(tmp_path, capfd):
    """The tokenizer loaded at the start of the build (the converter of this process), then moved away before the
    workers load theirs: the build fails with one line naming the tokenizer, the worker and what to do, and no
    worker prints a traceback (multiprocessing did, then "exited with code 1 ... free memory")."""
    import shutil
    from functools import partial

    from packfmt.build import TextConverter
    from packfmt.pipeline import run_build
    from packfmt.sources import iter_records
    from packfmt.tokenize import TokenizerSpec

    src = write_lines(tmp_path / "in.jsonl", [json.dumps({"text": f"{GOOD} {k}"}) for k in range(20)])
    tok = tmp_path / "tok"
    shutil.copytree(SAMPLE_TOK, tok)
    spec = TokenizerSpec(str(tok), image_token=None)
    converter = TextConverter(spec)  # what build_text does first, in this process
    assert converter.encoder.identity["hash"]  # hashed at the start too (the manifest's identity), then gone
    shutil.rmtree(tok)
    capfd.readouterr()
    with time_limit(120, "a build whose workers cannot start (a hang?)"), pytest.raises(PackfmtError) as info:
        run_build(iter_records([str(src)], None, columns=converter.columns), converter, partial(TextConverter, spec),
                  tmp_path / "ds", report_base={}, workers=2, batch_size=3)
    err = info.value
    for text, flag in ((str(err), "workers=1"), (err.cli_message(), "--workers 1")):
        assert text.startswith("worker ") and f" of 2 could not load the tokenizer {tok} (TokenizerError: {tok}: " \
            "tokenizer not found" in text and f"then run the build again ({flag} loads it once)" in text, text
        assert "\n" not in text and "memory for 2 copies" in text
    assert err.file == str(tok) and err.field == "tokenizer"
    printed = capfd.readouterr()
    assert "Traceback" not in printed.err and printed.err == "", printed.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]  # nothing published, no temp dir left


def test_token_ids_not_below_vocab(tmp_path):
    src = write_lines(tmp_path / "in.jsonl", [json.dumps({"text": "a"}), json.dumps({"text": GOOD * 3})])
    tok = load_tokenizer(SAMPLE_TOK)
    small = max(tok("a")["input_ids"]) + 1  # "a" fits, the long text has larger ids
    assert max(tok(GOOD * 3)["input_ids"]) >= small
    with pytest.raises(InputError) as info:
        build_text([src], tmp_path / "ds", SAMPLE_TOK, vocab_size=small)
    assert info.value.reason == "token_out_of_range" and info.value.line == 2
    result = build_text([src], tmp_path / "ds", SAMPLE_TOK, vocab_size=small, on_error="skip")
    assert result.report["skipped"] == {"token_out_of_range": 1} and result.report["documents_written"] == 1


def test_undecodable_text_file(tmp_path):
    folder = tmp_path / "txt"
    folder.mkdir()
    (folder / "a.txt").write_text(GOOD)
    (folder / "b.txt").write_bytes(b"caf\xe9 latin-1 bytes")
    with pytest.raises(InputError) as info:
        build_text([folder], tmp_path / "ds", SAMPLE_TOK)
    assert info.value.reason == "undecodable_text" and info.value.file.endswith("b.txt")
    result = build_text([folder], tmp_path / "ds", SAMPLE_TOK, on_error="skip")
    assert result.report["skipped"] == {"undecodable_text": 1}


def test_nothing_written_is_an_error_not_an_empty_dataset(tmp_path):
    src = write_lines(tmp_path / "in.jsonl", ['{"text": ""}', "not json"])
    with pytest.raises(InputError) as info:
        build_text([src], tmp_path / "ds", SAMPLE_TOK, on_error="skip")
    assert info.value.reason == "nothing_written"
    assert not (tmp_path / "ds").exists()


def test_missing_input_and_unknown_format(tmp_path):
    with pytest.raises(InputError) as info:
        build_text([tmp_path / "nope.jsonl"], tmp_path / "ds", SAMPLE_TOK)
    assert info.value.reason == "missing_input"
    (tmp_path / "x.csv").write_text("text\nhello\n")
    with pytest.raises(InputError) as info:
        build_text([tmp_path / "x.csv"], tmp_path / "ds", SAMPLE_TOK)
    assert info.value.reason == "unknown_format"
    assert not (tmp_path / "ds").exists()


def test_cli_exit_codes_and_messages(tmp_path, capsys):
    src, expected = mixed_input(tmp_path)
    out = tmp_path / "ds"
    args = ["build", "text", str(src), "-o", str(out), "--tokenizer", str(SAMPLE_TOK), "--no-progress"]
    assert cli.main(args) == 1
    err = capsys.readouterr().err
    assert f"{src}:2" in err and "malformed_json" in err and "--on-error skip" in err
    assert not out.exists()
    assert cli.main(args + ["--on-error", "skip"]) == 0
    printed = capsys.readouterr().out
    assert f"{2 * len(BAD_LINES) + 1} records read = {len(BAD_LINES) + 1} written + {len(BAD_LINES)} skipped" in printed
    for reason, n in expected.items():
        assert f"skipped {n} x {reason}" in printed
    assert cli.main(["build", "text", str(src), "-o", str(tmp_path / "x"), "--tokenizer", str(tmp_path / "no-tok")]) == 1
    assert "tokenizer not found" in capsys.readouterr().err
    assert cli.main(["build", "text", str(src), "-o", str(tmp_path / "x"), "--tokenizer", str(SAMPLE_TOK), "--workers", "0"]) == 2


def test_worker_that_cannot_be_replaced_fails_in_one_line(tmp_path, monkeypatch):
    """A worker dies and the system refuses a process to replace it (fork: ENOMEM): one line naming the worker, the
    records it held and why no fresh worker started, and nothing written (no raw OSError, no hang)."""
    import errno

    from packfmt import pipeline

    real = pipeline._pool_context()

    class NoMoreProcesses:  # the real context; the third process it is asked for cannot be forked
        started = 0

        def Pipe(self, *args, **kwargs):
            return real.Pipe(*args, **kwargs)

        def Process(self, *args, **kwargs):
            proc = real.Process(*args, **kwargs)
            NoMoreProcesses.started += 1
            if NoMoreProcesses.started > 2:
                def refused():
                    raise OSError(errno.ENOMEM, "Cannot allocate memory")
                proc.start = refused
            return proc

    monkeypatch.setattr(pipeline, "_pool_context", NoMoreProcesses)
    src = write_lines(tmp_path / "in.jsonl", [json.dumps({"text": f"{GOOD} {k}"}) for k in range(20)])
    monkeypatch.setenv(KILL_AT_BATCH_ENV, "1:once")  # read by each worker as it starts (forked from this process)
    with time_limit(120, "a build whose worker could not be replaced (a hang?)"), pytest.raises(PackfmtError) as info:
        build_text([src], tmp_path / "ds", SAMPLE_TOK, workers=2, batch_size=3)
    msg = str(info.value)
    assert NoMoreProcesses.started == 3 and "\n" not in msg
    assert "was killed by SIGKILL while tokenizing records" in msg and f"{src}:1-3" in msg
    assert "no process could be started in its place (Cannot allocate memory)" in msg and "nothing was written" in msg
    assert [p.name for p in tmp_path.iterdir()] == ["in.jsonl"]
