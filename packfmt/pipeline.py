"""``packfmt build``: stream records from sources, tokenize in batches (optionally in N processes),
apply the error policy, and write a dataset with a build report.

The pipeline, per batch of ``batch_size`` records, in input order::

    source records ──prepare (main)──► payloads ──encode (worker pool)──► documents ──► DatasetWriter

``prepare`` is cheap and per record (pick a field, validate a conversation, resolve image paths);
``encode`` is the expensive, batched part (tokenization, image sniffing) and runs in worker
processes when ``workers > 1``. At most ``2 * workers`` batches are in flight, so memory stays
bounded whatever the input size, and results are consumed in submission order, so the output is
identical for any number of workers.

The workers are a ``concurrent.futures.ProcessPoolExecutor``: a worker that dies (the out-of-memory
killer's SIGKILL, a segfault) breaks the pool at once, and the build stops with one line naming the
worker and its signal (``multiprocessing.Pool`` would replace the worker and wait forever for the
lost batch). Test-only hook: with ``PACKFMT_TEST_KILL_WORKER_AT_BATCH=N`` in the environment, the
worker given batch N (1-based, submission order) kills itself with SIGKILL.

Every record ends up either written or skipped with a reason; ``on_error="fail"`` (default)
stops at the first bad record (``file:line: reason``) and publishes nothing (see ``skips``).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from collections import deque
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from .errors import InputError, PackfmtError
from .skips import Tally
from .sources import Raw
from .writer import DatasetWriter

__all__ = ["BuildResult", "ON_ERROR_POLICIES", "convert_records", "write_doc", "writer_args", "run_build"]

ON_ERROR_POLICIES = ("fail", "skip")

#: One encoded document: ``(tokens int64 (n,), loss mask uint8 (n,) or None, images)``.
Doc = tuple  # (np.ndarray, np.ndarray | None, list[ImageRecord])
#: A record that failed in a worker: ``(reason, message)`` (exceptions with kwargs do not pickle).
Failure = tuple


@dataclass
class BuildResult:
    """What a build produced: the dataset path and its build report (also in the manifest)."""

    path: Path
    report: dict


# ----------------------------------------------------------------------------- worker pool
_WORKER: Any = None
#: Test-only (module docstring): the batch number whose worker kills itself; 0 = never.
KILL_AT_BATCH_ENV = "PACKFMT_TEST_KILL_WORKER_AT_BATCH"
_KILL_AT = 0


def _init_worker(factory: Callable[[], Any]) -> None:
    global _WORKER, _KILL_AT
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the parent stops us
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _KILL_AT = int(os.environ.get(KILL_AT_BATCH_ENV) or 0)
    _WORKER = factory()


def _encode_in_worker(seq: int, payloads: list) -> list:
    if seq == _KILL_AT:
        os.kill(os.getpid(), signal.SIGKILL)
    return _WORKER.encode(payloads)


def _pool_context():
    methods = mp.get_all_start_methods()
    return mp.get_context("fork" if "fork" in methods else "spawn")


class _RecordingContext:
    """A multiprocessing context that keeps the processes it starts: the executor does not say which
    of its workers died, nor how; these ``Process`` objects do (``exitcode``)."""

    def __init__(self, ctx) -> None:
        self._ctx = ctx
        self.processes: list = []

    def __getattr__(self, name: str):
        return getattr(self._ctx, name)

    def Process(self, *args, **kwargs):  # noqa: N802 (the multiprocessing name)
        proc = self._ctx.Process(*args, **kwargs)
        self.processes.append(proc)
        return proc


def _dead_worker_error(processes: list, batch: list, workers: int, batch_size: int) -> PackfmtError:
    """The one-line error of a broken pool: which worker died and how, and what to do."""
    dead = [(k, p) for k, p in enumerate(processes, 1) if p.exitcode is not None]
    # the executor SIGTERMs the survivors once one died: name a worker that died otherwise first
    dead.sort(key=lambda kp: kp[1].exitcode == -signal.SIGTERM)
    if dead:
        k, proc = dead[0]
        code = proc.exitcode
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        who = f"worker {k} of {workers} (pid {proc.pid}) {how}"
    else:
        who, code = f"a worker of {workers} died", None
    file, line = (batch[0][0], batch[0][1]) if batch else ("the input", 0)
    where = f"while tokenizing (batches from {file}:{line} on were in flight)"
    oom = "the out-of-memory killer sends SIGKILL: " if code == -signal.SIGKILL else ""
    todo = "lower {w} (now {n}) or {b} (now {s}), or free memory, then run the build again; nothing was written"
    return PackfmtError(f"{who} {where}; {oom}" + todo.format(w="workers=", n=workers, b="batch_size=", s=batch_size),
                        file=str(file), field="workers", expected="every worker alive until the end", found=who,
                        cli=f"{who} {where}; {oom}" + todo.format(w="--workers", n=workers, b="--batch-size",
                                                                     s=batch_size))


def _encoded_batches(batches: Iterator[list], converter, factory, workers: int,
                     batch_size: int = 0) -> Iterator[tuple[list, list]]:
    """Yield ``(batch, results)`` in submission order; ``results`` covers the batch's good payloads."""
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    def payloads(batch):
        return [item for _, _, item in batch if not isinstance(item, InputError)]

    if workers <= 1:
        for batch in batches:
            good = payloads(batch)
            yield batch, (converter.encode(good) if good else [])
        return
    ctx = _RecordingContext(_pool_context())
    pool = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker, initargs=(factory,))
    pending: deque = deque()
    finished = False
    try:
        try:
            for seq, batch in enumerate(batches, 1):
                pending.append((batch, pool.submit(_encode_in_worker, seq, payloads(batch))))
                if len(pending) >= 2 * workers:
                    done, result = pending[0]
                    yield done, result.result()
                    pending.popleft()
            while pending:
                done, result = pending[0]
                yield done, result.result()
                pending.popleft()
        except BrokenProcessPool:
            raise _dead_worker_error(ctx.processes, pending[0][0] if pending else [], workers, batch_size) from None
        finished = True
    finally:
        pool.shutdown(wait=finished, cancel_futures=True)
        if not finished:  # an error or an interrupt: stop the workers now, as Pool.terminate did
            for proc in ctx.processes:
                if proc.exitcode is None:
                    proc.terminate()
            for proc in ctx.processes:
                proc.join()


