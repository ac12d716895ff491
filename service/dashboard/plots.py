"""Server-side SVG plots of a cell's history, drawn with pygal (no JavaScript, nothing fetched).

Each chart has one point per revision (oldest left), x labels are short shas, and every point is
a link to its run with a native tooltip (an SVG ``<title>``: revision, run, status, value).  Points
where the cell has a finding are drawn again in a marker series ("▼ regression", "▲ improvement",
"≈ flaky"), so findings are told by shape, legend and tooltip as well as colour.  The latency
chart draws each revision's min–max range of the raw samples as a whisker around the p50.  A drift
finding of a chart's metric is drawn as a band over its range (reference to drifted revision) with its
change point's two sides marked ("♦ level moved"; :mod:`service.dashboard.drift_marks`).

Charts are drawn by :class:`_LineChart`, a ``pygal.Line`` whose points carry only what a
script-free page uses (dot, link, ``<title>`` tooltip, whiskers): roughly half the SVG nodes of
pygal's own points, which makes a cold 200-revision history about a third cheaper to render.

pygal's output is post-processed in two ways: its inline configuration ``<script>`` is removed
(pages stay script-free; pygal's optional tooltip script is already disabled with ``js=[]``), and
each point's ``<desc class="label">`` becomes a ``<title>`` so browsers show it on hover.
"""

from __future__ import annotations

import math
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypedDict

import pygal
from pygal.serie import Serie
from pygal.style import Style
from pygal.svg import Svg

from service.dashboard.drift_marks import DriftMark, anchor, drift_marks, on_chart
from service.db.dashboard import HistoryRow
from service.db.records import RegressionInfo
from service.regressions.render import distinct_digits

_SCRIPT = re.compile(r"<script\b[^>]*>.*?</script>", re.DOTALL)
_LABEL = re.compile(r'<desc class="label">(.*?)</desc>', re.DOTALL)

#: Series colours: the value line, then markers for regression, improvement, flaky (all ≥ 4.5:1 on white).
STYLE = Style(background="#ffffff", plot_background="#ffffff", foreground="#222222", foreground_strong="#111111",
              foreground_subtle="#6b6b6b", opacity="0.9", opacity_hover="1", transition="0ms",
              colors=("#1f5fa8", "#b3261e", "#1b6e34", "#6a4c93"),
              font_family="system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif",
              label_font_size=11, major_label_font_size=11, legend_font_size=12, title_font_size=14,
              value_font_size=11, tooltip_font_size=12)
#: (category, series title, colour): each marker series has its colour on every point, so the colour
#: does not depend on which marker series a chart happens to have.
MARKERS = (("regression", "▼ regression", "#b3261e"), ("improvement", "▲ improvement", "#1b6e34"),
           ("flaky", "≈ flaky", "#6a4c93"))
#: The drift series: the range from the reference to the drifted revision (a wide translucent band), and the
#: two sides of the change point where the level moved.
DRIFT_RANGE, DRIFT_RANGE_COLOUR = "↑ drift range", "#a34700"
LEVEL_MOVED, LEVEL_MOVED_COLOUR = "♦ level moved", "#7a3500"
_STROKE = {DRIFT_RANGE: f"stroke: {DRIFT_RANGE_COLOUR}; stroke-width: 7; stroke-opacity: 0.35"}


class _PointMeta(TypedDict, total=False):
    """What a plotted point carries besides its value (pygal keeps it as the point's metadata): its link, its
    tooltip, its own colour, the latency whisker."""

    xlink: dict[str, str]
    label: str
    color: str
    ci: dict[str, float]


class _Point(_PointMeta):
    """One point as a series hands it to pygal: the value (None: a gap) and its metadata."""

    value: float | None


class _Node(Protocol):
    """An SVG element as pygal builds it (xml.etree's, or lxml's where that is installed)."""

    @property
    def attrib(self) -> MutableMapping[str, str]: ...


