"""The conversion report: what was converted, what stayed fp32 and why, casts, coverage, time."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

import onnx_ir as ir

from amp_pass.paint import Painting
from amp_pass.walk import is_control_flow, iter_graphs

REPORT_VERSION = 1
#: ``Painter.run``'s iteration limit: a painting that used all of it did not reach its fixpoint.
PAINT_MAX_ITERATIONS = 100


@dataclass
class KeptNode:
    """One float node kept in fp32, with the reason (deny list, range, schema, override...)."""

    node: str
    op_type: str
    graph: str
    reason: str


@dataclass
class ConversionReport:
    """JSON-serialisable summary of one conversion (``to_dict`` keys are a stable contract)."""

    dtype: str
    policy: str
    target: str
    keep_io_types: bool = True
    nodes_total: int = 0
    nodes_low: int = 0
    casts_inserted: int = 0
    casts_removed: int = 0
    constants_folded: int = 0
    compute_nodes: int = 0
    compute_low: int = 0
    kept_fp32: list[KeptNode] = field(default_factory=list)
    by_op_type: dict[str, dict[str, int]] = field(default_factory=dict)
    functions_inlined: int = 0
    opset_in: int = 0
    opset_out: int = 0
    notes: list[str] = field(default_factory=list)
    iterations: int = 0
    converged: bool = True  # the painting reached its fixpoint (False: stopped at its iteration limit)
    seconds: float = 0.0

    @property
    def low_precision_compute_fraction(self) -> float:
        """Fraction of compute nodes (Conv/MatMul/Gemm/...) in low precision; 1.0 when there are none."""
        return self.compute_low / self.compute_nodes if self.compute_nodes else 1.0

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (with ``version`` and ``low_precision_compute_fraction``)."""
        d = asdict(self)
        d["low_precision_compute_fraction"] = round(self.low_precision_compute_fraction, 6)
        d["seconds"] = round(self.seconds, 6)
        d["version"] = REPORT_VERSION
        return d

    def to_json(self) -> str:
        """``to_dict`` as indented JSON."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)


def build_report(report: ConversionReport, graph: ir.Graph, painting: Painting,
                 compute_ops: frozenset[str], graphs: list[ir.Graph] | None = None) -> None:
    """Fill node counts, per-op counts, coverage and the fp32 reasons from ``painting``
    (``graphs``: ``walk.graph_list(graph)`` when the caller has it)."""
    names: dict[ir.Graph, str] = {}
    for g in graphs if graphs is not None else iter_graphs(graph):
        names[g] = g.name or "main"
        for node in g:
            if node not in painting.classes:
                if is_control_flow(node):
                    report.nodes_total += 1
                continue  # else inserted by the pass (casts, folded constants): counted as casts
            report.nodes_total += 1
            already_low = any(v.dtype is painting.low for v in node.outputs) and node.op_type != "Cast"
            is_float = node in painting.float_nodes or already_low
            low = node in painting.low_nodes or (already_low and node not in painting.float_nodes)
            if not is_float and not low:
                continue
            counts = report.by_op_type.setdefault(node.op_type, {"low": 0, "fp32": 0})
            if low:
                report.nodes_low += 1
                counts["low"] += 1
            else:
                counts["fp32"] += 1
                report.kept_fp32.append(KeptNode(node.name or f"<{node.op_type}>", node.op_type, names[g],
                                                 painting.reasons.get(node, "fp32")))
            if node.op_type in compute_ops and node.domain in ("", "ai.onnx"):
                report.compute_nodes += 1
                report.compute_low += int(low)
    report.iterations = painting.iterations
    report.converged = painting.iterations < PAINT_MAX_ITERATIONS
