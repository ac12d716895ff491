"""``ampci`` entry point.  ``main(argv)`` returns an exit code; ``entry()`` is the console script.

Each command module in COMMAND_MODULES exposes ``register(subparsers)`` which adds its
sub-commands and sets ``func(args) -> int`` on each parser.  Commands register lazily: :data:`COMMANDS`
names each command's module and its one-line help, so ``ampci --help`` imports no command module and
``ampci runs`` imports only ``query_cmd`` (tests/service/cli/test_cli_imports.py holds the import sets and
that this table matches what the modules register).  Expected errors from any layer
(``UserError``-like: they carry ``exit_code``) are printed as one line without a traceback, and so
are usage errors (:class:`OneLineParser`: exit 2).  A reader that goes away (``ampci zoo list --json |
head``) ends the command quietly with exit 141, as a unix tool killed by SIGPIPE, for every command.
Command modules import heavy layers (workers, onnxruntime) lazily inside ``func``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, NamedTuple, NoReturn, TypeAlias

from service.cli.startup import pause_gc, startup_complete

if TYPE_CHECKING:
    from service.json_types import JsonObject

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
    "service.cli.baseline_cmd",
    "service.cli.github_cmd",
    "service.cli.completion_cmd",
)


class Command(NamedTuple):
    """Where a command is registered and the help line ``ampci --help`` shows for it."""

    module: str
    help: str


_Q = "service.cli.query_cmd"
#: Every command, in ``ampci --help`` order, with its module and help line -- what the top-level parser
#: knows without importing the command modules (a test keeps it equal to what the modules register).
COMMANDS: dict[str, Command] = {
    "convert": Command("service.cli.convert_cmd", "convert an fp32 ONNX model to fp16/bf16 mixed precision"),
    "sweep": Command("service.cli.sweep_cmd", "run a sweep for one pass revision and report regressions"),
    "worker": Command("service.cli.worker_cmd", "run a Celery worker for one or more target queues"),
    "beat": Command("service.cli.worker_cmd", "run Celery beat: schedules the nightly sweep"),
    "serve": Command("service.cli.serve_cmd", "run the GitHub webhook and JSON API (uvicorn)"),
    "db": Command("service.cli.db_cmd", "database schema: upgrade, downgrade, current"),
    "runs": Command(_Q, "list runs, newest first"),
    "run": Command(_Q, "one run: summary and jobs"),
    "results": Command(_Q, "stored results, filtered"),
    "regressions": Command(_Q, "regressions, improvements and flaky cells"),
    "compare": Command(_Q, "cell-by-cell comparison of two revisions"),
    "history": Command(_Q, "a metric of a model over runs, with a plot"),
    "ack": Command(_Q, "acknowledge a regression (or mark it a false positive)"),
    "bisect": Command("service.cli.bisect_cmd", "bisect a run's regressions to their first bad commit"),
    "zoo": Command("service.cli.zoo_cmd", "the model zoo (list, fetch into the cache, add your own models)"),
    "check": Command("service.cli.check_cmd", "run one regression job (model x dtype x policy x target) locally"),
    "reconcile": Command("service.cli.reconcile_cmd", "re-send queued jobs whose broker message was lost"),
    "deliveries": Command("service.cli.deliveries_cmd", "recorded webhook deliveries (why one made no run)"),
    "baseline": Command("service.cli.baseline_cmd", "pin the older reference drift is judged against"),
    "github": Command("service.cli.github_cmd", "the GitHub App: create it from its manifest"),
    "completion": Command("service.cli.completion_cmd", "print shell code that completes commands, options and models"),
}


#: Exit status of a command whose output pipe was closed by the reader (128 + SIGPIPE, as ``yes | head``).
BROKEN_PIPE_EXIT = 141


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors (unknown choice, missing argument, bad value) are one line on
    stderr, naming the command and pointing at its ``--help``, with exit status 2.  Sub-command parsers
    inherit the class (``add_subparsers`` uses the parent's type).

    A command whose ``--json`` output has an error shape opts in by setting ``json_usage`` on its parser
    (message -> JSON object); when the command line asks for ``--json`` (:func:`main` sets
    ``json_requested``) a usage error also prints that object as one line on stdout."""

    json_usage: Callable[[str], JsonObject] | None = None
    json_requested: bool = False

    def format_help(self) -> str:
        """The help in plain words: descriptions written for the docs (a module docstring) keep their
        inline code as `code`, never reStructuredText's ````code```` or ``:func:`name```` roles."""
        return plain_help(super().format_help())

    def error(self, message: str) -> NoReturn:
        """Print ``PROG: error: MESSAGE (see `PROG --help`)`` and exit 2 (under ``--json``, for a command
        that opted in, first the JSON object of the error on one stdout line)."""
        message = f"{message} (see `{self.prog} --help`)"
        if self.json_usage is not None and self.json_requested:
            import json

            sys.stdout.write(json.dumps(self.json_usage(message), sort_keys=True) + "\n")
            sys.stdout.flush()
        self.exit(2, f"{self.prog}: error: {message}\n")