class _LineChart(pygal.Line):  # type: ignore[misc]  # pygal is untyped: its Line is Any to mypy
    """``pygal.Line`` drawing each point with only what a script-free page uses.

    pygal's own ``line()`` gives every point, besides its dot, link and label, a ``<desc>`` with the
    link target and four ``<desc>`` nodes of tooltip data (value, x, y, x label) for its JavaScript
    tooltip, and formats the value for them; that script is never sent, so they were about half of
    a chart's SVG nodes and most of its render time.  This ``line()`` draws the same structure
    otherwise (series groups, one ``g.dots`` per point holding the link, the label and
    ``circle.dot``, latency whiskers as ``g.ci``, one ``path.line`` per unbroken run of values),
    for the options charts here use (vertical, linear, not interpolated, not filled).
    """

    def line(self, serie: Serie, rescale: bool = False) -> None:
        svg, view = self.svg, self.view
        serie_node = svg.serie(serie)
        # a gap is a gap on every axis (a logarithmic view maps a missing value to the top, not to None)
        view_values: list[tuple[float | None, float | None]] = [(None, None) if p[1] is None else view(p) for p in serie.points]
        if serie.show_dots:
            overlay, radius, metas = serie_node["overlay"], serie.dots_size, serie.metadata
            for i, (x, y) in enumerate(view_values):
                if x is None or y is None:
                    continue
                meta = metas.get(i)
                self._confidence_interval(overlay, x, y, serie.values[i], meta)
                node = _decorate(svg, svg.node(overlay, class_="dots"), meta)
                svg.node(node, "circle", cx=x, cy=y, r=radius, class_="dot reactive tooltip-trigger")
        if serie.stroke:
            runs: list[list[tuple[float | None, float]]] = [[]]
            for x, y in view_values:
                if y is None:
                    if runs[-1]:
                        runs.append([])
                else:
                    runs[-1].append((x, y))
            style = {"style": _STROKE[serie.title]} if serie.title in _STROKE else {}
            for seq in runs:
                if seq:
                    svg.line(serie_node["plot"], seq, close=False, class_="line reactive nofill", **style)


def _decorate(svg: Svg, node: _Node, meta: _PointMeta | None) -> _Node:
    """pygal's ``decorate`` for the metadata used here (link, colour, label), minus the link ``<desc>``."""
    if not meta:
        return node
    if meta.get("xlink"):
        node = svg.node(node, "a", **meta["xlink"])
    if "color" in meta:
        colour = meta["color"]
        node.attrib["style"] = f"fill: {colour}; stroke: {colour}"
    if meta.get("label"):
        svg.node(node, "desc", class_="label").text = str(meta["label"])
    return node


@dataclass(frozen=True)
class Metric:
    """One chart: title, y-axis label, value getter, finding kinds marked on it, number format."""

    key: str
    title: str
    value: Callable[[HistoryRow], float | None]
    kinds: tuple[str, ...]
    digits: int = 4
    log: bool = False  # a logarithmic y axis (pygal draws only positive values on it)
    shown: Callable[[HistoryRow], str] | None = None  # the value named in a point's tooltip (default: plotted)


#: Charts of whole numbers: a unit of headroom either side and whole-number ticks.
INTEGER_METRICS = frozenset({"casts_inserted", "pass_iterations"})


