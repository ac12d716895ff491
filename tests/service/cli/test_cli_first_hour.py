"""What a newcomer reads first (issue 43): every command's help in plain words with help text on every
option, ``ampci history MODEL`` without ``--dtype`` and a chart that says what it shows, and an unknown
model name answered with the closest stored ones."""

from __future__ import annotations

import argparse
import io
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout

import pytest

from service.cli.main import build_parser, main
from tests.service.factories import chain, make_result, migrated_store, run_with

A = ("conv_net", "fp16", "default", "cpu")
B = ("conv_net", "bf16", "default", "cpu")


def _parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> \
        Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every parser of the command line, with its command words (the top level first)."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, (*path, name))


def test_every_help_is_plain_text_and_every_option_says_what_it_does() -> None:
    parsers = list(_parsers(build_parser()))
    assert len(parsers) > 25  # every command and sub-command, not the stubs only
    for path, parser in parsers:
        text = parser.format_help()
        assert "``" not in text and ":func:`" not in text and ":mod:`" not in text, path
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            if action.help == argparse.SUPPRESS:  # hidden on purpose (an internal option)
                continue
            assert action.help and action.help.strip(), (path, action.option_strings or action.dest)


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def store_env(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    store = migrated_store(sqlite_url)
    shas = chain(store, 12)
    for i, sha in enumerate(shas):  # fp16 latency steps up at the 8th run; bf16 stays flat
        run_with(store, sha, [make_result(A, latency_ms=2.0 if i < 7 else 3.0, seed=i, cosine=0.9999),
                              make_result(B, cosine=0.9995, seed=i,
                                          status="fail_accuracy" if i == 4 else "pass")], detect=False)
    store.dispose()
    monkeypatch.setenv("AMPCI_DATABASE_URL", sqlite_url)
    monkeypatch.setenv("COLUMNS", "100")
    return shas


def test_history_without_dtype_shows_every_cell_with_a_chart_that_says_something(store_env: list[str]) -> None:
    code, out, err = _run(["history", "conv_net", "--metric", "latency_p50"])
    assert (code, err) == (0, "")
    assert "conv_net fp16/default/cpu · latency_p50_ms · 12 runs" in out
    assert "conv_net bf16/default/cpu · latency_p50_ms · 12 runs" in out
    assert "moved most at run " in out and "(+" in out  # where it moved, and by how much
    assert store_env[0][:8] in out and store_env[-1][:8] in out  # the revisions under the x axis
    assert " |" in out and "+----" in out
    code, out, _ = _run(["history", "conv_net", "--dtype", "bf16"])
    assert code == 0 and "conv_net bf16/default/cpu · cosine · 12 runs" in out and "fp16/default" not in out
    assert "flat at 0.9995 over run " in out  # a flat series is one line, not a flat plot
    assert "status fail_accuracy at run 5" in out and "status pass at run 6" in out


@pytest.mark.parametrize("argv", [["history", "convnet"], ["results", "--model", "convnet"],
                                  ["history", "conv_nett", "--dtype", "fp16"]])
def test_an_unknown_model_names_the_closest(store_env: list[str], argv: list[str]) -> None:
    code, out, err = _run(argv)
    assert code == 2 and out == ""
    assert err.startswith(f"ampci: error: unknown model '{argv[1] if argv[0] == 'history' else argv[2]}'")
    assert "did you mean 'conv_net'?" in err and err.count("\n") == 1


def test_a_name_like_none_suggests_nothing(store_env: list[str]) -> None:
    code, _, err = _run(["history", "zzzzzz"])
    assert code == 2 and "unknown model 'zzzzzz'" in err and "did you mean" not in err


def test_results_show_a_failed_cells_stderr_tail(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``results --run N --model M --stderr`` prints the pass's stderr tail of each failed cell below the
    table; ``--json`` always carries it as ``stderr_tail``; a passing cell has none."""
    import json

    store = migrated_store(sqlite_url)
    (sha,) = chain(store, 1)
    bad = make_result(A, status="convert_error")
    bad.stderr_tail = "Traceback (most recent call last):\n  File \"walk.py\", line 3\nRuntimeError: walk: no producer"
    run_id = run_with(store, sha, [bad, make_result(B)], detect=False)
    store.dispose()
    monkeypatch.setenv("AMPCI_DATABASE_URL", sqlite_url)
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = _run(["results", "--run", str(run_id), "--model", "conv_net", "--stderr"])
    assert code == 0
    assert f"stderr of conv_net fp16/default/cpu convert_error (run {run_id}):" in out
    assert "  RuntimeError: walk: no producer" in out and '  File "walk.py", line 3' in out
    assert "Traceback" not in _run(["results", "--run", str(run_id)])[1]  # behind the flag
    rows = json.loads(_run(["results", "--run", str(run_id), "--json"])[1])
    assert {r["status"]: r.get("stderr_tail") for r in rows} == {"convert_error": bad.stderr_tail, "pass": None}

