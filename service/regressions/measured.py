"""The measured graph and conversion figures of a stored result, as rule inputs.

They live in ``results.data`` (the JSON form of :class:`workers.result.JobResult`), not in columns:
:func:`graph_columns` selects them as labelled JSON paths next to ``detect.SAMPLE_COLS``, and
:func:`graph_fields` turns such a row into :class:`service.regressions.rules.CellSample` keyword
arguments.  Guarantees: compute counts are given only for graph facts the worker *measured*
(``graph.source == "measured"``) and with their compute-op version; a result whose graph facts are the
pass's own report (stored before measurement), or a row selected without these columns, gives None /
empty values ("unknown", never "worse").
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from workers.result import GRAPH_FACTS_MEASURED

#: (label, JSON path under ``results.data``) of every figure :func:`graph_fields` reads.
GRAPH_PATHS: tuple[tuple[str, tuple[str, str]], ...] = (
    ("graph_source", ("graph", "source")),
    ("compute_low", ("graph", "compute_low")),
    ("compute_nodes", ("graph", "compute_nodes")),
    ("compute_ops_version", ("graph", "compute_ops_version")),
    ("convert_samples", ("graph", "convert_samples_s")),
    ("convert_reference", ("graph", "convert_reference_s")),
    ("convert_cpu", ("graph", "convert_cpu_s")),
    ("pass_iterations", ("graph", "pass_iterations")),
    ("pass_converged", ("graph", "pass_converged")),
)


def graph_columns(results: sa.Table) -> tuple[sa.ColumnElement[Any], ...]:
    """Labelled JSON-path columns of ``results.data`` for :func:`graph_fields`."""
    return tuple(results.c.data[path].label(label) for label, path in GRAPH_PATHS)


def graph_fields(row: Any) -> dict[str, Any]:
    """CellSample keyword arguments (compute_low, compute_nodes, compute_ops_version, convert_samples,
    convert_reference, convert_cpu, pass_iterations, pass_converged) from a row selected with :func:`graph_columns` (see module doc)."""
    measured = getattr(row, "graph_source", None) == GRAPH_FACTS_MEASURED
    samples = getattr(row, "convert_samples", None)
    return {
        "compute_low": _int(getattr(row, "compute_low", None)) if measured else None,
        "compute_nodes": _int(getattr(row, "compute_nodes", None)) if measured else None,
        "compute_ops_version": _str(getattr(row, "compute_ops_version", None)) if measured else None,
        "convert_samples": floats(samples),
        "convert_reference": floats(getattr(row, "convert_reference", None)),
        "convert_cpu": floats(getattr(row, "convert_cpu", None)),
        "pass_iterations": _int(getattr(row, "pass_iterations", None)),
        "pass_converged": v if isinstance(v := getattr(row, "pass_converged", None), bool) else None,
    }


def floats(values: Any) -> tuple[float, ...]:
    """The numbers of a stored JSON list (booleans and other values skipped; anything but a list: none)."""
    return tuple(float(x) for x in values if _number(x)) if isinstance(values, list) else ()


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _int(x: Any) -> int | None:
    return int(x) if _number(x) else None


def _str(x: Any) -> str | None:
    return str(x) if isinstance(x, str | int) and not isinstance(x, bool) else None