def _finite(x: float | int | None) -> float | None:
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def metrics_for(points: Sequence[HistoryRow]) -> list[Metric]:
    """The charts of a cell history: accuracy (cosine, or the error ratio without cosines), latency, speed-up,
    casts, coverage, and conversion time and pass iterations where results recorded them."""
    use_cosine = any(p.cosine is not None for p in points) or not any(p.error_ratio is not None for p in points)
    accuracy = (Metric("cosine", "Accuracy: 1 − worst-output cosine similarity vs fp32 (log scale, lower is better)",
                       _one_minus_cosine, ("accuracy", "convergence", "conversion"), 3, log=True,
                       shown=lambda p: f"cosine {_cosine_text(p.cosine)}, 1 − cosine "
                                       f"{_fmt(_one_minus_cosine(p), 3)}") if use_cosine else
                Metric("error_ratio", "Accuracy: error ratio vs fp32 rerun noise", lambda p: _finite(p.error_ratio),
                       ("accuracy", "convergence", "conversion"), 4))
    return [
        accuracy,
        Metric("latency_p50_ms", "Latency p50 (ms), whiskers: min–max of samples",
               lambda p: _finite(p.latency_p50_ms), ("latency",), 4),
        Metric("speedup", "Speed-up over fp32 (fp32 p50 / converted p50)", lambda p: _finite(p.speedup),
               ("latency",), 4),
        Metric("casts_inserted", "Casts inserted", lambda p: _finite(p.casts_inserted), ("coverage", "conversion")),
        Metric("low_precision_fraction", "Low-precision compute fraction", lambda p: _finite(p.low_precision_fraction),
               ("coverage", "conversion"), 3),
        *([Metric("convert_s", "Conversion time (s, median of the worker's timed conversions)",
                  lambda p: _finite(p.convert_s), ("conversion_time",), 4)]
          if any(p.convert_s is not None for p in points) else []),
        *([Metric("pass_iterations", "Pass painting fixpoint iterations", lambda p: _finite(p.pass_iterations),
                  ("pass_convergence",), 0)]
          if any(p.pass_iterations is not None for p in points) else []),
    ]


#: The floor of a plotted 1 − cosine: a cosine of exactly 1 (or rounding above it) sits on the axis floor.
COSINE_FLOOR = 1e-9


def _one_minus_cosine(p: HistoryRow) -> float | None:
    """``1 − cosine`` of a point (None without one), at least :data:`COSINE_FLOOR` so a log axis can draw
    it: cosines such as 0.999990 and 0.999998 differ by a factor 5 here, not in the 6th digit."""
    c = _finite(p.cosine)
    return None if c is None else max(1.0 - c, COSINE_FLOOR)


def _cosine_text(c: float | None) -> str:
    if c is None:
        return "–"
    return f"{c:.8f}".rstrip("0") if c > 0.999 else f"{c:.6g}"


def _fmt(x: float | None, digits: int) -> str:
    return "–" if x is None else f"{x:.{digits}g}"


def _label(p: HistoryRow, metric: Metric, value: float | None, extra: str = "") -> str:
    shown = metric.shown(p) if metric.shown is not None else f"{metric.key} {_fmt(value, metric.digits)}"
    text = f"{p.revision_sha[:10]} · run {p.run_id} · {p.status} · {shown}"
    if metric.key == "latency_p50_ms" and p.latency_min_ms is not None and p.latency_max_ms is not None:
        text += f" (min {_fmt(p.latency_min_ms, 4)}, max {_fmt(p.latency_max_ms, 4)})"
    if p.message:
        text += f" · {p.message.splitlines()[0][:60]}"
    return text + extra


