"""``ampci baseline pin|unpin|show`` over a real store: the pin is stored through :mod:`service.db.pins` and
is what drift detection reads; bad input is a one-line error, exit 2."""

from __future__ import annotations

import json

import pytest

from service.cli.main import main
from service.db import pins
from tests.service.factories import CELL, chain, make_result, migrated_store, run_with


def test_pin_show_unpin(db_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    store = migrated_store(db_url)
    shas = chain(store, 3)
    run_with(store, shas[1], [make_result(CELL)])
    monkeypatch.setenv("AMPCI_DATABASE_URL", db_url)

    assert main(["baseline", "pin", shas[1][:10], "--note", "release 1.0"]) == 0
    assert f"every branch pinned at {shas[1][:12]}" in capsys.readouterr().out
    assert main(["baseline", "pin", shas[1][:10], "--branch", "main", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["branch"] == "main"
    assert main(["baseline", "show", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [(p["branch"], p["sha"], p["note"]) for p in shown] == [("", shas[1], "release 1.0"), ("main", shas[1], None)]
    with store.transaction() as conn:
        assert pins.pin_for(conn, branch="main") == shas[1] and pins.pin_for(conn, branch="other") == shas[1]

    assert main(["baseline", "pin", shas[2][:10]]) == 2  # a revision without results pins nothing
    assert "no results" in capsys.readouterr().err
    assert main(["baseline", "unpin", "--branch", "main"]) == 0
    assert main(["baseline", "unpin", "--branch", "main"]) == 2
    assert "no baseline is pinned for branch main" in capsys.readouterr().err
    assert main(["baseline", "unpin"]) == 0
    capsys.readouterr()
    assert main(["baseline", "show"]) == 0 and "no baseline pinned" in capsys.readouterr().out
    store.dispose()
