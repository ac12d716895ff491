"""``--csv`` beside ``--json`` (issue 43): the listing commands print the rows their ``--json`` prints, as
RFC 4180 CSV that :mod:`csv` reads back field for field (nested objects as dotted columns)."""

from __future__ import annotations

import argparse
import csv
import io
import json
from contextlib import redirect_stderr, redirect_stdout

import pytest

from service.cli.main import build_parser, main
from tests.service.factories import chain, make_result, migrated_store, run_with

A, B = ("conv_net", "fp16", "default", "cpu"), ("odd, \"quoted\"\nname", "bf16", "default", "cpu")
#: The query commands with --csv, and where their --json keeps its rows (None: the JSON is the list).
CSV_COMMANDS = {"runs": None, "results": None, "regressions": None, "compare": "cells", "history": "points"}


def _commands_with(option: str) -> set[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {name for name, p in sub.choices.items() if any(option in a.option_strings for a in p._actions)}


def test_every_listing_with_json_has_csv() -> None:
    assert _commands_with("--csv") == set(CSV_COMMANDS)
    assert set(CSV_COMMANDS) <= _commands_with("--json")


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def _flat(row: dict[str, object], prefix: str = "") -> dict[str, object]:
    flat: dict[str, object] = {}
    for k, v in row.items():
        if isinstance(v, dict):
            flat.update(_flat(v, f"{prefix}{k}."))
        else:
            flat[prefix + k] = v
    return flat


def _spelled(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return json.dumps(value, sort_keys=True)
    return str(value)


@pytest.fixture
def argvs(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    store = migrated_store(sqlite_url)
    shas = chain(store, 3)
    run_with(store, shas[0], [make_result(A), make_result(B)])
    bad = make_result(B, status="convert_error")
    bad.message = 'line one, with "quotes"\nline two'
    run_with(store, shas[1], [make_result(A, status="fail_accuracy", max_abs=0.4), bad])
    run_with(store, shas[2], [make_result(A, latency_ms=4.0), make_result(B)])
    store.dispose()
    monkeypatch.setenv("AMPCI_DATABASE_URL", sqlite_url)
    return {"runs": ["runs"], "results": ["results"], "regressions": ["regressions"],
            "compare": ["compare", shas[0][:8], shas[1][:8]], "history": ["history", "conv_net"]}


@pytest.mark.parametrize("command", sorted(CSV_COMMANDS))
def test_csv_holds_the_rows_of_json(argvs: dict[str, list[str]], command: str) -> None:
    assert set(argvs) == set(CSV_COMMANDS)
    code, out, _ = _run([*argvs[command], "--json"])
    assert code in (0, 1)
    data = json.loads(out)
    rows = [_flat(r) for r in (data if CSV_COMMANDS[command] is None else data[CSV_COMMANDS[command]])]
    assert rows, command
    code_csv, text, err = _run([*argvs[command], "--csv"])
    assert code_csv == code and "\r\n" in text
    got = list(csv.DictReader(io.StringIO(text, newline="")))
    assert len(got) == len(rows)
    for want, row in zip(rows, got, strict=True):
        assert {k: v for k, v in row.items() if k in want} == {k: _spelled(v) for k, v in want.items()}
        assert all(v == "" for k, v in row.items() if k not in want)  # a column other rows have: empty here


def test_json_and_csv_are_one_or_the_other(argvs: dict[str, list[str]]) -> None:
    err = io.StringIO()
    with redirect_stderr(err), pytest.raises(SystemExit) as exc:
        main(["runs", "--json", "--csv"])
    assert exc.value.code == 2 and "not allowed with" in err.getvalue()
