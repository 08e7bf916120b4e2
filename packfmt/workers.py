"""The build's encode workers: N processes, each with pipes of its own, so that one dying is noticed
at once and blocks no other.

``multiprocessing.Pool`` replaces a dead worker and waits forever for the batch it held. A
``concurrent.futures.ProcessPoolExecutor`` shares one result pipe and the locks of one task queue
between its workers: a worker SIGKILLed while writing a result (or holding a lock) leaves the
executor reading a message that never ends, and the build hangs as well. Here each worker reads
tasks from its own pipe and writes results to its own pipe, whose only writer it is; the parent
waits on every result pipe and every worker's sentinel together (``multiprocessing.connection.wait``),
so a death (the sentinel, or the end of a half-written result) raises ``WorkerLost`` on the next
wait. Each worker holds at most two tasks (the second queued in its pipe, sent by a thread so
that the parent never blocks on a busy worker), as ``Pool`` keeps workers busy.

A worker whose converter cannot be built (``factory()`` raises: the tokenizer cannot be loaded) sends
why and exits, printing nothing (multiprocessing would print its traceback); the parent raises
``WorkerStartFailed``.

Test-only hook: with ``PACKFMT_TEST_KILL_WORKER_AT_BATCH=N`` in the environment, the worker given
task N (1-based, in submission order) kills itself with SIGKILL, as the out-of-memory killer would.
"""

from __future__ import annotations

import os
import pickle
import queue
import signal
import threading
import traceback
from multiprocessing.connection import wait
from typing import Any, Callable

__all__ = ["EncodePool", "WorkerLost", "WorkerStartFailed", "KILL_AT_BATCH_ENV"]

KILL_AT_BATCH_ENV = "PACKFMT_TEST_KILL_WORKER_AT_BATCH"
#: Tasks a worker holds at once (one running, one queued in its pipe).
DEPTH = 2
#: The task number of a worker's start-up report (tasks count from 1).
START = 0


class WorkerLost(Exception):
    """Worker ``index`` (1-based) died: ``how`` says how; ``tasks``: the task numbers it held unfinished
    (the first is the one it was running)."""

    def __init__(self, index: int, pid: int | None, how: str, tasks: list[int]) -> None:
        super().__init__(f"worker {index} (pid {pid}) {how}")
        self.index, self.pid, self.how, self.tasks = index, pid, how, tasks


class WorkerStartFailed(Exception):
    """Worker ``index`` could not build its converter: ``kind`` (the exception's class name), ``message`` (its
    first line) and ``file`` (the file it names, or None), as the worker reported them (no traceback crosses the
    pipe)."""

    def __init__(self, index: int, pid: int | None, kind: str, message: str, file: str | None = None) -> None:
        super().__init__(f"worker {index} (pid {pid}) could not start: {kind}: {message}")
        self.index, self.pid, self.kind, self.message, self.file = index, pid, kind, message, file


