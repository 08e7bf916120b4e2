"""``packfmt build``: stream records from sources, tokenize in batches (optionally in N processes),
apply the error policy, and write a dataset with a build report.

The pipeline, per batch of ``batch_size`` records, in input order::

    source records ──prepare (main)──► payloads ──encode (worker pool)──► documents ──► DatasetWriter

``prepare`` is cheap and per record (pick a field, validate a conversation, resolve image paths);
``encode`` is the expensive, batched part (tokenization, image sniffing) and runs in worker
processes when ``workers > 1``. At most ``2 * workers`` batches are in flight, so memory stays
bounded whatever the input size, and results are consumed in submission order, so the output is
identical for any number of workers.

The workers (``packfmt.workers``) are watched: one that dies (the out-of-memory killer's SIGKILL, a
segfault) is replaced, and the batch it was tokenizing is tried once more in the fresh worker; a batch
whose worker dies twice stops the build with one line naming the records, the workers and their
signals. A worker that cannot load the tokenizer stops the build with one line naming it (no traceback).

Every record ends up either written or skipped with a reason; ``on_error="fail"`` (default)
stops at the first bad record (``file:line: reason``) and publishes nothing (see ``skips``).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from .errors import InputError, PackfmtError
from .report_paths import build_report_paths
from .record_errors import ENCODE_ERROR, encode_batch, encode_error_message
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
def _pool_context():
    methods = mp.get_all_start_methods()
    return mp.get_context("fork" if "fork" in methods else "spawn")


def _records_of(batch: list) -> str:
    """The input range of a batch: ``file:first-last`` (or ``file:first to other:last`` across files)."""
    (f0, l0, _), (f1, l1, _) = batch[0], batch[-1]
    return f"{f0}:{l0}-{l1}" if f0 == f1 else f"{f0}:{l0} to {f1}:{l1}"


def _dead_worker_error(lost, batches: dict[int, list], workers: int, batch_size: int) -> PackfmtError:
    """The one-line error of a batch whose worker died on it twice (it was retried once in a fresh worker): the
    records, how each worker died, what to do."""
    batch = next((batches[seq] for seq in lost.tasks if batches.get(seq)), None)
    who = f"worker {lost.index} of {workers} (pid {lost.pid}) {lost.how}"
    before = "; ".join(lost.deaths[:-1])
    if lost.unreplaced is not None:
        where = ((f"while tokenizing records {_records_of(batch)}, and " if batch else "and ")
                 + f"no process could be started in its place ({lost.unreplaced})")
    elif batch:
        where = (f"while tokenizing the batch that starts at {batch[0][0]}:{batch[0][1]} (records "
                 f"{_records_of(batch)}), its second try (the first: {before}; retried in a fresh worker)")
    else:
        where = "holding no batch, as the worker it replaced did"
    if batch is None or lost.how.endswith("SIGKILL") or lost.unreplaced is not None:  # memory: fewer, smaller batches
        oom = "the out-of-memory killer sends SIGKILL: " if lost.how.endswith("SIGKILL") else ""
        todo = "lower {w} (now {n}) or {b} (now {s}), or free memory, then run the build again; nothing was written"
    else:  # a crash (a signal, an exit) that repeats on the same records: one of them, not the number of workers
        oom = ("it ended the same way on the same records twice, so a record makes the encoding code crash (not a "
               "lack of memory): ")
        find = "run the build again with {one} (now {s}) to find the record, then " if len(batch) > 1 else ""
        todo = find + "remove it or fix the tokenizer; nothing was written"
    head = f"{who} {where}; {oom}"
    return PackfmtError(head + todo.format(w="workers=", n=workers, b="batch_size=", s=batch_size, one="batch_size=1"),
                        file=batch[0][0] if batch else None, field="workers",
                        expected="every batch tokenized by a worker that lives (one retry)", found=who,
                        cli=head + todo.format(w="--workers", n=workers, b="--batch-size", s=batch_size,
                                               one="--batch-size 1"))


def _worker_start_error(failed, converter, workers: int) -> PackfmtError:
    """A worker could not build its converter (``factory()`` raised there): one line naming the tokenizer."""
    spec = getattr(getattr(converter, "encoder", None), "spec", None)
    path = failed.file or getattr(spec, "path", None)
    what = f"could not load the tokenizer {path}" if path else "could not build its converter"
    head = (f"worker {failed.index} of {workers} {what} ({failed.kind}: {failed.message}); the build loaded it "
            "at its start: check that it was not moved, changed or made unreadable since (and that "
            "there is memory for {w} copies of it), then run the build again{alt}; nothing was written")
    return PackfmtError(head.format(w=workers, alt=" (workers=1 loads it once)"), file=path, field="tokenizer",
                        expected="a tokenizer every worker loads", found=f"{failed.kind}: {failed.message}",
                        cli=head.format(w=workers, alt=" (--workers 1 loads it once)"))


def _encoded_batches(batches: Iterator[list], converter, factory, workers: int,
                     batch_size: int = 0) -> Iterator[tuple[list, list]]:
    """Yield ``(batch, results)`` in submission order; ``results`` covers the batch's good payloads."""
    from .workers import EncodePool, WorkerLost, WorkerStartFailed

    def payloads(batch):
        return [item for _, _, item in batch if not isinstance(item, InputError)]

    if workers <= 1:
        for batch in batches:
            good = payloads(batch)
            yield batch, (encode_batch(converter, good) if good else [])
        return
    pending: dict[int, list] = {}  # seq -> batch, in submission order

    def replaced(index: int, pid: int | None, how: str, tasks: list[int]) -> None:  # a worker died: retried once
        batch = next((pending[seq] for seq in tasks if pending.get(seq)), None)
        what = (f"while tokenizing records {_records_of(batch)}; tokenizing them again in a fresh worker" if batch
                else "holding no batch; replaced by a fresh worker")
        logging.getLogger(__name__).warning("packfmt build: worker %d of %d (pid %s) %s %s", index, workers, pid,
                                            how, what)

    pool = EncodePool(factory, workers, _pool_context(), on_lost=replaced, encode=_encode_in_worker)
    finished = False
    try:
        try:
            for seq, batch in enumerate(batches, 1):
                pending[seq] = batch
                pool.submit(seq, payloads(batch))
                if len(pending) >= 2 * workers:
                    oldest = next(iter(pending))
                    yield pending[oldest], pool.result(oldest)
                    del pending[oldest]
            while pending:
                oldest = next(iter(pending))
                yield pending[oldest], pool.result(oldest)
                del pending[oldest]
        except WorkerLost as lost:
            raise _dead_worker_error(lost, pending, workers, batch_size) from None
        except WorkerStartFailed as failed:
            raise _worker_start_error(failed, converter, workers) from None
        finished = True
    finally:
        pool.close(finished)


def _encode_in_worker(converter, payloads: list) -> list:
    """What a worker runs on a batch (module level: a spawned worker unpickles it)."""
    return encode_batch(converter, payloads, in_worker=True)


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


def _failure(out: Failure, batch: list) -> tuple[str, str]:
    """``(reason, message)`` of a record's failure; an ``encode_error`` names its batch."""
    reason, message = out
    return reason, (encode_error_message(message, _records_of(batch)) if reason == ENCODE_ERROR else message)


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
        elif len(out) == 2:  # Failure (reason, message), from a converter or encode_batch
            tally.bad(file, line, *_failure(out, batch))
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
        res = iter(encode_batch(converter, good) if good else [])
        for file, line, item in batch:
            out = item if isinstance(item, InputError) else next(res)
            if isinstance(out, InputError):
                yield file, line, None, (out.reason, str(out), out.cli)
            elif len(out) == 2:  # Failure (reason, message)
                yield file, line, None, (*_failure(out, batch), None)
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
        writer.build_report = build_report_paths({  # no path of this host in the manifest (SECURITY A15)
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
        }, out)
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
