"""Stored text is printed as text in every table, never read as rich markup: a model name a user gave
``ampci zoo add --name`` (any printable text) such as ``net[/x]`` made ``ampci results`` die with rich's
MarkupError ("closing tag '[/x]' ... doesn't match any open tag"), and ``[bold]`` vanished into a style;
the same for a webhook delivery's reason in ``ampci deliveries``."""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout

import pytest

from service.cli.main import main
from tests.service.factories import chain, make_result, migrated_store, run_with

MODEL = "net[/x][bold]b[/bold]"
CELL = (MODEL, "fp16", "default", "cpu")


def _run(argv: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue() + err.getvalue()


def test_tables_print_stored_brackets_as_text(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    store = migrated_store(sqlite_url)
    a, b = chain(store, 2)
    run_with(store, a, [make_result(CELL)])
    run_id = run_with(store, b, [make_result(CELL, status="fail_accuracy", max_abs=0.5)], baseline=a)
    store.record_delivery("d-brackets", "push", "rejected", reason=f"unknown model {MODEL}")
    store.dispose()
    monkeypatch.setenv("AMPCI_DATABASE_URL", sqlite_url)
    monkeypatch.delenv("AMPCI_BROKER_URL", raising=False)
    monkeypatch.setenv("COLUMNS", "250")
    for argv in (["results"], ["run", str(run_id)], ["compare", a[:10], b[:10]], ["regressions", "--wide"],
                 ["history", MODEL, "--dtype", "fp16", "--wide"], ["deliveries"]):
        code, text = _run(argv)
        assert code in (0, 1), (argv, text[-400:])
        assert MODEL in text, (argv, text[-400:])
