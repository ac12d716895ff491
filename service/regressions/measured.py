"""The measured graph and conversion figures of a stored result, as rule inputs.

They live in ``results.data`` (the JSON form of :class:`workers.result.JobResult`), not in columns:
:func:`service.regressions.stored.sample` loads a result's document once and hands its ``graph`` object
to :func:`graph_fields`, which turns it into :class:`service.regressions.rules.CellSample` keyword
arguments.  Guarantees: compute counts are given only for graph facts the worker *measured*
(``graph.source == "measured"``) and with their compute-op version; a result whose graph facts are the
pass's own report (stored before measurement), or that has no ``graph`` object, gives None / empty
values ("unknown", never "worse").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypedDict, TypeGuard

from service.json_types import JsonValue
from workers.result import GRAPH_FACTS_MEASURED, LEGACY_CONVERGENCE_ERROR_UNIT


class GraphFields(TypedDict):
    """The :class:`~service.regressions.rules.CellSample` keyword arguments :func:`graph_fields` gives."""

    compute_low: int | None
    compute_nodes: int | None
    compute_ops_version: str | None
    convert_samples: tuple[float, ...]
    convert_reference: tuple[float, ...]
    convert_cpu: tuple[float, ...]
    pass_iterations: int | None
    pass_converged: bool | None


def graph_fields(graph: Mapping[str, JsonValue] | None) -> GraphFields:
    """CellSample keyword arguments (compute_low, compute_nodes, compute_ops_version, convert_samples,
    convert_reference, convert_cpu, pass_iterations, pass_converged) from the ``graph`` object of a stored
    ``results.data`` (None or anything but an object: every figure unknown; see the module doc)."""
    g: Mapping[str, JsonValue] = graph if isinstance(graph, Mapping) else {}
    measured = g.get("source") == GRAPH_FACTS_MEASURED
    return {
        "compute_low": _int(g.get("compute_low")) if measured else None,
        "compute_nodes": _int(g.get("compute_nodes")) if measured else None,
        "compute_ops_version": _str(g.get("compute_ops_version")) if measured else None,
        "convert_samples": floats(g.get("convert_samples_s")),
        "convert_reference": floats(g.get("convert_reference_s")),
        "convert_cpu": floats(g.get("convert_cpu_s")),
        "pass_iterations": _int(g.get("pass_iterations")),
        "pass_converged": v if isinstance(v := g.get("pass_converged"), bool) else None,
    }


def stored_error_unit(raw: object) -> str:
    """The unit of a stored result's convergence errors (its ``convergence.error_unit``, as stored): ``absolute``
    when the result predates ``ConvergenceStats.error_unit`` (as ``JobResult.from_dict`` reads it)."""
    return raw if isinstance(raw, str) and raw else LEGACY_CONVERGENCE_ERROR_UNIT


def floats(values: object) -> tuple[float, ...]:
    """The numbers of a stored JSON list (booleans and other values skipped; anything but a list: none)."""
    if not isinstance(values, list) or not values:
        return ()
    if all(type(x) is float for x in values):  # what a list of timings loads as: no per-item conversion
        return tuple(values)
    return tuple(float(x) for x in values if _number(x))


def _number(x: object) -> TypeGuard[int | float]:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _int(x: object) -> int | None:
    return int(x) if _number(x) else None


def _str(x: object) -> str | None:
    return str(x) if isinstance(x, str | int) and not isinstance(x, bool) else None