_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")


def plain_help(text: str) -> str:
    """``text`` with reStructuredText's inline literals (````x````) and roles (``:func:`x```) as `x`."""
    return _ROLE.sub(r"`\1`", text).replace("``", "`")


def fill_choice_help(parser: argparse.ArgumentParser) -> None:
    """Give every option of ``parser`` and its sub-commands that has choices but no help text the help
    ``one of A, B, C`` (an option a module registered without words still says what it takes)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                fill_choice_help(sub)
        elif action.help is None and action.choices is not None:
            action.help = f"one of {', '.join(str(c) for c in action.choices)}"


#: What each command module's ``register(subparsers)`` is given: the sub-command table of the top-level
#: :class:`OneLineParser`, whose ``add_parser`` makes OneLineParsers (``add_subparsers`` uses the parent's type).
Subcommands: TypeAlias = "argparse._SubParsersAction[OneLineParser]"


def _wants_json(argv: list[str]) -> bool:
    """True when ``argv`` (before a ``--``) holds ``--json`` or a prefix argparse would expand to it."""
    words = argv[:argv.index("--")] if "--" in argv else argv
    return any(len(w) > 3 and "--json".startswith(w) for w in words)


def _ask_json_usage(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """Mark the chosen command's parser when ``argv`` asks for ``--json`` (see :class:`OneLineParser`)."""
    if not _wants_json(argv):
        return
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                if isinstance(sub, OneLineParser) and sub.json_usage is not None:
                    sub.json_requested = True


def build_parser(modules: Iterable[str] | None = None) -> argparse.ArgumentParser:
    """The argument parser: every command module registered (``modules`` None), or only ``modules``
    with each other command a stub that carries its :data:`COMMANDS` help line (enough for ``ampci
    --help`` and for choosing a command; a stub is never run: :func:`main` loads the chosen command's
    module)."""
    parser = OneLineParser(prog="ampci", description="Mixed-precision regression CI for ONNX models.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES if modules is None else modules:
        importlib.import_module(name).register(sub)
    for command, spec in COMMANDS.items():
        if command not in sub.choices:
            sub.add_parser(command, help=spec.help)
    fill_choice_help(parser)
    return parser


def command_modules(argv: list[str]) -> list[str]:
    """The command module :func:`main` needs for ``argv``: the chosen command's (its first word not
    an option: the top-level parser has no option taking a value), none for ``--help`` or an unknown
    command (argparse answers those from the stubs)."""
    word = next((a for a in argv if not a.startswith("-")), None)
    return [COMMANDS[word].module] if word in COMMANDS else []


def _expected_exit_code(exc: BaseException) -> int | None:
    """The exit status of an error raised on purpose by our layers (they carry an int ``exit_code``; so do
    config errors); None for any other error."""
    code = getattr(exc, "exit_code", None)
    return int(code) if isinstance(code, int) else None


def main(argv: list[str] | None = None) -> int:
    """Run one ampci command; return its exit code (0 ok, 1 gate failed, 2 bad input, 3 unavailable)."""
    if argv is None and "_ARGCOMPLETE" in os.environ:  # a TAB in a shell that ran `ampci completion`
        from service.cli.completion import complete

        complete(lambda words: build_parser(command_modules(words)))  # prints the candidates and exits
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(command_modules(argv))
    _ask_json_usage(parser, argv)
    try:
        args = parser.parse_args(argv)
        if not getattr(args, "startup_in_command", False):
            startup_complete()  # the collector is on again for the command's own work (service/cli/startup.py)
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("ampci: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        _discard_stdout()
        return BROKEN_PIPE_EXIT
    except Exception as exc:  # translated at the boundary: one line, no traceback
        code = _expected_exit_code(exc)
        if code is not None:
            print(f"ampci: error: {exc}", file=sys.stderr)
            return code
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
    """Console-script wrapper around :func:`main`.  Start-up runs with the cyclic garbage collector paused
    (:mod:`service.cli.startup`: it resumes, start-up's heap frozen, before the command's own work).  Once
    the command returned, every object still alive is
    frozen out of the garbage collector (:func:`gc.freeze`): the interpreter's exit then skips a last full
    collection over the imported layers (0.3-0.6 s after importing SQLAlchemy, the better part of a short
    query command's exit); atexit handlers, stream flushes and the exit status are as before."""
    pause_gc()
    try:
        code = main()
    finally:
        startup_complete()  # a command that ended before its start-up did: the collector is on again
    import gc

    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    entry()
