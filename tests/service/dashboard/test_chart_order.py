"""The history page reads top down (issue 43): the chart of the metric that moved comes first (a finding of
one of its kinds, then a value that changed), and a metric without any value is one line, not a panel."""

from __future__ import annotations

from typing import Any

import pytest

from service.dashboard.plots import chart_order, metrics_for
from tests.service.dashboard.test_axis_labels import _row


class _Finding:
    """What :func:`chart_order` reads of a finding: its kind."""

    def __init__(self, kind: str) -> None:
        self.kind = kind


def _charts(points: list[Any]) -> list[Any]:
    return [(m, f"<svg>{m.key}</svg>") for m in metrics_for(points)]


def test_a_finding_puts_its_metric_first_then_what_moved() -> None:
    points = [_row(i, casts_inserted=3 if i < 3 else 5) for i in range(1, 5)]  # casts moved; the rest flat
    shown, empty = chart_order(_charts(points), points, {})
    assert [m.key for m, _ in shown][0] == "casts_inserted" and empty == []
    shown, _ = chart_order(_charts(points), points, {4: [_Finding("latency")]})  # type: ignore[list-item]
    assert [m.key for m, _ in shown][:3] == ["latency_p50_ms", "speedup", "casts_inserted"]
    assert sorted(m.key for m, _ in shown) == sorted(m.key for m in metrics_for(points))  # none lost


@pytest.mark.parametrize("missing", ["latency_p50_ms", "speedup", "casts_inserted", "low_precision_fraction"])
def test_a_metric_without_values_is_named_not_drawn(missing: str) -> None:
    points = [_row(i, **{missing: None}) for i in range(1, 4)]
    shown, empty = chart_order(_charts(points), points, {})
    assert [m.key for m in empty] == [missing] and missing not in [m.key for m, _ in shown]


@pytest.mark.postgres
def test_history_page_collapses_empty_charts(client: Any, seeded_db: Any) -> None:
    from tests.service.dashboard.seed import LAT_CELL

    q = "&".join(f"{k}={v}" for k, v in zip(("model", "dtype", "policy", "target"), LAT_CELL, strict=True))
    html = client.get(f"/history?{q}").text
    first = html.index('<figure class="chart" id="chart-')
    assert html[first:].startswith('<figure class="chart" id="chart-latency_p50_ms"')  # the latency finding
    assert 'id="no-data"' not in html  # every metric of this cell has values
