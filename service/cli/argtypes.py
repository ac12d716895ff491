"""Argument types shared by the ``ampci`` subcommands.

Every option that takes a value parses it with one of these (or ``choices``), so that any value a
user can type is either accepted as something the command can use or refused by argparse with one
line and exit 2 (:class:`service.cli.main.OneLineParser`): numbers are ASCII digits only (``int()``
would take ``١٠``, ``+1_0`` and 4,300-digit strings), bounded to what the database or the clock can
hold; ``inf``/``nan`` are never a number of seconds; text options refuse control characters and lone
surrogates (a NUL the database cannot store, an escape sequence a terminal would run) and are bounded
in length.  ``tests/service/cli/test_cli_hostile_args.py`` runs every option of every command with hostile
values, generated from the parser.  A type's ``sample`` attribute is a valid value of it (that test
fills required arguments with it).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import TypeVar

from service import since, vocabulary
from service.vocabulary import UnknownNameError

MAX_ID = 2**31 - 1               # the database's integer ids
MAX_DIGITS = 18                  # longer digit strings are refused unread
MAX_SECONDS = 30 * 86_400.0      # durations on the command line: at most 30 days
_INT = re.compile(rf"-?[0-9]{{1,{MAX_DIGITS}}}", re.ASCII)
_SECONDS = re.compile(r"[0-9]{1,9}(\.[0-9]{1,9})?", re.ASCII)
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
T = TypeVar("T")


def _typed(parse: Callable[[str], T], name: str, sample: str) -> Callable[[str], T]:
    parse.__name__ = name  # argparse names the type in some messages
    return _with_sample(parse, sample)


def _with_sample(parse: Callable[[str], T], sample: str) -> Callable[[str], T]:
    """``parse`` with its ``sample`` attribute set (a valid value of the type; see the module docstring)."""
    setattr(parse, "sample", sample)  # noqa: B010 - a function attribute, which no Callable type declares
    return parse


def _shown(raw: str) -> str:
    """``raw`` for an error message: control characters escaped, at most 40 characters."""
    return ascii(raw[:40]) + ("..." if len(raw) > 40 else "")


def strict_int(raw: str) -> int | None:
    """``int(raw)`` for an optional ``-`` and 1..MAX_DIGITS ASCII digits; None for anything else."""
    return int(raw) if isinstance(raw, str) and _INT.fullmatch(raw) else None


def bounded_int(low: int, high: int) -> Callable[[str], int]:
    """An argparse ``type`` accepting integers in ``[low, high]`` written in ASCII digits (otherwise
    argparse's one-line usage error)."""
    def parse(raw: str) -> int:
        value = strict_int(raw)
        if value is None:
            raise argparse.ArgumentTypeError(f"expected a whole number (ASCII digits), got {_shown(raw)}")
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be between {low} and {high}, got {value}")
        return value

    return _typed(parse, "integer", str(max(low, min(high, 1))))


def record_id(what: str) -> Callable[[str], int]:
    """An argparse ``type``: the id of a stored ``what`` (1 to 2**31-1, the database's integer range)."""
    inner = bounded_int(1, MAX_ID)

    def parse(raw: str) -> int:
        try:
            return inner(raw)
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(f"expected a {what} id from 1 to {MAX_ID}, got {_shown(raw)}") from None

    return _typed(parse, f"{what} id", "1")


def seconds(low: float = 0.0, high: float = MAX_SECONDS, *, allow_low: bool = True) -> Callable[[str], float]:
    """An argparse ``type``: a number of seconds (ASCII digits, an optional fraction) in ``[low, high]``
    (``(low, high]`` without ``allow_low``); ``inf``, ``nan``, exponents and signs are refused."""
    def parse(raw: str) -> float:
        if not isinstance(raw, str) or not _SECONDS.fullmatch(raw):
            raise argparse.ArgumentTypeError(f"expected a number of seconds like 30 or 2.5, got {_shown(raw)}")
        value = float(raw)
        if value > high or value < low or (value == low and not allow_low):
            bound = f">= {low:g}" if allow_low else f"> {low:g}"
            raise argparse.ArgumentTypeError(f"must be {bound} and at most {high:g} seconds, got {raw}")
        return value

    return _typed(parse, "seconds", f"{max(low, 1.0):g}")


_FLOAT = re.compile(r"-?[0-9]{1,15}(\.[0-9]{1,15})?", re.ASCII)


def bounded_float(low: float, high: float) -> Callable[[str], float]:
    """An argparse ``type``: a decimal number in ``[low, high]`` (ASCII digits, an optional sign and
    fraction; no exponent, ``inf`` or ``nan``)."""
    def parse(raw: str) -> float:
        if not isinstance(raw, str) or not _FLOAT.fullmatch(raw):
            raise argparse.ArgumentTypeError(f"expected a decimal number like 0.5, got {_shown(raw)}")
        value = float(raw)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be between {low:g} and {high:g}, got {raw}")
        return value

    return _typed(parse, "number", f"{max(low, min(high, 1.0)):g}")


def since_time(raw: str) -> datetime:
    """An argparse ``type``: ``Nd``/``Nh`` ago (at most 100 years) or an ISO date/datetime (UTC when no
    zone is given) from 1970 to 2100; the aware UTC datetime (:func:`service.since.since_time`, as the
    dashboard's ``?since=`` reads it)."""
    value = since.since_time(raw)
    if value is None:
        raise argparse.ArgumentTypeError(f"expected {since.SINCE_FORMS}, got {_shown(raw)}")
    return value


_with_sample(since_time, "7d")


def text_arg(what: str, limit: int = 200) -> Callable[[str], str]:
    """An argparse ``type``: a name or short text with no control character or lone surrogate, 1 to
    ``limit`` characters (an empty value is refused: leave the option out instead)."""
    def parse(raw: str) -> str:
        if not raw or _UNSAFE.search(raw) or len(raw) > limit:
            raise argparse.ArgumentTypeError(f"{what}: expected 1 to {limit} printable characters, got {_shown(raw)}")
        return raw

    return _typed(parse, what, "x")


def revision_arg(raw: str) -> str:
    """An argparse ``type``: a revision as git names one (branch, tag, sha, ``HEAD~2``, ``WORKTREE``):
    printable, no leading ``-``, at most 200 characters."""
    if not raw or _UNSAFE.search(raw) or len(raw) > 200 or raw.startswith("-") or " " in raw:
        raise argparse.ArgumentTypeError(f"expected a revision (branch, tag or sha), got {_shown(raw)}")
    return raw


_with_sample(revision_arg, "HEAD")


_MIGRATION = re.compile(r"head|heads|base|[0-9]{4}|[0-9a-f]{12}|[+-][1-9][0-9]?", re.ASCII)


def migration_arg(raw: str) -> str:
    """An argparse ``type``: an Alembic target (``head``, ``base``, a revision id like ``0004``, or a
    relative step ``-1``/``+2``)."""
    if not isinstance(raw, str) or not _MIGRATION.fullmatch(raw):
        raise argparse.ArgumentTypeError(f"expected head, base, a schema revision like 0004 or a step like -1, "
                                         f"got {_shown(raw)}")
    return raw


_with_sample(migration_arg, "head")

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def log_level(raw: str) -> str:
    """An argparse ``type``: a log level name, any case (``info``), returned upper-case."""
    if isinstance(raw, str) and raw.upper() in LOG_LEVELS:
        return raw.upper()
    raise argparse.ArgumentTypeError(f"unknown log level {_shown(raw)}; expected one of {', '.join(LOG_LEVELS)}")


_with_sample(log_level, "INFO")


def path_arg(raw: str) -> Path:
    """An argparse ``type``: a file system path (no NUL or other control character, at most 4096
    characters): a path the OS would refuse with a ValueError or ENAMETOOLONG is a usage error."""
    if not raw or _UNSAFE.search(raw) or len(raw) > 4096 or any(len(part) > 255 for part in raw.split("/")):
        raise argparse.ArgumentTypeError(f"expected a file path, got {_shown(raw)}")
    return Path(raw).expanduser()


_with_sample(path_arg, "missing-file.onnx")


def _argparse_type(check: Callable[[str], str], name: str, sample: str) -> Callable[[str], str]:
    """``check`` (a :mod:`service.vocabulary` validator) as an argparse ``type``: its UnknownNameError
    becomes argparse's one-line usage error with the same message."""
    def parse(raw: str) -> str:
        try:
            return check(raw)
        except UnknownNameError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return _typed(parse, name, sample)


def one_of(what: str, choices: Sequence[str] | Callable[[], Sequence[str]]) -> Callable[[str], str]:
    """An argparse ``type`` accepting exactly one of ``choices`` (:func:`service.vocabulary.one_of`);
    anything else is argparse's one-line usage error (exit 2) naming ``what`` and listing every
    choice, so a query filter with an unknown value is refused instead of printing an empty table.
    ``choices`` may be a function returning them, called only when a value is parsed."""
    return _argparse_type(vocabulary.one_of(what, choices), what,
                          "" if callable(choices) else (list(choices) or [""])[0])


#: A low-precision dtype the service sweeps (``fp16``, ``bf16``).
dtype_name = _argparse_type(vocabulary.dtype_name, "dtype_name", "fp16")
#: A pass target (``cpu``, ``cuda``) or the queue of one (``cuda-a100``), as results store them.
target_name = _argparse_type(vocabulary.target_name, "target_name", "cpu")
#: A named policy, ``auto``, or a policy file path (results store a file policy by its path).
policy_name = _argparse_type(vocabulary.policy_name, "policy_name", "default")