def _worker(factory: Callable[[], Any], tasks, results, parent_ends: list) -> None:
    for conn in parent_ends:  # copies a fork made: the parent's ends of every worker's pipes, this one's too, so
        conn.close()          # that the parent's death ends our tasks (EOF) and our results (EPIPE): no orphan
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the parent stops us
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    kill_at = int(os.environ.get(KILL_AT_BATCH_ENV) or 0)
    try:
        converter = factory()
    except Exception as exc:  # the parent says it in one line (multiprocessing would print a traceback here)
        lines = str(exc).strip().splitlines()
        try:
            file = getattr(exc, "file", None)  # a PackfmtError names the file it could not read
            why = (type(exc).__name__, lines[0] if lines else "", file if isinstance(file, str) else None)
            results.send((START, False, why))
        except OSError:  # the parent is gone
            pass
        return
    while True:
        try:
            task = tasks.recv()
        except EOFError:  # the parent is gone
            return
        if task is None:
            return
        seq, payload = task
        if seq == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            reply = (seq, True, converter.encode(payload))
        except Exception as exc:  # a bug, raised again in the parent (as it is, when it pickles)
            try:
                pickle.dumps(exc)
            except Exception:
                exc = RuntimeError(f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
            reply = (seq, False, exc)
        try:
            results.send(reply)
        except OSError:  # the parent is gone
            return


def _describe(exitcode: int | None) -> str:
    if exitcode is None:
        return "closed its result pipe"
    if exitcode < 0:
        try:
            return f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


class EncodePool:
    """``submit(seq, payload)`` then ``result(seq)``: ``factory().encode(payload)`` run in ``workers`` processes."""

    def __init__(self, factory: Callable[[], Any], workers: int, ctx) -> None:
        self.procs, self._tasks, self._results = [], [], []
        self._held: list[set[int]] = []
        self._done: dict[int, tuple] = {}
        for k in range(workers):
            task_r, task_w = ctx.Pipe(duplex=False)
            res_r, res_w = ctx.Pipe(duplex=False)
            parent_ends = [*self._tasks, *self._results, task_w, res_r]
            proc = ctx.Process(target=_worker, args=(factory, task_r, res_w, parent_ends), daemon=True,
                               name=f"packfmt-encode-{k + 1}")
            proc.start()
            task_r.close()  # the worker is then the only reader of its tasks, and the only writer of its results
            res_w.close()
            self.procs.append(proc)
            self._tasks.append(task_w)
            self._results.append(res_r)
            self._held.append(set())
        self._outbox: queue.Queue = queue.Queue()
        self._sender = threading.Thread(target=self._send, name="packfmt-encode-sender", daemon=True)
        self._sender.start()  # after the forks: a forked child never copies a running thread

    def _send(self) -> None:
        while True:
            item = self._outbox.get()
            if item is None:
                return
            k, task = item
            try:
                self._tasks[k].send(task)
            except (OSError, ValueError):  # a dead worker (its death is seen by ``result``) or a closed pool
                pass

    def submit(self, seq: int, payload) -> None:
        """Queue task ``seq`` on the worker holding the fewest tasks (call only while one holds < DEPTH)."""
        k = min(range(len(self.procs)), key=lambda i: len(self._held[i]))
        self._held[k].add(seq)
        self._outbox.put((k, (seq, payload)))

    def result(self, seq: int):
        """The result of task ``seq``, reading every worker's results meanwhile; ``WorkerLost`` when one died,
        ``WorkerStartFailed`` when one could not build its converter."""
        while seq not in self._done:
            conns = {c: k for k, c in enumerate(self._results)}
            sentinels = {p.sentinel: k for k, p in enumerate(self.procs)}
            for ready in wait([*conns, *sentinels]):
                k = conns.get(ready)
                if k is None:
                    self._lost(sentinels[ready])
                try:
                    got, ok, value = ready.recv()
                except (EOFError, OSError):  # the worker died while writing (or before)
                    self._lost(k)
                self._record(k, got, ok, value)
        ok, value = self._done.pop(seq)
        if not ok:
            raise value
        return value

    def _record(self, k: int, got: int, ok: bool, value) -> None:
        if got == START:  # factory() raised in the worker: it exits
            self.procs[k].join(5)
            raise WorkerStartFailed(k + 1, self.procs[k].pid, *value)
        self._held[k].discard(got)
        self._done[got] = (ok, value)

    def _lost(self, k: int) -> None:
        proc, conn = self.procs[k], self._results[k]
        try:  # results it finished before dying are not what it held
            while conn.poll():
                self._record(k, *conn.recv())
        except (EOFError, OSError):
            pass
        proc.join(5)  # the sentinel fired, or the pipe ended: the process is gone or going
        raise WorkerLost(k + 1, proc.pid, _describe(proc.exitcode), sorted(self._held[k]))

    def close(self, finished: bool) -> None:
        """Stop the workers: let them exit (``finished``), else terminate them now (an error, an interrupt)."""
        if finished:
            for k in range(len(self.procs)):
                self._outbox.put((k, None))
        else:
            for proc in self.procs:
                if proc.exitcode is None:
                    proc.terminate()
        self._outbox.put(None)
        self._sender.join(5)
        for proc in self.procs:
            proc.join(5)
            if proc.exitcode is None:
                proc.kill()
                proc.join()
        for conn in self._tasks + self._results:
            conn.close()
