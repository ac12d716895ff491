"""Where a drift happened, on a cell's history charts.

A ``drift`` finding (:mod:`service.regressions.drift`) judges a run against an older reference of its cell
(the start of a lookback window or a pinned baseline) by one metric.  On the chart of that metric its
**range** is marked — every shown revision from the reference (or the first shown one, when the reference is
older than the page's points) to the drifted revision — and, where E-divisive means finds one over the
drift's metric in that range (the plotted points' own values of it where the page has them, such as
``max_abs`` under the accuracy chart's cosine; else the chart's values), the **change point**: the last point
at the old level and the first at the new (:func:`service.regressions.changepoint.moved_range`).  Each mark carries a one-line note that the history
page shows under the chart with the anchor ``drift-<finding id>``, which the finding's own page links to.

Pure functions of the plotted points and the findings; no session is opened here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from service.db.dashboard import HistoryRow
from service.db.records import RegressionInfo

#: The chart key of each drift metric (``accuracy``: whichever accuracy chart the page draws).
DRIFT_CHART = {"max_abs": "accuracy", "final_error": "accuracy", "compute_low": "low_precision_fraction",
               "low_precision_fraction": "low_precision_fraction", "casts_inserted": "casts_inserted",
               "latency_p50_ms": "latency_p50_ms", "convert_s": "convert_s", "pass_iterations": "pass_iterations"}
#: Keys of the accuracy charts (:func:`service.dashboard.plots.metrics_for` draws one of them).
ACCURACY_CHARTS = ("cosine", "error_ratio")


def on_chart(finding: RegressionInfo, chart_key: str) -> bool:
    """True when ``finding`` is a drift of the metric the chart ``chart_key`` plots."""
    if finding.kind != "drift" or finding.category != "regression":
        return False
    key = DRIFT_CHART.get(finding.metric)
    return key == chart_key or (key == "accuracy" and chart_key in ACCURACY_CHARTS)


def anchor(finding_id: int) -> str:
    """The history page's anchor of a drift finding's note (``#`` not included)."""
    return f"drift-{finding_id}"


@dataclass(frozen=True)
class DriftMark:
    """A drift on one chart: indices into the chart's points of the range's first and last point (the
    drifted revision), and of the change point's two sides (None: no single change point in the range)."""

    finding: RegressionInfo
    start: int
    end: int
    moved: tuple[int, int] | None
    reference_shown: bool

    def note(self, points: Sequence[HistoryRow]) -> str:
        """"drifted x4.5 over 8 commits, since REV; level moved between A and B" (from the finding and the
        marks: the finding's detail holds the rest)."""
        f = self.finding
        size = "" if f.ratio is None else ("x∞ " if math.isinf(f.ratio) else f"x{f.ratio:.3g} ")
        since = (f.baseline_sha or "")[:10] or "its reference"
        text = f"{f.metric} drifted {size}since {since}, up to {f.revision_sha[:10]}"
        if not self.reference_shown:
            text += " (the reference is older than the revisions shown)"
        if self.moved is not None:
            a, b = self.moved
            text += f"; level moved between {points[a].revision_sha[:10]} and {points[b].revision_sha[:10]}"
        else:
            text += "; no single change point in the range (a gradual change)"
        return text


def drift_marks(points: Sequence[HistoryRow], findings: dict[int, list[RegressionInfo]], chart_key: str,
                value: Callable[[HistoryRow], float | None]) -> list[DriftMark]:
    """The drifts to mark on the chart ``chart_key`` (values read by ``value``), oldest first; findings are
    keyed by the result they were found on; a drift marked a false positive is not drawn."""
    index = {p.result_id: i for i, p in enumerate(points)}
    marks: list[DriftMark] = []
    for result_id, fs in findings.items():
        end = index.get(result_id)
        if end is None:
            continue
        for f in fs:
            if not on_chart(f, chart_key) or f.state == "false_positive":
                continue
            start = next((i for i, p in enumerate(points[:end]) if (f.baseline_result_id is not None and
                                                                     p.result_id == f.baseline_result_id)
                          or (f.baseline_sha and p.revision_sha == f.baseline_sha)), None)
            shown = start is not None
            start = 0 if start is None else start
            own = _own_value(f.metric) or value
            marks.append(DriftMark(f, start, end, _moved(points, start, end, own), shown))
    return sorted(marks, key=lambda m: (m.end, m.finding.id))


def _own_value(metric: str) -> Callable[[HistoryRow], float | None] | None:
    """The getter of a drift metric's own value on a history point, when the point has that field."""
    if metric not in HistoryRow.__dataclass_fields__:
        return None

    def get(p: HistoryRow) -> float | None:
        v = getattr(p, metric)
        return None if v is None else float(v)
    return get


def _moved(points: Sequence[HistoryRow], start: int, end: int,
           value: Callable[[HistoryRow], float | None]) -> tuple[int, int] | None:
    """Indices of the last point at the old level and the first at the new one between ``start`` and
    ``end`` (E-divisive means over the known values), or None."""
    known = [(i, v) for i in range(start, end + 1) if (v := value(points[i])) is not None and math.isfinite(v)]
    if len(known) < 4:
        return None
    # imported here: numpy is loaded only when a page has a drift to mark
    from service.regressions.changepoint import moved_range

    got = moved_range([v for _, v in known])
    if got is None:
        return None
    return known[got[0]][0], known[got[1]][0]
