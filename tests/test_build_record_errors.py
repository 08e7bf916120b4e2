"""A tokenizer that raises on one record: the build names the record, its batch and the exception, with 1 worker
and with 2, and never takes it for a dead worker (packfmt/record_errors.py).

The real sample tokenizer encodes every record; ``TextEncoder.encode_ids`` is wrapped to raise when a text holds
``POISON`` (the workers are forked from this process, so they run the wrapper too). Under ``on_error="fail"`` the
build stops with an ``InputError`` naming the file, the line, the batch and the exception's type and message,
publishing nothing; under ``"skip"`` the record is counted under ``encode_error`` and the dataset is the one built
from the input without it. ``SystemExit`` in the tokenizer is such a record too (the build and the worker go on), a
``KeyboardInterrupt`` in a worker as well (workers ignore Ctrl-C), while in the build's own process it is Ctrl-C.
A worker that dies on a record (``os._exit``) twice ends the build with a message saying the crash repeats on those
records, not "lower --workers".
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import packfmt
from packfmt.build import build_text
from packfmt.errors import InputError, PackfmtError
from packfmt.report_paths import report_path
from packfmt.tokenize import TextEncoder

from limits import time_limit

SAMPLE_TOK = Path(packfmt.__file__).parent / "sample_data" / "tokenizer"
POISON = "POISON"
#: The poisoned record is line 6 of 10: the second record of the batch of lines 5-8 (batch_size 4).
LINE = 6


def lines(poisoned: bool = True) -> list[str]:
    out = [json.dumps({"text": f"The quick brown fox {k} jumps over the lazy dog."}) for k in range(10)]
    if poisoned:
        out[LINE - 1] = json.dumps({"text": f"a record the tokenizer cannot take: {POISON}"})
    else:
        del out[LINE - 1]
    return out


def write_input(path: Path, poisoned: bool = True) -> Path:
    path.write_text("\n".join(lines(poisoned)) + "\n", encoding="utf-8")
    return path


def poison(monkeypatch, exc_of) -> None:
    """``encode_ids`` raises ``exc_of()`` on a batch holding the poisoned text (in every process forked after)."""
    real = TextEncoder.encode_ids

    def encode_ids(self, texts):
        if any(POISON in t for t in texts):
            raise exc_of()
        return real(self, texts)

    monkeypatch.setattr(TextEncoder, "encode_ids", encode_ids)


def build(src: Path, out: Path, workers: int, on_error: str = "fail"):
    with time_limit(120, f"a build with {workers} worker(s) and a record the tokenizer raises on (a hang?)"):
        return build_text([src], out, SAMPLE_TOK, workers=workers, batch_size=4, on_error=on_error)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_record_the_tokenizer_raises_on_is_named_with_its_batch(tmp_path, monkeypatch, caplog, workers):
    src = write_input(tmp_path / "in.jsonl")
    poison(monkeypatch, lambda: ValueError("unsupported text in the tokenizer\nsecond line"))
    with caplog.at_level("WARNING"), pytest.raises(InputError) as info:
        build(src, tmp_path / "ds", workers)
    err = info.value
    assert (err.file, err.line, err.reason) == (str(src), LINE, "encode_error")
    for text in (str(err), err.cli_message()):
        assert text.startswith(f"{src}:{LINE}: ValueError: unsupported text in the tokenizer (raised while encoding "
                               f"the batch of records {src}:5-8, and again when this record was encoded alone: the "
                               "record fails every time, so it is not retried) [reason: encode_error]"), text
        assert "second line" not in text and "\n" not in text
    assert "on_error='skip'" in str(err) and "--on-error skip" in err.cli_message()
    assert not [r for r in caplog.records if "worker" in r.getMessage()]  # no worker died, none was replaced
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]  # nothing published, no temp dir left


@pytest.mark.parametrize("workers", [1, 2])
def test_skip_counts_the_record_and_writes_the_rest_of_its_batch(tmp_path, monkeypatch, workers):
    src = write_input(tmp_path / "in.jsonl")
    clean = build(write_input(tmp_path / "clean.jsonl", poisoned=False), tmp_path / "clean", 1)
    poison(monkeypatch, lambda: RuntimeError("tokenizer bug"))
    got = build(src, tmp_path / "ds", workers, on_error="skip")
    r = got.report
    assert r["skipped"] == {"encode_error": 1} and r["records_read"] == 10 and r["documents_written"] == 9
    (example,) = r["skipped_examples"]
    assert example["reason"] == "encode_error" and example["line"] == LINE
    named = report_path(src, tmp_path / "ds")  # a report names its inputs relative to the dataset (SECURITY A15)
    assert example["message"].startswith(f"{named}:{LINE}: RuntimeError: tokenizer bug (raised while encoding the "
                                         f"batch of records {named}:5-8")
    for name in ("tokens.bin", "doc_offsets.bin"):  # the records beside it in its batch are written, in order
        assert (got.path / name).read_bytes() == (clean.path / name).read_bytes(), name


@pytest.mark.parametrize("workers", [1, 2])
def test_sys_exit_in_the_tokenizer_is_the_record_s_error_not_a_dead_worker(tmp_path, monkeypatch, caplog, workers):
    src = write_input(tmp_path / "in.jsonl")
    poison(monkeypatch, lambda: SystemExit(3))
    with caplog.at_level("WARNING"), pytest.raises(InputError) as info:
        build(src, tmp_path / "ds", workers)
    text = str(info.value)
    assert text.startswith(f"{src}:{LINE}: SystemExit(3): the encoding code called sys.exit() (raised while "
                           f"encoding the batch of records {src}:5-8"), text
    assert "workers" not in text and not [r for r in caplog.records if "worker" in r.getMessage()]
    got = build(src, tmp_path / "skipped", workers, on_error="skip")
    assert got.report["skipped"] == {"encode_error": 1} and got.report["documents_written"] == 9


def test_keyboard_interrupt_raised_in_a_worker_is_the_record_s_error(tmp_path, monkeypatch):
    """A worker ignores SIGINT (the build's process handles Ctrl-C), so a KeyboardInterrupt there is the code's."""
    src = write_input(tmp_path / "in.jsonl")
    poison(monkeypatch, KeyboardInterrupt)
    with pytest.raises(InputError) as info:
        build(src, tmp_path / "ds", 2)
    assert f"{src}:{LINE}: KeyboardInterrupt raised by the encoding code (a worker ignores Ctrl-C: it was no " \
           "interrupt)" in str(info.value)


def test_keyboard_interrupt_in_the_build_s_own_process_stops_it(tmp_path, monkeypatch):
    """With one worker the tokenizer runs in the build's process: a KeyboardInterrupt there is Ctrl-C."""
    src = write_input(tmp_path / "in.jsonl")
    poison(monkeypatch, KeyboardInterrupt)
    with pytest.raises(KeyboardInterrupt):
        build(src, tmp_path / "ds", 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


def test_a_worker_that_dies_on_a_record_twice_is_a_crash_that_repeats(tmp_path, monkeypatch):
    """``os._exit`` in the tokenizer (no exception to catch): the worker dies on the batch, its replacement too; the
    error says the crash repeats on those records (not a lack of memory) and how to find the record."""
    src = write_input(tmp_path / "in.jsonl")
    parent = os.getpid()

    def exit_in_worker():
        if os.getpid() != parent:
            os._exit(3)
        return ValueError("not reached")

    poison(monkeypatch, exit_in_worker)
    with pytest.raises(PackfmtError) as info:
        build(src, tmp_path / "ds", 2)
    err = info.value
    for text, one in ((str(err), "batch_size=1"), (err.cli_message(), "--batch-size 1")):
        assert "exited with code 3 while tokenizing the batch that starts at " f"{src}:5 (records {src}:5-8)" in text
        assert "it ended the same way on the same records twice, so a record makes the encoding code crash (not a " \
               f"lack of memory): run the build again with {one} (now 4) to find the record" in text, text
        assert "free memory" not in text and "lower" not in text
    assert err.file == str(src) and err.field == "workers"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]


def test_cli_names_the_record_with_two_workers_and_skips_it_when_asked(tmp_path, monkeypatch, capsys):
    """``packfmt build ... --workers 2``: exit 1 and one line naming the record, its batch, the exception and the
    option that skips it; with ``--on-error skip``, exit 0 and the skip counted under ``encode_error``."""
    from packfmt import cli

    src = write_input(tmp_path / "in.jsonl")
    poison(monkeypatch, lambda: ValueError("unsupported text"))
    args = ["build", "text", str(src), "-o", str(tmp_path / "ds"), "--tokenizer", str(SAMPLE_TOK), "--workers", "2",
            "--batch-size", "4", "--no-progress"]
    with time_limit(120, "a CLI build with 2 workers and a record the tokenizer raises on (a hang?)"):
        assert cli.main(args) == 1
        err = capsys.readouterr().err.strip()
        assert err == (f"packfmt build: error: {src}:{LINE}: ValueError: unsupported text (raised while encoding the "
                       f"batch of records {src}:5-8, and again when this record was encoded alone: the record fails "
                       "every time, so it is not retried) [reason: encode_error] (use --on-error skip to count and "
                       "skip such records)"), err
        assert cli.main(args + ["--on-error", "skip"]) == 0
    printed = capsys.readouterr().out
    assert "10 records read = 9 written + 1 skipped" in printed and "skipped 1 x encode_error" in printed
    assert f"{src}:{LINE}: ValueError: unsupported text" in printed
