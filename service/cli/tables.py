"""The CLI's tables: rich tables of runs, jobs, results, findings, comparisons and histories (golden-file tested).

Every function is a pure function of store records; nothing touches the database.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from service.cli.fit import Column, fit_table
from service.db.records import CompareRow, HistoryPoint, JobInfo, RegressionInfo, ResultRow, RunInfo
from service.regressions.listing import LIST_WORDS, list_verdict
from service.regressions.render import fmt

if TYPE_CHECKING:
    from datetime import datetime

    from rich.console import RenderableType


def _ts(dt: datetime | None) -> str:
    return dt.strftime("%Y-%m-%d %H:%M") if dt is not None else "-"


#: Below this console width (columns) the tables leave out low-value columns and merge a cell's
#: model/dtype/policy/target into one ``cell`` column; what is left is laid out by
#: :func:`service.cli.fit.fit_table` (no word broken; long text wrapped to a few lines).
NARROW = 120


def _table(title: str, layouts: Sequence[Sequence[Column]], rows: Iterable[Mapping[str, str]],
           width: int | None) -> RenderableType:
    """The rows (column name -> text) fitted to ``width`` (:func:`service.cli.fit.fit_table`): ``id``/``num``
    never wrap, ``token`` wraps only between words, ``text`` wraps at words to a few lines."""
    return fit_table(title, layouts, rows, width)


def _pick(width: int | None, wide: Sequence[Column], narrow: Sequence[Column]) -> Sequence[Sequence[Column]]:
    """The layouts to try: every column from :data:`NARROW` columns up (then the narrow set when the wide
    one does not fit), the narrow set below."""
    return (narrow,) if width is not None and width < NARROW else (wide, narrow)


def _cell_text(model: str, dtype: str, policy: str, target: str) -> str:
    return f"{model} {dtype}/{policy}/{target}"


_CELL: tuple[Column, ...] = (("model", "token"), ("dtype", "token"), ("policy", "token"), ("target", "token"))


def verdict_cell(run: RunInfo, resolved: tuple[int, tuple[int, ...]] | None = None) -> str:
    """A run's verdict as a list shows it (:func:`service.regressions.listing.list_verdict`), e.g. ``fails: 2
    regressions, 1 not compared`` or ``fails: 6 regressions — resolved since by run 7``."""
    state, counts = list_verdict(run, resolved)
    return f"{LIST_WORDS[state]}: {counts}" if counts and state != "pending" else LIST_WORDS[state]


def runs_table(runs: Sequence[RunInfo], width: int | None = None,
               resolved: Mapping[int, tuple[int, tuple[int, ...]]] | None = None) -> RenderableType:
    """One row per run, newest first as given, its verdict first, with what later runs ``resolved`` of it
    (:func:`service.orchestration.judge.listed_verdicts`) beside it (narrow: no sweep, baseline or finish time)."""
    wide: tuple[Column, ...] = (("id", "id"), ("verdict", "token"), ("revision", "token"), ("trigger", "token"),
                                ("sweep", "token"), ("status", "token"), ("baseline", "token"), ("created", "token"),
                                ("finished", "token"))
    narrow: tuple[Column, ...] = (("id", "id"), ("verdict", "token"), ("revision", "num"), ("trigger", "token"),
                                  ("status", "token"), ("created", "token"))
    return _table("runs", _pick(width, wide, narrow), (
        {"id": str(r.id), "verdict": verdict_cell(r, (resolved or {}).get(r.id)), "revision": r.revision_sha[:12], "trigger": r.trigger,
         "sweep": r.sweep,
         "status": r.status, "baseline": (r.baseline_sha or "-")[:12], "created": _ts(r.created_at),
         "finished": _ts(r.finished_at)} for r in runs), width)


def jobs_table(jobs: Sequence[JobInfo], width: int | None = None) -> RenderableType:
    """The jobs of one run; the error text folds, whole (narrow: one ``cell`` column, no worker)."""
    wide: tuple[Column, ...] = (("id", "num"), *_CELL, ("status", "token"), ("attempts", "num"), ("worker", "token"), ("error", "text"))
    narrow: tuple[Column, ...] = (("id", "num"), ("cell", "token"), ("status", "token"), ("attempts", "num"), ("error", "text"))
    return _table("jobs", _pick(width, wide, narrow), (
        {"id": str(j.id), "model": j.model, "dtype": j.dtype, "policy": j.policy, "target": j.target,
         "cell": _cell_text(*j.cell), "status": j.status, "attempts": str(j.attempts), "worker": j.worker or "-",
         "error": j.error or ""} for j in jobs), width)


def results_table(rows: Sequence[ResultRow], width: int | None = None) -> RenderableType:
    """One row per result with the compared metrics (narrow: one ``cell`` column, no revision,
    low-precision share or casts)."""
    wide: tuple[Column, ...] = (("run", "num"), ("revision", "token"), *_CELL, ("status", "token"), ("cosine", "num"),
            ("max_abs", "num"), ("p50 ms", "num"), ("speedup", "num"), ("low-prec", "num"), ("casts", "num"))
    narrow: tuple[Column, ...] = (("run", "num"), ("cell", "token"), ("status", "token"), ("cosine", "num"), ("max_abs", "num"),
              ("p50 ms", "num"), ("speedup", "num"))
    return _table("results", _pick(width, wide, narrow), (
        {"run": str(r.run_id), "revision": r.revision_sha[:10], "model": r.model, "dtype": r.dtype,
         "policy": r.policy, "target": r.target, "cell": _cell_text(*r.cell), "status": r.status,
         "cosine": fmt(r.cosine, 6), "max_abs": fmt(r.max_abs, 3), "p50 ms": fmt(r.latency_p50_ms, 4),
         "speedup": fmt(r.speedup, 3), "low-prec": fmt(r.low_precision_fraction, 3),
         "casts": fmt(r.casts_inserted)} for r in rows), width)


def regressions_table(regs: Sequence[RegressionInfo], width: int | None = None) -> RenderableType:
    """Findings newest first as given; cell and detail fold (narrow: no run, revision or state)."""
    wide: tuple[Column, ...] = (("id", "num"), ("run", "num"), ("revision", "token"), ("cell", "token"), ("kind", "token"),
            ("category", "token"), ("severity", "token"), ("state", "token"), ("detail", "text"))
    narrow: tuple[Column, ...] = (("id", "num"), ("cell", "token"), ("kind", "token"), ("category", "token"), ("state", "token"),
              ("detail", "text"))
    return _table("regressions", _pick(width, wide, narrow), (
        {"id": str(r.id), "run": str(r.run_id), "revision": r.revision_sha[:10],
         "cell": _cell_text(*r.cell),
         "kind": r.kind, "category": r.category, "severity": r.severity, "state": r.state, "detail": r.detail}
        for r in regs), width)


def _pct(a: float | None, b: float | None) -> str:
    if a is None or b is None or a == 0 or math.isinf(a) or math.isinf(b):
        return "-"
    return f"{(b - a) / a * 100:+.1f}%"


def compare_table(rows: Sequence[CompareRow], rev_a: str, rev_b: str, width: int | None = None) -> RenderableType:
    """Cell-by-cell comparison of two revisions with deltas (b - a) (narrow: one ``cell`` column, no
    low-precision share or cast delta)."""
    wide: tuple[Column, ...] = (*_CELL, ("status", "token"), ("cosine", "num"), ("Δcosine", "num"), ("max_abs", "num"),
            ("Δmax_abs", "num"), ("p50 ms", "num"), ("Δp50", "num"), ("conv s", "num"), ("cpu s", "num"),
            ("low-prec", "num"), ("Δcasts", "num"))
    narrow: tuple[Column, ...] = (("cell", "token"), ("status", "token"), ("cosine", "num"), ("Δcosine", "num"), ("max_abs", "num"),
              ("p50 ms", "num"), ("Δp50", "num"))
    out = []
    for r in rows:
        a, b = r.a, r.b
        status = f"{a.status if a else '-'} -> {b.status if b else '-'}" if (a and b and a.status != b.status) \
            or not (a and b) else (b.status if b else "-")
        out.append({"model": r.model, "dtype": r.dtype, "policy": r.policy, "target": r.target,
                    "cell": _cell_text(r.model, r.dtype, r.policy, r.target), "status": status,
                    "cosine": fmt(b.cosine if b else None, 6), "Δcosine": fmt(r.deltas.get("cosine"), 3),
                    "max_abs": fmt(b.max_abs if b else None, 3), "Δmax_abs": fmt(r.deltas.get("max_abs"), 3),
                    "p50 ms": fmt(b.latency_p50_ms if b else None, 4),
                    "Δp50": _pct(a.latency_p50_ms if a else None, b.latency_p50_ms if b else None),
                    # conversion wall time beside the conversion process's CPU time (a wall-only change is
                    # waiting, usually a busy machine: the conversion-time rule looks at both)
                    "conv s": fmt(b.convert_s if b else None, 4), "cpu s": fmt(b.convert_cpu_s if b else None, 4),
                    "low-prec": fmt(b.low_precision_fraction if b else None, 3),
                    "Δcasts": fmt(r.deltas.get("casts_inserted"))})
    return _table(f"compare {rev_a[:10]} -> {rev_b[:10]}", _pick(width, wide, narrow), out, width)


def history_table(points: Sequence[HistoryPoint], metric: str, width: int | None = None) -> RenderableType:
    """The points of a history, oldest first (narrow: no trigger or time; dtype/policy/target as one cell)."""
    units = any(p.unit for p in points)
    value: Column = (metric, "num")
    wide: tuple[Column, ...] = (("run", "num"), ("revision", "token"), ("trigger", "token"), ("created", "token"), ("dtype", "token"), ("policy", "token"),
            ("target", "token"), ("status", "token"), value, *((("unit", "token"),) if units else ()))
    narrow: tuple[Column, ...] = (("run", "num"), ("revision", "token"), ("cell", "token"), ("status", "token"),
                                  value, *((("unit", "token"),) if units else ()))
    return _table(f"history of {metric}", _pick(width, wide, narrow), (
        {"run": str(p.run_id), "revision": p.revision_sha[:10], "trigger": p.trigger, "created": _ts(p.created_at),
         "dtype": p.dtype, "cell": f"{p.dtype}/{p.policy}/{p.target}", "policy": p.policy, "target": p.target, "status": p.status, metric: fmt(p.value, 6), "unit": p.unit or "-"}
        for p in points), width)
