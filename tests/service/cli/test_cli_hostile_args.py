"""Issue 24 item 6: every option of every ``ampci`` command, given hostile values, ends in one line
and a known exit status (2 for bad input), never a traceback.

The commands and their options are generated from the parser (:func:`service.cli.main.build_parser`),
not listed by hand: a new option is covered the day it is added.  Each hostile value goes to one
option while the command's required arguments get a valid sample (the type's ``sample``).  A value
the parser accepts runs the command for real against a migrated PostgreSQL database, without a
broker; commands that serve until stopped (``serves`` in their defaults: serve, worker, beat) are
only parsed.
"""

from __future__ import annotations

import argparse
import io
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from service.cli.main import build_parser, main

pytestmark = [pytest.mark.postgres]

HOSTILE = ["99999999999", "2147483648", "-1", "0", "inf", "nan", "-inf", "1e309", "\u0661\u0660", "+1_0", " 1",
           "9999999999d", "999999d", "99999999h", "\x00", "\x1b[31mred\x07", "\ud800", "x" * 5000, ""]
EXIT_CODES = {0, 1, 2, 3, 4}


def _leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...],
                                                                                          argparse.ArgumentParser]]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
        return
    for action in subs:
        seen: set[int] = set()
        for name, sub in action.choices.items():
            if id(sub) not in seen:  # aliases share a parser
                seen.add(id(sub))
                yield from _leaves(sub, (*path, name))


def _takes_value(action: argparse.Action) -> bool:
    return action.nargs != 0 and not isinstance(action, argparse._HelpAction | argparse._VersionAction)


def _sample(action: argparse.Action) -> str:
    if action.choices:
        return str(next(iter(action.choices)))
    return str(getattr(action.type, "sample", "x") or "x")


def _argv(path: tuple[str, ...], parser: argparse.ArgumentParser, target: argparse.Action, value: str) -> list[str]:
    """``path`` with ``value`` for ``target`` and valid samples for the other required arguments."""
    argv = list(path)
    for action in parser._actions:
        if not _takes_value(action):
            continue
        given = value if action is target else _sample(action)
        if action is not target and not (action.required or not action.option_strings and action.nargs not in ("*", "?")):
            continue
        if action.option_strings:
            argv += [action.option_strings[-1], given]
        else:
            argv.append(given)
    return argv


def _shown(argv: list[str]) -> str:
    return ascii([a if len(a) <= 40 else a[:40] + "..." for a in argv])


def _cases() -> list[tuple[tuple[str, ...], str]]:
    out = []
    for path, parser in _leaves(build_parser()):
        for action in parser._actions:
            if _takes_value(action):
                out.append((path, action.dest))
    return out


CASES = _cases()


def test_the_tree_is_walked():
    """The generated cases reach the commands the issue named (a walk that found nothing would pass)."""
    commands = {" ".join(p) for p, _ in CASES}
    for name in ("run", "results", "ack", "regressions", "bisect", "reconcile", "sweep", "serve", "db downgrade",
                 "zoo fetch", "deliveries", "worker"):
        assert name in commands, name
    assert len(CASES) > 50


@pytest.fixture
def env(pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    from service.db import migrate

    migrate.upgrade(pg_url)
    for var in ("AMPCI_BROKER_URL", "AMPCI_WEBHOOK_SECRET", "AMPCI_GITHUB_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AMPCI_DATABASE_URL", pg_url)
    monkeypatch.setenv("AMPCI_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("AMPCI_LOCAL_WORKERS", "1")
    monkeypatch.setenv("COLUMNS", "120")
    return pg_url


def _run(argv: list[str], parse_only: bool) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            if parse_only:
                build_parser().parse_args(argv)
                code = 0
            else:
                code = main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 2
    return code, out.getvalue(), err.getvalue()


def test_every_option_of_every_command_refuses_hostile_values_in_one_line(env: str) -> None:
    parser = build_parser()
    leaves = dict(_leaves(parser))
    failures: list[str] = []
    ran = 0
    for path, dest in CASES:
        sub = leaves[path]
        action = next(a for a in sub._actions if a.dest == dest and _takes_value(a))
        serves = bool(sub.get_default("serves"))
        for value in HOSTILE:
            argv = _argv(path, sub, action, value)
            try:
                parsed_ok = _run(argv, parse_only=True)[0] == 0
                code, _, err = _run(argv, parse_only=serves or not parsed_ok)
            except Exception as exc:  # noqa: BLE001 - the finding: a traceback
                failures.append(f"{_shown(argv)}: {type(exc).__name__}: {str(exc)[:200]!a}")
                continue
            ran += parsed_ok and not serves
            lines = [ln for ln in err.splitlines() if ln.strip()]
            if code not in EXIT_CODES or "Traceback" in err or len(lines) > 1:
                failures.append(f"{_shown(argv)}: exit {code}, stderr {err[-300:]!a}")
            elif code == 2 and not parsed_ok and not (lines[0].startswith("ampci") and ": error: " in lines[0]):
                failures.append(f"{_shown(argv)}: usage error not one line: {err[-300:]!a}")
            elif any(c in err for c in "\x00\x1b\x07"):
                failures.append(f"{_shown(argv)}: control characters echoed: {err[-300:]!a}")
    assert not failures, "\n".join(failures[:40]) + f"\n({len(failures)} failures)"
    assert ran > 10  # some accepted values really ran their command


@pytest.mark.parametrize("argv", [
    ["run", "99999999999"], ["results", "--run", "99999999999"], ["ack", "99999999999"],
    ["regressions", "--run", "99999999999"], ["bisect", "--run", "99999999999"],
    ["regressions", "--since", "999999d"], ["regressions", "--since", "99999999h"],
    ["regressions", "--since", "9999999999d"], ["reconcile", "--grace", "inf", "--dry-run"],
    ["runs", "--limit", "\u0661\u0660"]])
def test_the_values_the_probe_found(env: str, argv: list[str]) -> None:
    """The exact inputs of the issue: one line, exit 2."""
    code, out, err = _run(argv, parse_only=False)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "Traceback" not in err, (argv, err)
