"""Clean exits on SIGINT (Ctrl-C, 130) and SIGTERM (preemption, 143), from the first line of the CLI.

Until a command has a temp directory to clean up (nothing is written yet: argument parsing, imports of
torch / transformers / numba, read-only commands), a signal ends the process at once with
``os._exit``: an exception raised inside a half-finished C++ extension import can abort through
``terminate called ...`` instead. Once a temp directory exists (``_io.live_temps()``), the signal
raises ``KeyboardInterrupt`` (``Terminated`` for SIGTERM) so every ``except BaseException`` cleanup
runs: the writer removes its temp dir, the build stops its worker pool. A second signal during that
cleanup removes the temp dirs directly and exits.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys

EXIT_SIGINT, EXIT_SIGTERM = 130, 143
_EXIT = {signal.SIGINT: EXIT_SIGINT, signal.SIGTERM: EXIT_SIGTERM}

#: The subcommand running, for the "packfmt build: interrupted" line.
command: str | None = None
_unwinding = False
_installed = False


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that every cleanup that handles an interrupt handles it too."""


def signal_of(exc: KeyboardInterrupt) -> int:
    return signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT


def exit_code(exc: KeyboardInterrupt) -> int:
    return _EXIT[signal_of(exc)]


def message(signum: int = signal.SIGINT) -> str:
    who = f"packfmt {command}" if command else "packfmt"
    how = "interrupted" if signum == signal.SIGINT else f"interrupted by {signal.Signals(signum).name}"
    return f"{who}: {how}"


def _handler(signum, frame) -> None:
    global _unwinding
    io = sys.modules.get("packfmt._io")  # not imported yet: nothing can have been written (and numpy stays unloaded)
    temps = io.live_temps() if io is not None else []
    if _unwinding or not temps:
        for tmp in temps:
            shutil.rmtree(tmp, ignore_errors=True)
        os.write(2, (message(signum) + "\n").encode())
        os._exit(_EXIT[signum])
    _unwinding = True
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def _restore_defaults() -> None:
    """Forked children (tokenizer worker pools) get Python's usual behaviour back."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def install() -> None:
    """Route SIGINT and SIGTERM through ``_handler`` (main thread of the CLI process only)."""
    global _installed
    for signum in _EXIT:
        if signal.getsignal(signum) != signal.SIG_IGN:  # e.g. nohup: an ignored signal stays ignored
            signal.signal(signum, _handler)
    if not _installed and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_restore_defaults)
    _installed = True
