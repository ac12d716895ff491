"""The CLI's tables: rich tables of runs, jobs, results, findings, comparisons and histories (golden-file tested).

Every function is a pure function of store records; nothing touches the database.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from rich.table import Table
from rich.text import Text

from service.db.records import CompareRow, HistoryPoint, JobInfo, RegressionInfo, ResultRow, RunInfo
from service.regressions.render import fmt
from service.regressions.verdict import LIST_WORDS, list_verdict

if TYPE_CHECKING:
    from datetime import datetime


def _ts(dt: datetime | None) -> str:
    return dt.strftime("%Y-%m-%d %H:%M") if dt is not None else "-"


#: Below this console width (columns) the tables leave out low-value columns and merge a cell's
#: model/dtype/policy/target into one ``cell`` column; text always folds instead of being cut.
NARROW = 120


def _table(title: str, columns: Sequence[tuple[str, str]], rows: Iterable[Mapping[str, str]]) -> Table:
    """A table of ``columns`` (name, kind) whose rows map column names to text, printed as it is (never
    read as rich markup).  Kind ``text`` folds
    onto more lines when the console is too narrow (never ``mini…``); ``num`` never wraps (numbers
    stay whole); ``id`` is a right-aligned number."""
    t = Table(title=title)
    for name, kind in columns:
        t.add_column(name, justify="right" if kind == "id" else "left", no_wrap=kind != "text",
                     overflow="fold", min_width=len(name) if kind != "text" else None)
    for row in rows:  # stored text is text: rich would read "[/x]" or "[bold]" in a model name as markup
        t.add_row(*(Text(row[name]) for name, _ in columns))
    return t


def _pick(width: int | None, wide: Sequence[tuple[str, str]], narrow: Sequence[tuple[str, str]]) -> \
        Sequence[tuple[str, str]]:
    return narrow if width is not None and width < NARROW else wide


def _cell_text(model: str, dtype: str, policy: str, target: str) -> str:
    return f"{model} {dtype}/{policy}/{target}"


_CELL = (("model", "text"), ("dtype", "text"), ("policy", "text"), ("target", "text"))


def verdict_cell(run: RunInfo, resolved: tuple[int, tuple[int, ...]] | None = None) -> str:
    """A run's verdict as a list shows it (:func:`service.regressions.verdict.list_verdict`), e.g. ``fails: 2
    regressions, 1 not compared`` or ``fails: 6 regressions — resolved since by run 7``."""
    state, counts = list_verdict(run, resolved)
    return f"{LIST_WORDS[state]}: {counts}" if counts and state != "pending" else LIST_WORDS[state]


def runs_table(runs: Sequence[RunInfo], width: int | None = None,
               resolved: Mapping[int, tuple[int, tuple[int, ...]]] | None = None) -> Table:
    """One row per run, newest first as given, its verdict first, with what later runs ``resolved`` of it
    (:func:`service.orchestration.judge.listed_verdicts`) beside it (narrow: no sweep, baseline or finish time)."""
    wide = (("id", "id"), ("verdict", "text"), ("revision", "text"), ("trigger", "text"), ("sweep", "text"),
            ("status", "text"), ("baseline", "text"), ("created", "text"), ("finished", "text"))
    narrow = (("id", "id"), ("verdict", "text"), ("revision", "num"), ("trigger", "text"), ("status", "text"),
              ("created", "text"))
    return _table("runs", _pick(width, wide, narrow), (
        {"id": str(r.id), "verdict": verdict_cell(r, (resolved or {}).get(r.id)), "revision": r.revision_sha[:12], "trigger": r.trigger,
         "sweep": r.sweep,
         "status": r.status, "baseline": (r.baseline_sha or "-")[:12], "created": _ts(r.created_at),
         "finished": _ts(r.finished_at)} for r in runs))


def jobs_table(jobs: Sequence[JobInfo], width: int | None = None) -> Table:
    """The jobs of one run; the error text folds, whole (narrow: one ``cell`` column, no worker)."""
    wide = (("id", "num"), *_CELL, ("status", "text"), ("attempts", "num"), ("worker", "text"), ("error", "text"))
    narrow = (("id", "num"), ("cell", "text"), ("status", "text"), ("attempts", "num"), ("error", "text"))
    return _table("jobs", _pick(width, wide, narrow), (
        {"id": str(j.id), "model": j.model, "dtype": j.dtype, "policy": j.policy, "target": j.target,
         "cell": _cell_text(*j.cell), "status": j.status, "attempts": str(j.attempts), "worker": j.worker or "-",
         "error": j.error or ""} for j in jobs))


def results_table(rows: Sequence[ResultRow], width: int | None = None) -> Table:
    """One row per result with the compared metrics (narrow: one ``cell`` column, no revision,
    low-precision share or casts)."""
    wide = (("run", "num"), ("revision", "text"), *_CELL, ("status", "text"), ("cosine", "num"),
            ("max_abs", "num"), ("p50 ms", "num"), ("speedup", "num"), ("low-prec", "num"), ("casts", "num"))
    narrow = (("run", "num"), ("cell", "text"), ("status", "text"), ("cosine", "num"), ("max_abs", "num"),
              ("p50 ms", "num"), ("speedup", "num"))
    return _table("results", _pick(width, wide, narrow), (
        {"run": str(r.run_id), "revision": r.revision_sha[:10], "model": r.model, "dtype": r.dtype,
         "policy": r.policy, "target": r.target, "cell": _cell_text(*r.cell), "status": r.status,
         "cosine": fmt(r.cosine, 6), "max_abs": fmt(r.max_abs, 3), "p50 ms": fmt(r.latency_p50_ms, 4),
         "speedup": fmt(r.speedup, 3), "low-prec": fmt(r.low_precision_fraction, 3),
         "casts": fmt(r.casts_inserted)} for r in rows))


def regressions_table(regs: Sequence[RegressionInfo], width: int | None = None) -> Table:
    """Findings newest first as given; cell and detail fold (narrow: no run, revision or state)."""
    wide = (("id", "num"), ("run", "num"), ("revision", "text"), ("cell", "text"), ("kind", "text"),
            ("category", "text"), ("severity", "text"), ("state", "text"), ("detail", "text"))
    narrow = (("id", "num"), ("cell", "text"), ("kind", "text"), ("category", "text"), ("state", "text"),
              ("detail", "text"))
    return _table("regressions", _pick(width, wide, narrow), (
        {"id": str(r.id), "run": str(r.run_id), "revision": r.revision_sha[:10],
         "cell": "/".join(r.cell) if width is None or width >= NARROW else _cell_text(*r.cell),
         "kind": r.kind, "category": r.category, "severity": r.severity, "state": r.state, "detail": r.detail}
        for r in regs))


def _pct(a: float | None, b: float | None) -> str:
    if a is None or b is None or a == 0 or math.isinf(a) or math.isinf(b):
        return "-"
    return f"{(b - a) / a * 100:+.1f}%"


def compare_table(rows: Sequence[CompareRow], rev_a: str, rev_b: str, width: int | None = None) -> Table:
    """Cell-by-cell comparison of two revisions with deltas (b - a) (narrow: one ``cell`` column, no
    low-precision share or cast delta)."""
    wide = (*_CELL, ("status", "text"), ("cosine", "num"), ("Δcosine", "num"), ("max_abs", "num"),
            ("Δmax_abs", "num"), ("p50 ms", "num"), ("Δp50", "num"), ("conv s", "num"), ("cpu s", "num"),
            ("low-prec", "num"), ("Δcasts", "num"))
    narrow = (("cell", "text"), ("status", "text"), ("cosine", "num"), ("Δcosine", "num"), ("max_abs", "num"),
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
    return _table(f"compare {rev_a[:10]} -> {rev_b[:10]}", _pick(width, wide, narrow), out)


def history_table(points: Sequence[HistoryPoint], metric: str, width: int | None = None) -> Table:
    """The points of a history, oldest first (narrow: no trigger, revision to 8 characters)."""
    units = any(p.unit for p in points)
    wide = (("run", "num"), ("revision", "text"), ("trigger", "text"), ("created", "text"), ("policy", "text"),
            ("target", "text"), ("status", "text"), (metric, "num"), *((("unit", "text"),) if units else ()))
    narrow = (("run", "num"), ("revision", "text"), ("created", "text"), ("policy", "text"), ("target", "text"),
              ("status", "text"), (metric, "num"), *((("unit", "text"),) if units else ()))
    return _table(f"history of {metric}", _pick(width, wide, narrow), (
        {"run": str(p.run_id), "revision": p.revision_sha[:10], "trigger": p.trigger, "created": _ts(p.created_at),
         "policy": p.policy, "target": p.target, "status": p.status, metric: fmt(p.value, 6), "unit": p.unit or "-"}
        for p in points))
