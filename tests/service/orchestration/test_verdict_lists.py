"""The verdict is visible in every list (issue 34): the runs page and ``ampci runs`` show each run's gate verdict
first -- as the finisher recorded it (``runs.verdict``), again after a triage -- never a green "complete" for a
run whose gate failed.  Real stores (SQLite and PostgreSQL), runs finished by the real finisher
(:func:`service.orchestration.jobs.finish_if_complete`)."""

from __future__ import annotations

import json
import re

import pytest

from service.cli.main import main
from service.dashboard.routes import CSS
from service.db import Store
from service.orchestration.jobs import finish_if_complete
from service.orchestration.judge import run_verdict
from tests.service.dashboard.conftest import BROWSER, make_app
from tests.service.factories import chain, make_result
from tests.service.orchestration.test_confirm import StandInWorker, make_run, slow_conversion

A, B = ("tiny_mlp", "fp16", "default", "cpu"), ("tiny_mlp", "bf16", "default", "cpu")


def finished(store: Store, revision: str, results: list) -> int:
    run_id = make_run(store, revision, results, confirm_pairs=0)
    assert finish_if_complete(store, run_id) is True
    return run_id


def runs_page(store: Store, url: str) -> dict[int, str]:
    """Each run's row of the runs page (its HTML), by run id."""
    from fastapi.testclient import TestClient

    with TestClient(make_app(store, url), raise_server_exceptions=True, headers=BROWSER) as c:
        html = c.get("/runs").text
    return {int(m.group(1)): m.group(2) for m in re.finditer(r'<tr data-run-id="(\d+)">(.*?)</tr>', html, re.S)}


def cli(url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    monkeypatch.setenv("AMPCI_DATABASE_URL", url)
    monkeypatch.setenv("COLUMNS", "200")
    code = main(list(argv))
    return code, capsys.readouterr().out


def verdict_cell(row: str) -> str:
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
    return re.sub(r"<[^>]+>", " ", cells[1])  # the column right after the run id


def test_a_failed_gate_shows_first_in_the_runs_page_and_ampci_runs(store: Store, db_url: str,
                                                                    monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    a, b, c = chain(store, 3)
    ok = finished(store, a, [make_result(A), make_result(B)])
    bad = finished(store, b, [make_result(A, status="convert_error", seed=1), make_result(B, seed=1)])
    pending = store.create_run(c, "push", cells=[A, B])
    verdict = run_verdict(store, bad)
    assert verdict.exit_code == 1 and store.get_run(bad).status == "complete"  # the jobs all ran: "complete"
    assert store.get_run(bad).verdict == verdict.brief()  # recorded by the finisher

    rows = runs_page(store, db_url)
    assert "fails" in verdict_cell(rows[bad]) and "1 could not measure" in verdict_cell(rows[bad])
    assert 'class="badge st-error"' in rows[bad] and verdict.headline() in rows[bad]  # the headline as tooltip
    assert ".rs-complete { background: #e3f2e6" not in CSS  # "complete" is no green badge: jobs ran, nothing more
    assert "passes" in verdict_cell(rows[ok]) and 'class="badge st-pass"' in rows[ok]
    assert "pending" in verdict_cell(rows[pending])
    assert verdict_cell(rows[bad]).index("fails") < rows[bad].index("complete")  # the verdict comes first

    store.dispose()
    code, out = cli(db_url, monkeypatch, capsys, "runs")
    assert code == 0
    lines = {int(m.group(1)): m.group(0) for m in re.finditer(r"│\s+(\d+) │.*", out)}
    assert "fails: 1 could not measure" in lines[bad] and "passes:" in lines[ok] and "pending" in lines[pending]
    assert lines[bad].index("fails") < lines[bad].index("complete")
    code, out = cli(db_url, monkeypatch, capsys, "runs", "--json")
    got = {r["id"]: r["verdict"] for r in json.loads(out)}
    assert got[bad]["state"] == "failure" and got[bad]["exit_code"] == 1 and got[bad]["unmeasured"] == 1
    assert got[ok]["state"] == "success" and got[pending] is None


def test_a_triage_that_turns_the_gate_updates_the_lists(store: Store, db_url: str, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    a, b = chain(store, 2)
    finished(store, a, [make_result(A)])
    bad = finished(store, b, [make_result(A, status="fail_accuracy", max_abs=0.4, seed=1)])
    (reg,) = [g for g in store.regressions(run_id=bad) if g.category == "regression"]
    assert store.get_run(bad).verdict["state"] == "failure"
    store.dispose()
    code, _ = cli(db_url, monkeypatch, capsys, "ack", str(reg.id), "--false-positive", "--by", "alice")
    assert code == 0
    code, out = cli(db_url, monkeypatch, capsys, "runs", "--json")
    (row,) = [r for r in json.loads(out) if r["id"] == bad]
    # the finding is gone, the cell still failed accuracy: what the verdict says now, recorded
    assert row["verdict"] == run_verdict(store, bad).brief() and row["verdict"]["regressions"] == 0


def test_the_runs_page_counts_only_findings_the_verdict_counts(store: Store, db_url: str) -> None:
    """A timing regression dismissed by confirmation is no regression in the list (nor an improvement that is
    only suspected a gain)."""
    a, b = chain(store, 2)
    make_run(store, a, [slow_conversion(1, 0.3)], confirm_pairs=8)
    run_id = make_run(store, b, [slow_conversion(2, 0.9)], confirm_pairs=8)
    base = [0.3 + 0.001 * i for i in range(8)]
    worker = StandInWorker(store, {"conversion_time": (base, base)})  # noise: dismissed
    assert finish_if_complete(store, run_id, dispatch=worker) is False
    worker.work()
    assert [g.state for g in store.regressions(run_id=run_id)] == ["dismissed"]
    row = runs_page(store, db_url)[run_id]
    counts = [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r'<td class="num[^"]*"[^>]*>(.*?)</td>', row, re.S)]
    assert counts[2] == "0"  # the regressions column (cells, pass, regr., ...)
    assert "passes" in verdict_cell(row)
