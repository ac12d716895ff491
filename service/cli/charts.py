"""The charts ``ampci history`` draws: one per cell (dtype, policy, target) and unit, each saying what it
shows.

A chart names the model, the cell, the metric (and its unit) and how many runs it spans; its y axis is
labelled with the largest, middle and smallest value (:func:`service.regressions.render.plot`, as many
digits as tell them apart); under the x axis stand the first and the last revision; below, where the value
moved most between two runs (``moved most at run R (rev): A -> B (+x%)``) and every run whose status
differs from the run before (``status fail_accuracy at run R``).  A series whose values are all equal is
one line (``flat at V over N runs``) instead of a plot of a flat row.  Every line fits ``width``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from service.db.records import HistoryPoint
from service.regressions.render import fmt, plot

#: The most columns a chart's plot area takes (one column per run; older runs share columns beyond it).
PLOT_COLUMNS = 60
#: The most status changes listed under a chart.
STATUS_CHANGES = 5


def _series(points: Sequence[HistoryPoint]) -> dict[tuple[str, str, str, str], list[HistoryPoint]]:
    """The points by (dtype, policy, target, unit), oldest first as given (values in different units are
    never drawn on one axis)."""
    series: dict[tuple[str, str, str, str], list[HistoryPoint]] = {}
    for p in points:
        series.setdefault((p.dtype, p.policy, p.target, p.unit or ""), []).append(p)
    return series


def _moved(pts: Sequence[HistoryPoint]) -> str | None:
    """The largest change between two successive finite values (runs without a value skipped), as a
    line; None when nothing moved."""
    best: tuple[float, HistoryPoint, HistoryPoint] | None = None
    valued = [p for p in pts if p.value is not None and math.isfinite(p.value)]  # runs without one skipped
    for a, b in zip(valued, valued[1:], strict=False):
        assert a.value is not None and b.value is not None
        step = abs(b.value - a.value)
        if step > 0 and (best is None or step > best[0]):
            best = (step, a, b)
    if best is None:
        return None
    _, a, b = best
    assert a.value is not None and b.value is not None
    pct = f" ({(b.value - a.value) / abs(a.value) * 100:+.1f}%)" if a.value else ""
    return f"moved most at run {b.run_id} ({b.revision_sha[:10]}): {fmt(a.value, 6)} -> {fmt(b.value, 6)}{pct}"


def _status_changes(pts: Sequence[HistoryPoint]) -> list[str]:
    changes = [f"status {b.status} at run {b.run_id} ({b.revision_sha[:10]})"
               for a, b in zip(pts, pts[1:], strict=False) if a.status != b.status]
    if len(changes) > STATUS_CHANGES:
        changes = [*changes[:STATUS_CHANGES], f"and {len(changes) - STATUS_CHANGES} more status changes"]
    return changes


def _chart(model: str, metric: str, key: tuple[str, str, str, str], pts: Sequence[HistoryPoint],
           width: int) -> str:
    dtype, policy, target, unit = key
    runs = f"{len(pts)} run{'' if len(pts) == 1 else 's'}"
    label = f"{model} {dtype}/{policy}/{target} · {metric}{f' ({unit})' if unit else ''} · {runs}"
    values = [p.value for p in pts]
    finite = {v for v in values if v is not None and math.isfinite(v)}
    first, last = pts[0], pts[-1]
    span = f"run {first.run_id} ({first.revision_sha[:10]}) .. run {last.run_id} ({last.revision_sha[:10]})"
    lines = [label]
    if len(finite) <= 1:
        value = fmt(next(iter(finite)), 6) if finite else "no value"
        gaps = sum(1 for v in values if v is None or not math.isfinite(v))
        lines.append(f"  flat at {value} over {span}" + (f"; {gaps} runs without a value" if gaps else ""))
    else:
        drawn = plot(values, height=6, width=max(8, min(PLOT_COLUMNS, width - 16)), label="")
        lines.extend(drawn.splitlines())
        axis = drawn.splitlines()[-1]
        pad = len(axis) - len(axis.lstrip()) + 2  # the plot's first column
        plotted = len(axis.strip()) - 1
        left, right = first.revision_sha[:8], last.revision_sha[:8]
        if plotted >= len(left) + len(right) + 1:
            lines.append(" " * pad + left + right.rjust(plotted - len(left)))
        lines.append(f"  oldest left: {span}")
        moved = _moved(pts)
        if moved:
            lines.append(f"  {moved}")
    lines.extend(f"  {change}" for change in _status_changes(pts))
    return "\n".join(lines)


def history_charts(points: Sequence[HistoryPoint], model: str, metric: str, width: int) -> list[str]:
    """One chart per (dtype, policy, target, unit) of ``points`` (oldest first), in that order; the
    caller wraps each line to ``width`` at its spaces (``emit``), the plots themselves are narrower."""
    return [_chart(model, metric, key, pts, width) for key, pts in sorted(_series(points).items())]
