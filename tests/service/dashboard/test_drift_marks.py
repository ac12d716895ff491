"""Drift on the history charts (:mod:`service.dashboard.drift_marks`, :mod:`service.dashboard.plots`): a drift
found by the real detection is drawn over its range on the chart of its metric with the change point's two
sides marked, its note sits under that chart with an anchor, and the finding's page and the history page's
findings list link to it; a drift marked a false positive is not drawn.  PostgreSQL, seeded through the store
and the detection the service runs (the dashboard tests' approach)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from service.dashboard.drift_marks import DRIFT_CHART, on_chart
from service.dashboard.plots import DRIFT_RANGE, LEVEL_MOVED
from service.db import Store
from service.regressions.rules import DRIFT_METRICS
from tests.service.dashboard.conftest import BROWSER, make_app, seeded_database
from tests.service.factories import CELL, chain, make_result, run_with

#: max_abs per commit: a level, then a step of two commits each within x2 of its parent, then one more that
#: takes the cell past x2 and +1e-3 of the window's start (a drift at commit 10, the level moved at 8)
LEVELS = [1e-3] * 8 + [1.9e-3, 1.95e-3, 2.1e-3]
HISTORY = "/history?model=tiny_mlp&dtype=fp16&policy=default&target=cpu&branch=all"


def seed_drift(store: Store) -> dict[str, Any]:
    """The creep of :data:`LEVELS` through real detection; the drift finding and the shas."""
    shas = chain(store, len(LEVELS), start=900)
    for k, (rev, level) in enumerate(zip(shas, LEVELS, strict=True)):
        run_with(store, rev, [make_result(CELL, max_abs=level, seed=k)])
    (drift,) = [g for g in store.regressions(category="regression") if g.kind == "drift"]
    return {"shas": shas, "drift": drift}


@pytest.fixture(scope="module")
def world() -> Iterator[tuple[Any, Store, dict[str, Any]]]:
    from fastapi.testclient import TestClient

    with seeded_database(seed_drift) as (url, store, seeded):
        with TestClient(make_app(store, url), raise_server_exceptions=False, headers=BROWSER) as client:
            yield client, store, seeded


def test_the_seeded_creep_is_a_drift_of_max_abs_against_the_windows_start(world: Any) -> None:
    _, _, seeded = world
    drift, shas = seeded["drift"], seeded["shas"]
    assert (drift.metric, drift.baseline_sha, drift.revision_sha) == ("max_abs", shas[0], shas[-1])


def test_the_drift_range_and_its_change_point_are_drawn_on_its_metrics_chart(world: Any) -> None:
    client, _, seeded = world
    drift, shas = seeded["drift"], seeded["shas"]
    page = client.get(HISTORY)
    assert page.status_code == 200
    charts = dict(re.findall(r'<figure class="chart" id="chart-([a-z_0-9]+)"[^>]*>(.*?)</figure>', page.text, re.S))
    accuracy = charts.get("cosine") or charts["error_ratio"]
    band = re.findall(rf"<title>{re.escape(DRIFT_RANGE)} #{drift.id}: ([^<]*)</title>", accuracy)
    assert len(band) == len(LEVELS)  # every revision from the reference (commit 0) to the drifted one
    moved = re.findall(rf"<title>{re.escape(LEVEL_MOVED)} \(([0-9a-f]+)\)", accuracy)
    assert moved == [shas[7][:10], shas[8][:10]]
    assert f"level moved between {shas[7][:10]} and {shas[8][:10]}" in band[0]
    # only the chart of the drift's metric carries it
    assert all(DRIFT_RANGE not in svg for key, svg in charts.items() if key not in ("cosine", "error_ratio"))
    # its note under that chart, anchored, linking the finding
    note = re.search(rf'<p class="drift-note" id="drift-{drift.id}">(.*?)</p>', page.text, re.S)
    assert note is not None and f'href="/regressions/{drift.id}"' in note.group(1)
    assert f"since {shas[0][:10]}" in note.group(1) and "x2.1" in note.group(1)
    assert "older than the revisions shown" not in note.group(1)
    # the findings list links the drift to its place on the plot
    assert f'href="#drift-{drift.id}"' in page.text


def test_a_reference_older_than_the_page_starts_the_range_at_its_first_point(world: Any) -> None:
    client, _, seeded = world
    drift = seeded["drift"]
    page = client.get(HISTORY + "&limit=5")
    assert len(re.findall(rf"<title>{re.escape(DRIFT_RANGE)} #{drift.id}: ", page.text)) == 5
    note = re.search(rf'<p class="drift-note" id="drift-{drift.id}">(.*?)</p>', page.text, re.S)
    assert note is not None and "the reference is older than the revisions shown" in note.group(1)


def test_the_drift_findings_page_links_its_series_plot(world: Any) -> None:
    client, _, seeded = world
    drift = seeded["drift"]
    page = client.get(f"/regressions/{drift.id}")
    assert page.status_code == 200
    link = re.search(r'<a id="drift-plot" href="([^"]+)"', page.text)
    assert link is not None
    href = link.group(1).replace("&amp;", "&")
    assert href.endswith(f"#drift-{drift.id}") and href.startswith("/history?model=tiny_mlp")
    assert "drifted x" in page.text and "over 10 commits" in page.text  # the finding's own words


def test_a_drift_marked_a_false_positive_is_not_drawn(world: Any) -> None:
    client, store, seeded = world
    drift = seeded["drift"]
    store.ack(drift.id, by="dev", false_positive=True, note="not a change")
    try:
        page = client.get(HISTORY)
        assert DRIFT_RANGE not in page.text and f'id="drift-{drift.id}"' not in page.text
    finally:
        with store.transaction() as conn:  # back to open for the other tests of the module
            from service.db import models as m

            table = m.Regression.__table__
            conn.execute(table.update().where(table.c.id == drift.id).values(state="open"))


@pytest.mark.parametrize("metric", sorted(DRIFT_METRICS))
def test_every_drift_metric_has_a_chart(metric: str) -> None:
    from service.dashboard.plots import metrics_for
    from service.db.dashboard import HistoryRow

    row = HistoryRow(1, 1, "a" * 40, None, "push", None, "pass", 0.999, 1.0, 1e-3, 1.0, 0.9, 1.1, 2.0, 4, 0.9,  # type: ignore[arg-type]
                     0.1, 3)
    keys = {m.key for m in metrics_for([row])}
    finding = type("F", (), {"kind": "drift", "category": "regression", "metric": metric})()
    assert DRIFT_CHART[metric] in keys | {"accuracy"} and any(on_chart(finding, k) for k in keys)  # type: ignore[arg-type]
