"""Axis labels people can read: every two y labels of a history chart differ (they read ``1 / 1 / 1`` and
``0.999 / 0.999 / 1`` when the values differ in the 5th digit), the accuracy chart plots 1 − cosine on a
log axis with decade labels, and the terminal plot of ``ampci history`` labels its axis with enough digits."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest

from service.dashboard.plots import chart_svg, metrics_for
from service.db.dashboard import HistoryRow
from service.regressions.render import distinct_digits, plot


def _row(i: int, **values: float) -> HistoryRow:
    base = dict(cosine=0.999, error_ratio=None, max_abs=None, latency_p50_ms=2.0, latency_min_ms=None,
                latency_max_ms=None, speedup=1.5, casts_inserted=3, low_precision_fraction=0.5)
    base.update(values)
    return HistoryRow(result_id=i, run_id=i, revision_sha=f"{i:040x}", message="subject", trigger="push",
                      created_at=datetime(2026, 11, 1, tzinfo=UTC), status="pass", **base)  # type: ignore[arg-type]


def y_labels(svg: str) -> list[str]:
    """The y-axis labels of a pygal chart, bottom to top."""
    axis = svg[svg.index('class="axis y'):]
    axis = axis[:axis.index('class="axis x')] if 'class="axis x' in axis else axis
    return re.findall(r'class="guide line" /><text[^>]*>([^<]*)</text>', axis)


@pytest.mark.parametrize(("key", "series"), [
    ("latency_p50_ms", [1.00011, 1.00012, 1.00013, 1.00014]),
    ("speedup", [1.000011, 1.000012, 1.000013]),
    ("low_precision_fraction", [0.9991, 0.9994, 0.9997, 1.0]),
    ("latency_p50_ms", [12.5, 13.0, 250.0]),
])
def test_every_two_y_labels_differ(key: str, series: list[float]):
    points = [_row(i, **{key: v}) for i, v in enumerate(series, 1)]
    [metric] = [m for m in metrics_for(points) if m.key == key]
    labels = y_labels(chart_svg(points, {}, metric, lambda r: f"/runs/{r}"))
    assert len(labels) >= 3 and len(set(labels)) == len(labels), labels


def test_accuracy_is_one_minus_cosine_on_decades():
    points = [_row(i, cosine=c) for i, c in enumerate([0.9999991, 0.9999995, 0.99999, 0.995], 1)]
    metric = metrics_for(points)[0]
    svg = chart_svg(points, {}, metric, lambda r: f"/runs/{r}")
    assert "1 − worst-output cosine" in metric.title and metric.log
    labels = y_labels(svg)
    assert labels and len(set(labels)) == len(labels) and all(re.fullmatch(r"1e-0\d|0\.0*1", x) for x in labels), labels


def test_terminal_plot_labels_its_axis_with_enough_digits():
    text = plot([0.9999991, 0.9999995, 0.9999999], height=5, label="cosine")
    axis = [line.split("|")[0].strip() for line in text.splitlines()[1:-1]]
    labels = [a for a in axis if a]
    assert labels == ["0.9999999", "0.9999995", "0.9999991"], text
    flat = plot([2.0, 2.0], height=4)
    assert [a for a in (line.split("|")[0].strip() for line in flat.splitlines()[:-1]) if a] == ["2", "2"]


def test_distinct_digits():
    assert distinct_digits([1.0, 2.0]) == 4
    assert distinct_digits([0.9999991, 0.9999995]) == 6  # "0.999999" and "1"
    assert distinct_digits([0.9999991, 0.9999995, 0.9999999]) == 7
    assert distinct_digits([1.0, 1.0]) == 4 and distinct_digits([]) == 4