def _prepared_batches(records: Iterable[Raw], converter, batch_size: int, limit: int | None) -> Iterator[list]:
    """Group records into batches of ``(file, line, payload | InputError)``."""
    batch = []
    for n, (file, line, obj) in enumerate(records):
        if limit is not None and n >= limit:
            break
        if isinstance(obj, InputError):
            item = obj
        else:
            try:
                item = converter.prepare(obj)
            except InputError as exc:
                item = exc
        batch.append((file, line, item))
        if len(batch) >= batch_size:
            yield batch
            batch = []
    if batch:
        yield batch


# ----------------------------------------------------------------------------- writing + error policy
def _write_doc(writer: DatasetWriter, tally: Tally, file: str, line: int, doc: Doc) -> None:
    tokens, mask, images = doc
    if tokens.size == 0:
        tally.bad(file, line, "empty_tokens", "the tokenizer produced no tokens")
        return
    top = int(tokens.max())
    if top >= writer.vocab_size or int(tokens.min()) < 0:
        tally.bad(file, line, "token_out_of_range",
                  f"token id {top} is not below vocab_size {writer.vocab_size}")
        return
    writer.add_document(tokens, mask, images or None)
    tally.written += 1
    tally.tokens += int(tokens.size)
    tally.images += len(images)


def _consume(batch: list, results: list, writer: DatasetWriter, tally: Tally) -> None:
    res = iter(results)
    for file, line, item in batch:
        tally.read += 1
        if isinstance(item, InputError):
            tally.bad(file, line, item.reason, str(item), item.cli)
            continue
        out = next(res)
        if isinstance(out, InputError):
            tally.bad(file, line, out.reason, str(out), out.cli)
        elif len(out) == 2:  # Failure (reason, message) from a worker
            tally.bad(file, line, out[0], out[1])
        else:
            _write_doc(writer, tally, file, line, out)
    tally.end_batch()


def convert_records(records: Iterable[Raw], converter, batch_size: int) -> Iterator[tuple]:
    """Convert records in the calling process as a local build does (prepare, then encode per batch).

    Yields ``(file, line, doc, None)`` or ``(file, line, None, (reason, message, cli))`` for every
    record, in order; the Ray engine's tokenizer actors run this, then ``write_doc`` in its sink.
    """
    for batch in _prepared_batches(records, converter, batch_size, None):
        good = [item for _, _, item in batch if not isinstance(item, InputError)]
        res = iter(converter.encode(good) if good else [])
        for file, line, item in batch:
            out = item if isinstance(item, InputError) else next(res)
            if isinstance(out, InputError):
                yield file, line, None, (out.reason, str(out), out.cli)
            elif len(out) == 2:  # Failure (reason, message)
                yield file, line, None, (out[0], out[1], None)
            else:
                yield file, line, out, None