def chart_svg(points: Sequence[HistoryRow], findings: dict[int, list[RegressionInfo]], metric: Metric,
              run_href: Callable[[int], str], width: int = 960, height: int = 250) -> str:
    """One metric's chart as an inline ``<svg>`` string (findings keyed by result id)."""
    lo_hi = _range(points, metric)
    ticks = _ticks(lo_hi, metric)
    digits = distinct_digits(ticks, metric.digits) if ticks else metric.digits  # y labels that differ
    chart = _LineChart(js=[], style=STYLE, width=width, height=height, explicit_size=False,
                       disable_xml_declaration=True, title=metric.title, show_legend=False, dots_size=3,
                       x_label_rotation=0, show_minor_x_labels=False, allow_interruptions=True,
                       x_labels_major_every=max(1, math.ceil(len(points) / 10)), truncate_label=-1,
                       value_formatter=lambda v: _fmt(v, digits), margin=8, spacing=8,
                       print_values=False, include_x_axis=False, show_y_guides=True, show_x_guides=False,
                       logarithmic=metric.log, range=lo_hi, y_labels=ticks)
    chart.x_labels = [p.revision_sha[:7] for p in points]
    values: list[_Point | None] = []
    markers: dict[str, list[_Point | None]] = {name: [] for name, _, _ in MARKERS}
    for p in points:
        v = metric.value(p)
        link = {"href": run_href(p.run_id), "target": "_self"}
        hits = [f for f in findings.get(p.result_id, [])
                if (f.kind in metric.kinds or on_chart(f, metric.key)) and f.state != "false_positive"]
        extra = "".join(f" · {f.category}: {f.kind} ({f.state})" for f in hits)
        point: _Point = {"value": v, "xlink": link, "label": _label(p, metric, v, extra)}
        if metric.key == "latency_p50_ms" and v is not None and p.latency_min_ms is not None \
                and p.latency_max_ms is not None:
            point["ci"] = {"low": p.latency_min_ms, "high": p.latency_max_ms}
        values.append(point if v is not None else None)
        for name, _, colour in MARKERS:
            hit = v is not None and any(f.category == name for f in hits)
            markers[name].append({"value": v, "xlink": link, "label": _label(p, metric, v, extra), "color": colour}
                                 if hit else None)
    chart.add("value", values)
    for name, legend, _ in MARKERS:
        if any(markers[name]):  # an empty marker series costs as much to draw as a full one
            chart.add(legend, markers[name], stroke=False, dots_size=7)
    _add_drifts(chart, points, drift_marks(points, findings, metric.key, metric.value), metric, run_href)
    svg = chart.render(is_unicode=True)
    svg = _SCRIPT.sub("", svg)
    return _LABEL.sub(r"<title>\1</title>", svg)


def _add_drifts(chart: _LineChart, points: Sequence[HistoryRow], marks: Sequence[DriftMark], metric: Metric,
                run_href: Callable[[int], str]) -> None:
    """One band series per drift over its range, and the change points' sides as one marker series."""
    moved: list[_Point | None] = [None] * len(points)
    for mark in marks:
        band: list[_Point | None] = [None] * len(points)
        note = mark.note(points)
        for i in range(mark.start, mark.end + 1):
            v = metric.value(points[i])
            if v is not None:
                band[i] = {"value": v, "xlink": {"href": run_href(points[i].run_id), "target": "_self"},
                           "label": f"{DRIFT_RANGE} #{mark.finding.id}: {note}", "color": DRIFT_RANGE_COLOUR}
        chart.add(DRIFT_RANGE, band, dots_size=2, allow_interruptions=True)
        for i in mark.moved or ():
            v = metric.value(points[i])
            if v is not None:
                moved[i] = {"value": v, "xlink": {"href": run_href(points[i].run_id), "target": "_self"},
                            "label": f"{LEVEL_MOVED} ({points[i].revision_sha[:10]}) · drift #{mark.finding.id}: "
                                     f"{note}", "color": LEVEL_MOVED_COLOUR}
    if any(moved):
        chart.add(LEVEL_MOVED, moved, stroke=False, dots_size=6)


def chart_drifts(points: Sequence[HistoryRow], findings: dict[int, list[RegressionInfo]],
                 metric: Metric) -> list[tuple[int, str, str]]:
    """``(finding id, anchor, note)`` of every drift marked on ``metric``'s chart, for the page under it."""
    return [(m.finding.id, anchor(m.finding.id), m.note(points))
            for m in drift_marks(points, findings, metric.key, metric.value)]


#: A chart's cache key: the metric, the points, their findings by result id, the link of run 0 (the href scheme).
_ChartKey = tuple[str, tuple[HistoryRow, ...], tuple[tuple[int, tuple[RegressionInfo, ...]], ...], str]
_CACHE: OrderedDict[_ChartKey, str] = OrderedDict()
_CACHE_LOCK = threading.Lock()
CACHE_SIZE = 512


