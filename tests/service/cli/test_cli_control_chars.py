"""Issue 24 item 12: terminal control characters stored in commit messages, author names, branch names,
finding details and delivery reasons never reach the terminal raw, whichever command prints them
(``ampci bisect`` printed the first bad commit's message as stored, escape and bell included)."""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout

import pytest

from service.cli.main import main
from tests.service.factories import CELL, make_result, migrated_store, run_with, sha

EVIL = "\x1b[2J\x1b]0;owned\x07\x9b31m\x08\rfix"
CONTROL = [chr(c) for c in (*range(0, 9), *range(11, 32), 127, *range(128, 160))]


@pytest.fixture
def seeded(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    from datetime import UTC, datetime

    store = migrated_store(sqlite_url)
    t = datetime(2026, 10, 1, tzinfo=UTC)
    store.upsert_revision(sha(0), [], f"main{EVIL}", f"dev{EVIL} <d@example.com>", f"good {EVIL}", t)
    store.upsert_revision(sha(1), [sha(0)], f"main{EVIL}", f"dev{EVIL} <d@example.com>", f"bad {EVIL}\nbody", t)
    good = run_with(store, sha(0), [make_result(CELL)])
    bad = run_with(store, sha(1), [make_result(CELL, status="fail_accuracy", max_abs=0.4)], baseline=sha(0))
    store.record_delivery(f"d-evil{len(EVIL)}", "push", "rejected", reason=f"bad {EVIL}")
    store.dispose()
    monkeypatch.setenv("AMPCI_DATABASE_URL", sqlite_url)
    monkeypatch.delenv("AMPCI_BROKER_URL", raising=False)
    monkeypatch.setenv("COLUMNS", "200")
    return {"good": good, "bad": bad}


def _run(argv: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = int(exc.code or 0)
    return code, out.getvalue() + err.getvalue()


def test_no_command_prints_a_stored_control_character(seeded: dict[str, int]) -> None:
    runs = [str(seeded["good"]), str(seeded["bad"])]
    commands = [["runs"], ["run", runs[1]], ["results"], ["results", "--run", runs[1]], ["regressions"],
                ["compare", sha(0)[:8], sha(1)[:8]], ["history", CELL[0], "--dtype", CELL[1], "--metric", "max_abs"],
                ["deliveries"], ["bisect", "--run", runs[1]], ["bisect", "--run", runs[1], "--step"]]
    printed = {}
    for argv in commands + [[*argv, "--json"] for argv in commands if argv[0] != "history"]:
        code, text = _run(argv)
        printed[" ".join(argv)] = text
        raw = sorted({repr(c) for c in text if c in CONTROL})
        assert not raw, (argv, code, raw, text[-500:])
    bisected = printed[f"bisect --run {runs[1]}"]
    assert "first bad commit " + sha(1) in bisected and "bad " in bisected, bisected  # the message, made safe
