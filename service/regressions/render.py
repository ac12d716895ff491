"""The text people read: rich tables for the CLI and a small terminal plot (golden-file tested).

Everything here is a pure function of records; nothing touches the database.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from rich.table import Table

from service.db.records import CompareRow, HistoryPoint, JobInfo, RegressionInfo, ResultRow, RunInfo


def fmt(x: float | int | bool | None, digits: int = 4) -> str:
    """Compact number formatting ('-' for unknown, 'inf' for infinities)."""
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return str(x)
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return f"{x:.{digits}g}"


def _ts(dt: object) -> str:
    return dt.strftime("%Y-%m-%d %H:%M") if dt is not None else "-"  # type: ignore[attr-defined]


def runs_table(runs: Sequence[RunInfo]) -> Table:
    """One row per run, newest first as given."""
    t = Table(title="runs")
    for col in ("id", "revision", "trigger", "sweep", "status", "baseline", "created", "finished"):
        t.add_column(col, justify="right" if col == "id" else "left", no_wrap=True)
    for r in runs:
        t.add_row(str(r.id), r.revision_sha[:12], r.trigger, r.sweep, r.status,
                  (r.baseline_sha or "-")[:12], _ts(r.created_at), _ts(r.finished_at))
    return t


def jobs_table(jobs: Sequence[JobInfo]) -> Table:
    """The jobs of one run."""
    t = Table(title="jobs")
    for col in ("id", "model", "dtype", "policy", "target", "status", "attempts", "worker", "error"):
        t.add_column(col, no_wrap=col != "error")
    for j in jobs:
        t.add_row(str(j.id), j.model, j.dtype, j.policy, j.target, j.status, str(j.attempts), j.worker or "-",
                  (j.error or "")[:60])
    return t


def results_table(rows: Sequence[ResultRow]) -> Table:
    """One row per result with the compared metrics."""
    t = Table(title="results")
    for col in ("run", "revision", "model", "dtype", "policy", "target", "status", "cosine", "max_abs",
                "p50 ms", "speedup", "low-prec", "casts"):
        t.add_column(col, no_wrap=True)
    for r in rows:
        t.add_row(str(r.run_id), r.revision_sha[:10], r.model, r.dtype, r.policy, r.target, r.status,
                  fmt(r.cosine, 6), fmt(r.max_abs, 3), fmt(r.latency_p50_ms, 4), fmt(r.speedup, 3),
                  fmt(r.low_precision_fraction, 3), fmt(r.casts_inserted))
    return t


def regressions_table(regs: Sequence[RegressionInfo]) -> Table:
    """Findings newest first as given."""
    t = Table(title="regressions")
    for col in ("id", "run", "revision", "cell", "kind", "category", "severity", "state", "detail"):
        t.add_column(col, no_wrap=col not in ("detail", "cell"))
    for r in regs:
        t.add_row(str(r.id), str(r.run_id), r.revision_sha[:10], "/".join(r.cell), r.kind, r.category,
                  r.severity, r.state, r.detail)
    return t


def _pct(a: float | None, b: float | None) -> str:
    if a is None or b is None or a == 0 or math.isinf(a) or math.isinf(b):
        return "-"
    return f"{(b - a) / a * 100:+.1f}%"


def compare_table(rows: Sequence[CompareRow], rev_a: str, rev_b: str) -> Table:
    """Cell-by-cell comparison of two revisions with deltas (b - a)."""
    t = Table(title=f"compare {rev_a[:10]} -> {rev_b[:10]}")
    for col in ("model", "dtype", "policy", "target", "status", "cosine", "Δcosine", "max_abs", "Δmax_abs",
                "p50 ms", "Δp50", "low-prec", "Δcasts"):
        t.add_column(col, no_wrap=True)
    for r in rows:
        a, b = r.a, r.b
        status = f"{a.status if a else '-'} -> {b.status if b else '-'}" if (a and b and a.status != b.status) \
            or not (a and b) else (b.status if b else "-")
        t.add_row(r.model, r.dtype, r.policy, r.target, status,
                  fmt(b.cosine if b else None, 6), fmt(r.deltas.get("cosine"), 3),
                  fmt(b.max_abs if b else None, 3), fmt(r.deltas.get("max_abs"), 3),
                  fmt(b.latency_p50_ms if b else None, 4),
                  _pct(a.latency_p50_ms if a else None, b.latency_p50_ms if b else None),
                  fmt(b.low_precision_fraction if b else None, 3), fmt(r.deltas.get("casts_inserted")))
    return t


def history_table(points: Sequence[HistoryPoint], metric: str) -> Table:
    """The points of a history, oldest first."""
    t = Table(title=f"history of {metric}")
    for col in ("run", "revision", "trigger", "created", "policy", "target", "status", metric):
        t.add_column(col, no_wrap=True)
    units = any(p.unit for p in points)
    if units:
        t.add_column("unit", no_wrap=True)
    for p in points:
        row = [str(p.run_id), p.revision_sha[:10], p.trigger, _ts(p.created_at), p.policy, p.target, p.status,
               fmt(p.value, 6)]
        t.add_row(*row, *([p.unit or "-"] if units else []))
    return t


def plot(values: Sequence[float | None], height: int = 8, width: int = 60, label: str = "") -> str:
    """A terminal line plot of ``values`` (oldest left); None/non-finite points are gaps ('x' marks them).

    The y axis is labelled with the min and max; when there are more values than ``width``
    columns, each column shows the last value of its bucket.
    """
    vals = list(values)
    if not vals:
        return f"{label}: no data" if label else "no data"
    if len(vals) > width:
        step = len(vals) / width
        vals = [vals[min(len(vals) - 1, int((i + 1) * step) - 1)] for i in range(width)]
    finite = [v for v in vals if v is not None and math.isfinite(v)]
    if not finite:
        return f"{label}: no finite values" if label else "no finite values"
    lo, hi = min(finite), max(finite)
    span = hi - lo or 1.0
    grid = [[" "] * len(vals) for _ in range(height)]
    for x, v in enumerate(vals):
        if v is None or not math.isfinite(v):
            grid[height - 1][x] = "x"
            continue
        y = round((v - lo) / span * (height - 1))
        grid[height - 1 - y][x] = "*"
    top, bottom = fmt(hi, 6), fmt(lo, 6)
    pad = max(len(top), len(bottom))
    lines = [label] if label else []
    for i, row in enumerate(grid):
        axis = top if i == 0 else bottom if i == height - 1 else ""
        lines.append(f"{axis:>{pad}} |{''.join(row).rstrip()}")
    lines.append(" " * pad + " +" + "-" * len(vals))
    return "\n".join(lines)