def history_charts(points: Sequence[HistoryRow], findings: dict[int, list[RegressionInfo]],
                   run_href: Callable[[int], str], cache: bool = True) -> list[tuple[Metric, str]]:
    """All charts of a cell history.  Rendering is the slow part of the page (pygal takes tens of
    milliseconds per chart), so each chart is kept in a small LRU keyed by everything it shows
    (the points, their findings with states, the metric): a new result or a triage makes a new key."""
    marks = tuple(sorted((rid, tuple(fs)) for rid, fs in findings.items() if fs))
    out = []
    for metric in metrics_for(points):
        key = (metric.key, tuple(points), marks, run_href(0))
        with _CACHE_LOCK:
            svg = _CACHE.get(key) if cache else None
            if svg is not None:
                _CACHE.move_to_end(key)
        if svg is None:
            svg = chart_svg(points, findings, metric, run_href)
            if cache:
                with _CACHE_LOCK:
                    _CACHE[key] = svg
                    while len(_CACHE) > CACHE_SIZE:
                        _CACHE.popitem(last=False)
        out.append((metric, svg))
    return out


def chart_order(charts: Sequence[tuple[Metric, str]], points: Sequence[HistoryRow],
                findings: dict[int, list[RegressionInfo]]) -> tuple[list[tuple[Metric, str]], list[Metric]]:
    """The charts of a cell history in reading order, and the metrics apart that have no value at all (the
    page names them on one line instead of drawing an empty panel).  First the charts that mark a finding
    of one of their kinds, then those whose values moved (not all equal), then the rest; the order of
    :func:`metrics_for` within each group."""
    kinds = {f.kind for fs in findings.values() for f in fs}

    def rank(metric: Metric) -> int:
        if kinds & set(metric.kinds):
            return 0
        values = {v for p in points if (v := metric.value(p)) is not None}
        return 1 if len(values) > 1 else 2

    shown = [(m, svg) for m, svg in charts if any(m.value(p) is not None for p in points)]
    empty = [m for m, _ in charts if not any(m.value(p) is not None for p in points)]
    return sorted(shown, key=lambda chart: rank(chart[0])), empty


def clear_cache() -> None:
    """Forget every cached chart (benchmarks measure cold renders with it)."""
    with _CACHE_LOCK:
        _CACHE.clear()


def _range(points: Sequence[HistoryRow], metric: Metric) -> tuple[float, float] | None:
    """A y range covering values and latency whiskers with a little headroom (None: pygal decides).
    Integer metrics (casts) get at least one unit of headroom on each side."""
    vals = [v for p in points if (v := metric.value(p)) is not None]
    if metric.key == "latency_p50_ms":
        vals += [x for p in points for x in (p.latency_min_ms, p.latency_max_ms) if x is not None and math.isfinite(x)]
    if not vals:
        return None
    lo, hi = min(vals), max(vals)
    if metric.log:  # whole decades around the values (a hair wider, so the decade ticks are inside)
        low, high = 10.0 ** math.floor(math.log10(lo) + 1e-9), 10.0 ** math.ceil(math.log10(hi) - 1e-9)
        if high <= low:
            high = low * 10
        return (low / 1.001, high * 1.001)
    if metric.key in INTEGER_METRICS:
        return (max(0.0, lo - 1), hi + 1)
    pad = (hi - lo) * 0.08 or abs(hi) * 0.01 or 1.0
    # latency, speed-up, casts and fractions are never negative: the axis does not start below 0
    return (max(0.0, lo - pad) if lo >= 0 else lo - pad, hi + pad)


def _ticks(span: tuple[float, float] | None, metric: Metric, count: int = 5) -> list[float] | None:
    """``count`` evenly spaced y labels over ``span`` (whole numbers for casts); None lets pygal choose."""
    if span is None:
        return None
    lo, hi = span
    if metric.log:  # one tick per decade, each readable (1e-05, 0.0001, ...)
        first, last = math.ceil(math.log10(lo)), math.floor(math.log10(hi))
        step = max(1, math.ceil((last - first) / (count + 1)))
        return [10.0 ** e for e in range(first, last + 1, step)]
    if metric.key in INTEGER_METRICS:
        step = max(1, math.ceil((hi - lo) / (count - 1)))
        return [float(v) for v in range(math.floor(lo), math.ceil(hi) + 1, step)]
    return [lo + (hi - lo) * i / (count - 1) for i in range(count)]
