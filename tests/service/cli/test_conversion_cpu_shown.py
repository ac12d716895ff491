"""The conversion process's CPU time is stored beside its wall time (``results.convert_cpu_s``, migration 0006)
and shown where conversion time is: ``ampci compare`` (table and JSON), ``ampci history --metric
conversion_cpu`` and the regression page's numbers."""

from __future__ import annotations

import json

import pytest

from service.cli.main import main
from service.db import Store
from service.db.extract import convert_cpu_seconds
from tests.service.factories import chain, make_result, migrated_store, run_with


@pytest.fixture
def store(db_url: str) -> Store:
    s = migrated_store(db_url)
    yield s
    s.dispose()


def _timed(wall: list[float], cpu: list[float], seed: int = 0):  # type: ignore[no-untyped-def]
    r = make_result(seed=seed)
    assert r.graph is not None
    r.graph.convert_samples_s, r.graph.convert_cpu_s = list(wall), list(cpu)
    return r


def test_cpu_seconds_are_stored_compared_and_shown(store: Store, db_url: str, monkeypatch, capsys) -> None:
    assert convert_cpu_seconds(_timed([0.3, 0.3, 0.3], [0.2, 0.1, 0.4])) == pytest.approx(0.2)
    assert convert_cpu_seconds(_timed([0.3], [])) is None
    a, b = chain(store, 2)
    run_with(store, a, [_timed([0.30, 0.31, 0.29], [0.21, 0.20, 0.22])])
    run_with(store, b, [_timed([0.80, 0.81, 0.79], [0.215, 0.21, 0.22], seed=1)])  # slower in wall time only
    (row,) = store.compare(a, b)
    assert (row.a.convert_cpu_s, row.b.convert_cpu_s) == (pytest.approx(0.21), pytest.approx(0.215))
    assert row.deltas["convert_cpu_s"] == pytest.approx(0.005)
    assert [p.value for p in store.history("tiny_mlp", "fp16", metric="conversion_cpu")] == \
        [pytest.approx(0.21), pytest.approx(0.215)]
    monkeypatch.setenv("AMPCI_DATABASE_URL", db_url)
    monkeypatch.setenv("COLUMNS", "220")
    assert main(["compare", a, b]) == 0
    table = capsys.readouterr().out
    assert "conv s" in table and "cpu s" in table and "0.8" in table and "0.215" in table
    assert main(["compare", a, b, "--json"]) == 0
    (cell,) = json.loads(capsys.readouterr().out)["cells"]
    assert cell["b"]["convert_cpu_s"] == pytest.approx(0.215)


def test_regression_page_numbers_show_wall_and_cpu_medians() -> None:
    from service.dashboard.views import result_numbers

    rows = {name: (b, n, change) for name, b, n, change in
            result_numbers(_timed([0.3, 0.2, 0.4], [0.1, 0.3, 0.2]), _timed([0.8, 0.9, 0.7], [0.2, 0.25, 0.2], seed=1))}
    assert rows["conversion wall s (median)"][:2] == ("0.3", "0.8")
    assert rows["conversion CPU s (median)"][:2] == ("0.2", "0.2")
