"""Command line: ``packfmt {build,merge,pack,cp,validate,inspect,export} ...``.

Wiring only: each subcommand lives in ``packfmt/cli/<name>.py`` with ``add_parser(subparsers)``
and ``run(args) -> int``, calling library functions the tests also call directly.

Exit codes: 0 success / valid, 1 invalid data or failed operation, 2 unusable arguments,
130 interrupted by SIGINT (Ctrl-C), 143 stopped by SIGTERM (e.g. a scheduler's preemption) -- in both
cases temp directories are removed and nothing is published -- and 141 when stdout is a pipe closed
early (``packfmt inspect DS | head``): the output was cut, so the command is not reported as a success,
as a tool killed by SIGPIPE would be, but quietly (no traceback).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Sequence

from ..errors import PackfmtError
from . import _signals
from ..version import __version__

#: Subcommand name -> module under packfmt.cli. A module that is missing is simply not offered.
COMMANDS = ("build", "merge", "pack", "cp", "validate", "inspect", "export")

EXIT_OK, EXIT_INVALID, EXIT_USAGE, EXIT_PIPE = 0, 1, 2, 141


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse exits 2 on usage errors already; keep the message short
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="packfmt", description="Tokenized, packed training data: build, pack, validate, inspect.")
    parser.add_argument("--version", action="version", version=f"packfmt {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"{__name__}.{name}":
                continue
            raise
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the exit code (tests call this directly)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help / --version / usage errors
        return int(exc.code or 0)
    _signals.command = args.command
    try:
        code = int(args.func(args))
        sys.stdout.flush()  # a closed pipe shows up here rather than at interpreter exit
        return code
    except PackfmtError as exc:
        print(f"packfmt {args.command}: error: {exc.cli_message()}", file=sys.stderr)
        return EXIT_INVALID
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM as _signals.Terminated
        print(_signals.message(_signals.signal_of(exc)), file=sys.stderr)
        return _signals.exit_code(exc)
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_PIPE


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that flushing it again at exit cannot raise (Python's documented recipe)."""
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError, AttributeError):  # stdout replaced by an object without a file descriptor
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def entry_point() -> None:
    _signals.install()  # first: a Ctrl-C during the imports that follow exits 130, not through a C++ abort
    exit_now(main())


def exit_now(code: int) -> None:
    """End the process with ``code``, the command done: every object left is frozen out of the garbage collector
    first. The interpreter's last collections walk every object still alive, and after a numba kernel has run
    (``pack``, ``validate --deep``, ``inspect``) that is numba's typing tables: 0.2-0.3 s of CPU for nothing, the
    process's memory going back whole. Exit handlers still run and objects outside reference cycles are still
    freed (a command closes what it wrote itself; stdout is flushed by ``main``)."""
    import gc

    gc.freeze()
    sys.exit(code)
