"""Conversion time and the pass's fixpoint iterations are stored metrics (migration 0004): results carry
them, and ``compare``, ``history`` and the CLI show them like every other metric."""

from __future__ import annotations

import json

import pytest

from service.cli.main import main
from service.db import Store
from service.db.extract import convert_seconds
from tests.service.factories import chain, make_result, migrated_store, run_with


@pytest.fixture
def store(db_url: str) -> Store:
    s = migrated_store(db_url)
    yield s
    s.dispose()


def _timed(seconds: list[float], iterations: int, seed: int = 0):  # type: ignore[no-untyped-def]
    r = make_result(seed=seed)
    assert r.graph is not None
    r.graph.convert_samples_s = list(seconds)
    r.graph.convert_seconds = seconds[0] if seconds else 0.0
    r.graph.pass_iterations = iterations
    return r


def test_convert_seconds_is_the_median_of_the_worker_samples() -> None:
    assert convert_seconds(_timed([0.4, 0.1, 0.3], 2)) == pytest.approx(0.3)
    assert convert_seconds(_timed([0.4, 0.1, 0.3, 0.2], 2)) == pytest.approx(0.25)
    assert convert_seconds(_timed([], 2)) is None
    assert convert_seconds(make_result(status="convert_error")) is None


def test_compare_and_history_show_conversion_metrics(store: Store, db_url: str, monkeypatch, capsys) -> None:
    a, b = chain(store, 2)
    run_with(store, a, [_timed([0.10, 0.11, 0.09], 3)])
    run_with(store, b, [_timed([0.70, 0.71, 0.69], 5, seed=1)])
    (row,) = store.compare(a, b)
    assert (row.a.convert_s, row.b.convert_s) == (pytest.approx(0.10), pytest.approx(0.70))
    assert row.deltas["convert_s"] == pytest.approx(0.60) and row.deltas["pass_iterations"] == 2
    points = store.history("tiny_mlp", "fp16", metric="conversion_time")
    assert [p.value for p in points] == [pytest.approx(0.10), pytest.approx(0.70)]
    assert [p.value for p in store.history("tiny_mlp", "fp16", metric="iterations")] == [3, 5]
    monkeypatch.setenv("AMPCI_DATABASE_URL", db_url)
    assert main(["history", "tiny_mlp", "--dtype", "fp16", "--metric", "convert_s", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    values = [p["value"] for p in (got if isinstance(got, list) else got.get("points", got.get("history", [])))]
    assert values == [pytest.approx(0.10), pytest.approx(0.70)]


def test_regression_page_numbers_show_conversion_and_fixpoint() -> None:
    from service.dashboard.views import result_numbers

    rows = {name: (b, n, change) for name, b, n, change in
            result_numbers(_timed([0.1, 0.1], 3), _timed([0.5, 0.5], 7, seed=1))}
    assert rows["pass fixpoint iterations"][:2] == ("3", "7")
    assert rows["conversion s (first run)"][2] not in ("", "–")


def test_history_page_charts_conversion_time_and_iterations(store: Store, db_url: str) -> None:
    from fastapi.testclient import TestClient

    from tests.service.dashboard.conftest import BROWSER, make_app

    a, b = chain(store, 2)
    run_with(store, a, [_timed([0.10, 0.11, 0.09], 3)])
    run_with(store, b, [_timed([0.70, 0.71, 0.69], 5, seed=1)])
    with TestClient(make_app(store, db_url), raise_server_exceptions=False, headers=BROWSER) as client:
        page = client.get("/history", params={"model": "tiny_mlp", "dtype": "fp16", "policy": "default",
                                              "target": "cpu", "branch": "all"})
    assert page.status_code == 200, page.text[:300]
    assert "Conversion time (s" in page.text and "Pass painting fixpoint iterations" in page.text
    # results without the figures (stored before 0004) get no empty chart
    from service.dashboard.plots import metrics_for
    from service.db.dashboard import cell_history

    points, _ = cell_history(store, ("tiny_mlp", "fp16", "default", "cpu"), None)
    assert [p.convert_s for p in points] == [pytest.approx(0.10), pytest.approx(0.70)]
    old = [p.__class__(**{**p.__dict__, "convert_s": None, "pass_iterations": None}) for p in points]
    assert {m.key for m in metrics_for(old)}.isdisjoint({"convert_s", "pass_iterations"})
