"""Command line: ``packfmt {build,pack,validate,inspect} ...``.

Wiring only: each subcommand lives in ``packfmt/cli/<name>.py`` with ``add_parser(subparsers)``
and ``run(args) -> int``, calling library functions the tests also call directly.

Exit codes: 0 success / valid, 1 invalid data or failed operation, 2 unusable arguments.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

from ..errors import PackfmtError
from ..version import __version__

#: Subcommand name -> module under packfmt.cli. A module that is missing is simply not offered.
COMMANDS = ("build", "pack", "validate", "inspect", "export")

EXIT_OK, EXIT_INVALID, EXIT_USAGE = 0, 1, 2


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
    try:
        return int(args.func(args))
    except PackfmtError as exc:
        print(f"packfmt {args.command}: error: {exc.cli_message()}", file=sys.stderr)
        return EXIT_INVALID
    except KeyboardInterrupt:
        print(f"packfmt {args.command}: interrupted", file=sys.stderr)
        return 130


def entry_point() -> None:
    sys.exit(main())
