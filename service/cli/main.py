"""``ampci`` entry point.  ``main(argv)`` returns an exit code; ``entry()`` is the console script.

Each command module in COMMAND_MODULES exposes ``register(subparsers)`` which adds its
sub-commands and sets ``func(args) -> int`` on each parser.  Expected errors from any layer
(``UserError``-like: they carry ``exit_code``) are printed as one line without a traceback, and so
are usage errors (:class:`OneLineParser`: exit 2).  A reader that goes away (``ampci zoo list --json |
head``) ends the command quietly with exit 141, as a unix tool killed by SIGPIPE, for every command.
Command modules import heavy layers (workers, onnxruntime) lazily inside ``func``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import NoReturn

COMMAND_MODULES: tuple[str, ...] = (
    "service.cli.convert_cmd",
    "service.cli.sweep_cmd",
    "service.cli.worker_cmd",
    "service.cli.serve_cmd",
    "service.cli.db_cmd",
    "service.cli.query_cmd",
    "service.cli.bisect_cmd",
    "service.cli.zoo_cmd",
    "service.cli.check_cmd",
    "service.cli.reconcile_cmd",
    "service.cli.deliveries_cmd",
)


#: Exit status of a command whose output pipe was closed by the reader (128 + SIGPIPE, as ``yes | head``).
BROKEN_PIPE_EXIT = 141


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors (unknown choice, missing argument, bad value) are one line on
    stderr, naming the command and pointing at its ``--help``, with exit status 2.  Sub-command parsers
    inherit the class (``add_subparsers`` uses the parent's type)."""

    def error(self, message: str) -> NoReturn:
        """Print ``PROG: error: MESSAGE (see `PROG --help`)`` and exit 2."""
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser with every registered command."""
    parser = OneLineParser(prog="ampci", description="Mixed-precision regression CI for ONNX models.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def _is_expected_error(exc: BaseException) -> bool:
    """Errors raised on purpose by our layers carry an ``exit_code``; so do config errors."""
    return hasattr(exc, "exit_code") and isinstance(exc.exit_code, int)


def main(argv: list[str] | None = None) -> int:
    """Run one ampci command; return its exit code (0 ok, 1 gate failed, 2 bad input, 3 unavailable)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("ampci: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        _discard_stdout()
        return BROKEN_PIPE_EXIT
    except Exception as exc:  # translated at the boundary: one line, no traceback
        if _is_expected_error(exc):
            print(f"ampci: error: {exc}", file=sys.stderr)
            return int(exc.exit_code)  # type: ignore[attr-defined]
        raise


def _discard_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush of what is still buffered cannot raise
    a second BrokenPipeError ("Exception ignored ...") on the way out."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # replaced by a test harness: nothing to redirect
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def entry() -> None:
    """Console-script wrapper around :func:`main`."""
    sys.exit(main())


if __name__ == "__main__":
    entry()