#: Public name of the per-document write rule (empty tokens and ids out of range are skips).
write_doc = _write_doc


def writer_args(converter, vocab_size: int | None) -> dict:
    """The ``DatasetWriter`` keywords a converter's documents are written with (every engine uses these)."""
    enc = converter.encoder
    vocab = int(vocab_size or enc.vocab_size)
    special = {k: (v if v is not None and v < vocab else None) for k, v in enc.special_tokens.items()}
    return {"vocab_size": vocab, "tokenizer": enc.identity, "special_tokens": special, "loss_mask": converter.loss_mask}


def _progress(total: int | None, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="doc", disable=not enabled, dynamic_ncols=True, smoothing=0.1)


def run_build(
    records: Iterable[Raw],
    converter,
    factory: Callable[[], Any],
    out: str | os.PathLike,
    *,
    report_base: dict,
    vocab_size: int | None = None,
    on_error: str = "fail",
    workers: int = 1,
    batch_size: int = 256,
    overwrite: bool = False,
    progress: bool = False,
    total: int | None = None,
    limit: int | None = None,
    skip_log: str | os.PathLike | None = None,
    storage_options: dict | None = None,
) -> BuildResult:
    """Run the pipeline for any converter (text, chat, multimodal) and publish the dataset.

    ``out`` may be a URL (``s3://...``): the dataset is written locally, then uploaded with its
    manifest last (``packfmt.storage``; ``storage_options`` go to fsspec).

    Args:
        records: the source records, in order.
        converter: the main process's converter (prepare, and encode when ``workers <= 1``).
        factory: picklable callable building an equivalent converter in each worker.
        out: target dataset directory.
        report_base: build-report keys known up front (``sources``, ``settings``, ``command``).
        vocab_size: overrides ``len(tokenizer)`` (ids at or above it are ``token_out_of_range``).
    """
    if on_error not in ON_ERROR_POLICIES:
        raise ValueError(f"on_error: expected one of {ON_ERROR_POLICIES}, found {on_error!r}")
    from .storage import is_remote, local_file

    if is_remote(out):
        from .storage import remote_output

        with remote_output(str(out), storage_options, overwrite=overwrite) as local:
            result = run_build(records, converter, factory, local, report_base=report_base, vocab_size=vocab_size,
                               on_error=on_error, workers=workers, batch_size=batch_size, progress=progress,
                               total=total, limit=limit, skip_log=skip_log)
        return BuildResult(str(out).rstrip("/"), result.report)
    out = local_file(out)
    enc = converter.encoder
    writer = DatasetWriter(out, **writer_args(converter, vocab_size), overwrite=overwrite)
    log_file = open(skip_log, "w", encoding="utf-8") if skip_log else None
    tally = Tally(on_error, log_file)
    start = time.perf_counter()
    bar = _progress(total if limit is None else min(total or limit, limit), progress)
    try:
        batches = _prepared_batches(records, converter, batch_size, limit)
        with closing(_encoded_batches(batches, converter, factory, workers, batch_size)) as encoded:  # closing stops the pool
            for batch, results in encoded:
                _consume(batch, results, writer, tally)
                bar.update(len(batch))
                secs = max(time.perf_counter() - start, 1e-9)
                bar.set_postfix_str(f"{tally.tokens / secs:,.0f} tok/s, skipped {sum(tally.skipped.values())}",
                                    refresh=False)
        seconds = time.perf_counter() - start
        writer.build_report = {
            **report_base,
            "records_read": tally.read,
            "documents_written": tally.written,
            "skipped": dict(sorted(tally.skipped.items())),
            "skipped_examples": tally.examples,
            "tokens": tally.tokens,
            "images": tally.images,
            "seconds": round(seconds, 3),
            "tokens_per_second": round(tally.tokens / max(seconds, 1e-9), 1),
            "tokenizer": enc.identity,
            "on_error": on_error,
            "workers": workers,
        }
        if tally.written == 0:
            raise tally.nothing_written(str(out), report_base.get("sources", []))
        path = writer.finalize()
    except BaseException:
        writer.abort()
        raise
    finally:
        bar.close()
        if log_file is not None:
            log_file.close()
    return BuildResult(path, writer.build_report)
