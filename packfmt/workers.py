"""The build's encode workers: N processes, each with pipes of its own, so that one dying is noticed
at once and blocks no other.

``multiprocessing.Pool`` replaces a dead worker and waits forever for the batch it held. A
``concurrent.futures.ProcessPoolExecutor`` shares one result pipe and the locks of one task queue
between its workers: a worker SIGKILLed while writing a result (or holding a lock) leaves the
executor reading a message that never ends, and the build hangs as well. Here each worker reads
tasks from its own pipe and writes results to its own pipe, whose only writer it is; the parent
waits on every result pipe and every worker's sentinel together (``multiprocessing.connection.wait``),
so a death (the sentinel, or the end of a half-written result) is seen on the next wait. Each worker
holds at most two tasks (the second queued in its pipe, sent by a thread so that the parent never
blocks on a busy worker), as ``Pool`` keeps workers busy.

A worker that dies (the out-of-memory killer's SIGKILL, a segfault) is replaced by a fresh one, which
is given the tasks it held again, in order: the one it was running gets one more try. A task whose
worker dies on it twice raises ``WorkerLost`` naming both deaths. A worker whose converter cannot be
built (``factory()`` raises: the tokenizer cannot be loaded) sends why and exits, printing nothing;
the parent raises ``WorkerStartFailed`` (not retried: a fresh worker would load the same files).

Test-only hook: with ``PACKFMT_TEST_KILL_WORKER_AT_BATCH=N`` in the environment, the worker given
task N (1-based, in submission order) kills itself with SIGKILL, as the out-of-memory killer would, on
every try; with ``N:once``, only a worker of the first generation does (its replacement runs task N).
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
#: Tries of one task: a task whose worker dies on it is run once more, in a fresh worker.
TRIES = 2
#: The task number of a worker's start-up report (tasks count from 1).
START = 0


class WorkerLost(Exception):
    """Worker ``index`` (1-based) died ``TRIES`` times on task ``tasks[0]`` (or once, when no process could be started
    in its place: ``unreplaced`` says why): ``how`` says how it died the last time, ``deaths`` every time
    (``"worker K (pid P) was killed by SIGKILL"``, oldest first)."""

    def __init__(self, index: int, pid: int | None, how: str, tasks: list[int],
                 deaths: list[str] | None = None, unreplaced: str | None = None) -> None:
        super().__init__(f"worker {index} (pid {pid}) {how}")
        self.index, self.pid, self.how, self.tasks = index, pid, how, tasks
        self.deaths = deaths or [str(self)]
        #: Why no fresh worker could be started in its place (its first death, then), else None.
        self.unreplaced = unreplaced


class WorkerStartFailed(Exception):
    """Worker ``index`` could not build its converter: ``kind`` (the exception's class name), ``message`` (its
    first line) and ``file`` (the file it names, or None), as the worker reported them (no traceback crosses the
    pipe)."""

    def __init__(self, index: int, pid: int | None, kind: str, message: str, file: str | None = None) -> None:
        super().__init__(f"worker {index} (pid {pid}) could not start: {kind}: {message}")
        self.index, self.pid, self.kind, self.message, self.file = index, pid, kind, message, file


def _kill_at(first_generation: bool) -> int:
    """The task the test hook (``KILL_AT_BATCH_ENV``) kills this worker at; 0: none."""
    value = os.environ.get(KILL_AT_BATCH_ENV) or ""
    seq, _, once = value.partition(":")
    if once and (once != "once" or not first_generation):
        return 0
    return int(seq or 0)


def _encode(converter, payload):
    """The default task: ``converter.encode(payload)``."""
    return converter.encode(payload)


def _worker(factory: Callable[[], Any], tasks, results, parent_ends: list, first_generation: bool = True,
            encode: Callable[[Any, Any], Any] = _encode) -> None:
    for conn in parent_ends:  # copies a fork made: the parent's ends of every worker's pipes, this one's too, so
        conn.close()          # that the parent's death ends our tasks (EOF) and our results (EPIPE): no orphan
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the parent stops us
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    kill_at = _kill_at(first_generation)
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
            reply = (seq, True, encode(converter, payload))
        except (Exception, SystemExit, KeyboardInterrupt) as exc:  # raised again in the parent (as it is, when it
            reply = (seq, False, _portable(exc))                   # pickles): the worker lives on
        try:
            results.send(reply)
        except OSError:  # the parent is gone
            return


def _portable(exc: BaseException) -> Exception:
    """``exc`` as the parent can raise it: itself when it pickles, else a RuntimeError with its traceback; a
    ``SystemExit`` or ``KeyboardInterrupt`` (which the parent would take for its own exit or Ctrl-C; a worker ignores
    SIGINT) as a RuntimeError saying what the encoding code raised."""
    if isinstance(exc, (SystemExit, KeyboardInterrupt)):
        what = f"SystemExit({exc.code!r})" if isinstance(exc, SystemExit) else "KeyboardInterrupt"
        return RuntimeError(f"the encoding code raised {what} in a worker\n{traceback.format_exc()}")
    try:
        pickle.dumps(exc)
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
    return exc


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
    """``submit(seq, payload)`` then ``result(seq)``: ``encode(factory(), payload)`` (default
    ``factory().encode(payload)``) run in ``workers`` processes.

    ``on_lost(index, pid, how, tasks)``: called when a worker died and is replaced, ``tasks`` (the ones it held,
    the first the one it was running) given to its replacement."""

    def __init__(self, factory: Callable[[], Any], workers: int, ctx,
                 on_lost: Callable[[int, int | None, str, list[int]], None] | None = None,
                 encode: Callable[[Any, Any], Any] = _encode) -> None:
        self._factory, self._ctx, self._on_lost, self._encode = factory, ctx, on_lost, encode
        self.procs, self._tasks, self._results = [], [], []
        self._held: list[dict[int, Any]] = []  # per worker: the tasks it holds unfinished, seq -> payload, in order
        self._done: dict[int, tuple] = {}
        self._deaths: dict[int, list[str]] = {}  # seq -> how the workers that ran it died
        self._retired: list = []  # task pipes of dead workers: closed at ``close`` (the sender may hold one)
        self._dead: list = []  # dead workers, kept so that no new sentinel reuses the number of theirs
        self._idle_deaths = [0] * workers  # per worker: deaths holding no task since its last result
        for k in range(workers):
            self.procs.append(None)
            self._tasks.append(None)
            self._results.append(None)
            self._held.append({})
            self._start(k, first_generation=True)
        self._outbox: queue.Queue = queue.Queue()
        self._sender = threading.Thread(target=self._send, name="packfmt-encode-sender", daemon=True)
        self._sender.start()  # after the forks: a forked child never copies a running thread

    def _start(self, k: int, *, first_generation: bool) -> None:
        """Start worker ``k`` with pipes of its own (a replacement is forked while the sender thread runs: the child
        touches nothing that thread may hold, neither the outbox nor any pipe but its own)."""
        ctx = self._ctx
        task_r, task_w = ctx.Pipe(duplex=False)
        res_r, res_w = ctx.Pipe(duplex=False)
        parent_ends = [c for c in (*self._tasks, *self._results, *self._retired) if c is not None] + [task_w, res_r]
        proc = ctx.Process(target=_worker, args=(self._factory, task_r, res_w, parent_ends, first_generation,
                                                 self._encode),
                           daemon=True, name=f"packfmt-encode-{k + 1}")
        try:
            proc.start()
        except OSError:
            for conn in (task_r, task_w, res_r, res_w):
                conn.close()
            raise
        task_r.close()  # the worker is then the only reader of its tasks, and the only writer of its results
        res_w.close()
        self.procs[k], self._tasks[k], self._results[k] = proc, task_w, res_r

    def _send(self) -> None:
        while True:
            item = self._outbox.get()
            if item is None:
                return
            conn, task = item
            try:
                conn.send(task)
            except (OSError, ValueError):  # a dead worker (its tasks go to its replacement) or a closed pool
                pass

    def submit(self, seq: int, payload) -> None:
        """Queue task ``seq`` on the worker holding the fewest tasks (call only while one holds < DEPTH)."""
        k = min(range(len(self.procs)), key=lambda i: len(self._held[i]))
        self._held[k][seq] = payload
        self._outbox.put((self._tasks[k], (seq, payload)))

    def result(self, seq: int):
        """The result of task ``seq``, reading every worker's results meanwhile. A worker that died is replaced
        (``_lost``); ``WorkerLost`` when a task's worker died on it twice, ``WorkerStartFailed`` when a worker could
        not build its converter."""
        while seq not in self._done:
            conns = {c: k for k, c in enumerate(self._results)}
            sentinels = {p.sentinel: k for k, p in enumerate(self.procs)}
            for ready in wait([*conns, *sentinels]):
                k = conns.get(ready)
                if k is None:
                    k = sentinels[ready]
                    if ready == self.procs[k].sentinel:  # (not a worker replaced earlier in this round)
                        self._lost(k)
                    continue
                if self._results[k] is not ready:  # its worker was replaced earlier in this round
                    continue
                try:
                    got, ok, value = ready.recv()
                except (EOFError, OSError):  # the worker died while writing (or before)
                    self._lost(k)
                    continue
                self._record(k, got, ok, value)
        ok, value = self._done.pop(seq)
        if not ok:
            raise value
        return value

    def _record(self, k: int, got: int, ok: bool, value) -> None:
        if got == START:  # factory() raised in the worker: it exits
            self.procs[k].join(5)
            raise WorkerStartFailed(k + 1, self.procs[k].pid, *value)
        self._held[k].pop(got, None)
        self._done[got] = (ok, value)
        self._idle_deaths[k] = 0

    def _lost(self, k: int) -> None:
        """Worker ``k`` died: keep the results it finished, start a fresh worker ``k`` and give it the tasks the dead
        one held, in order; the one it was running (its first) counts a try."""
        proc, conn = self.procs[k], self._results[k]
        try:  # results it finished before dying are not what it held
            while conn.poll():
                self._record(k, *conn.recv())
        except (EOFError, OSError):
            pass
        proc.join(5)  # the sentinel fired, or the pipe ended: the process is gone or going
        how = _describe(proc.exitcode)
        held, self._held[k] = self._held[k], {}
        if held:
            running = next(iter(held))
            deaths = self._deaths.setdefault(running, [])
            deaths.append(f"worker {k + 1} (pid {proc.pid}) {how}")
            if len(deaths) >= TRIES:
                raise WorkerLost(k + 1, proc.pid, how, [running], deaths)
        else:  # a worker that dies at every start (holding no task yet) is not started for ever
            self._idle_deaths[k] += 1
            if self._idle_deaths[k] >= TRIES:
                raise WorkerLost(k + 1, proc.pid, how, [], [f"worker {k + 1} {how}, holding no batch"] * TRIES)
        conn.close()
        self._retired.append(self._tasks[k])
        self._dead.append(proc)
        try:
            self._start(k, first_generation=False)
        except OSError as exc:  # no process to replace it (fork refused: out of memory or processes)
            deaths = self._deaths.get(next(iter(held)), []) if held else [f"worker {k + 1} (pid {proc.pid}) {how}"]
            raise WorkerLost(k + 1, proc.pid, how, list(held), deaths,
                             unreplaced=exc.strerror or type(exc).__name__) from None
        if self._on_lost is not None:
            self._on_lost(k + 1, proc.pid, how, list(held))
        for seq, payload in held.items():
            self._held[k][seq] = payload
            self._outbox.put((self._tasks[k], (seq, payload)))

    def close(self, finished: bool) -> None:
        """Stop the workers: let them exit (``finished``), else terminate them now (an error, an interrupt)."""
        if finished:
            for conn in self._tasks:
                self._outbox.put((conn, None))
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
        for conn in self._tasks + self._results + self._retired:
            conn.close()
