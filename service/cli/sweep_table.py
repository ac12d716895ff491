"""What ``ampci sweep`` prints after its run: the result table and the regressions against the baseline.

Laid out by :func:`service.cli.fit.fit_table` like every other listing (issue 43): no line wider than the
console, and no model name, cell (``dtype/policy/target``), status or number broken.  Below
:data:`service.cli.tables.NARROW` columns the table has one ``cell`` column and no messages; each failed
cell's message is then printed whole below it, one paragraph per cell, wrapped at words.  From
:data:`~service.cli.tables.NARROW` columns up a ``message`` column holds a few lines of it (cut with ``…``
and a caption pointing to ``--json``).  A pure function of store records; nothing touches the database.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from service.cli.fit import Column, fit_table
from service.cli.tables import NARROW

if TYPE_CHECKING:
    from rich.console import RenderableType

    from service.db.records import RegressionInfo, ResultRow, RunInfo

_MODEL_CELL: tuple[Column, ...] = (("model", "token"), ("dtype", "token"), ("policy", "token"), ("target", "token"))
_FIGURES: tuple[Column, ...] = (("cosine", "num"), ("max_abs", "num"), ("p50 ms", "num"), ("speedup", "num"))


def _num(value: float | None, fmt: str) -> str:
    """``value`` in ``fmt``; ``-`` when it was not measured (a record reads ``cosine -``, not ``cosine``)."""
    return "-" if value is None else format(value, fmt)


def low_compute_cell(r: ResultRow) -> str:
    """The "low %" cell: the measured low-precision share of the compute nodes (workers.measure.graph_facts), ``n/a``
    for a converted model without compute nodes, empty when the model was not converted."""
    from workers.result import CONVERSION_OK_STATUSES

    if r.low_precision_fraction is not None:
        return format(100 * r.low_precision_fraction, ".0f")
    return "n/a" if r.status in CONVERSION_OK_STATUSES else ""


def _cell(model: str, dtype: str, policy: str, target: str) -> str:
    return f"{model} {dtype}/{policy}/{target}"


def results_rows(results: Sequence[ResultRow]) -> list[dict[str, str]]:
    """One row (column name -> text) per result, for every layout of :func:`sweep_tables`."""
    return [{"model": r.model, "dtype": r.dtype, "policy": r.policy, "target": r.target, "cell": _cell(*r.cell),
             "status": r.status, "cosine": _num(r.cosine, ".5f"), "max_abs": _num(r.max_abs, ".3g"),
             "p50 ms": _num(r.latency_p50_ms, ".2f"), "speedup": _num(r.speedup, ".2f"),
             "low %": low_compute_cell(r) or "-", "message": r.message or ""} for r in results]


def sweep_tables(run: RunInfo, revision: str, results: Sequence[ResultRow], regressions: Sequence[RegressionInfo],
                 summary: str, width: int | None) -> list[RenderableType | str]:
    """The renderables (tables) and lines (strings: the caller wraps them at words to ``width``) that show
    a finished sweep ``run`` of ``revision``: its results, then each message below the table when the
    console is narrower than :data:`NARROW`, then the regressions under ``summary`` (the comparison's line),
    or ``summary`` alone when there are none.  ``width`` None: unbounded (the plain tables)."""
    narrow = width is not None and width < NARROW
    message: tuple[Column, ...] = () if narrow else (("message", "text"),)
    by_cell: tuple[Column, ...] = (("cell", "token"), ("status", "token"), *_FIGURES, *message)
    layouts = (by_cell,) if narrow else ((*_MODEL_CELL, ("status", "token"), *_FIGURES, ("low %", "num"), *message),
                                         by_cell)
    title = f"run {run.id} · {run.sweep} · {revision[:12]} · {run.status}"
    out: list[RenderableType | str] = [fit_table(title, layouts, results_rows(results), width)]
    if narrow:
        out.extend(f"{_cell(*r.cell)} {r.status}: {r.message}" for r in results if r.message)
    if not regressions:
        return [*out, summary]
    figures: tuple[Column, ...] = (("kind", "token"), ("severity", "token"), ("metric", "token"),
                                   ("baseline", "num"), ("value", "num"), ("detail", "text"))
    rows = [{"model": g.model, "dtype": g.dtype, "policy": g.policy, "target": g.target, "cell": _cell(*g.cell),
             "kind": g.kind, "severity": g.severity, "metric": g.metric, "baseline": _num(g.baseline_value, ".4g"),
             "value": _num(g.value, ".4g"), "detail": g.detail} for g in regressions]
    by_cell = (("cell", "token"), *figures)
    out.append(fit_table(summary, (by_cell,) if narrow else ((*_MODEL_CELL, *figures), by_cell), rows, width))
    return out
