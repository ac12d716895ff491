"""Data-driven precision decisions: stable node identities, calibration rules and forced-fp32 nodes.

Pure graph code (no onnxruntime).  The *measurement* of ranges lives in ``workers.measure.calibrate``; this
module only decides, from measured :class:`CalibrationRanges`, which nodes must stay fp32, and lets
a caller (the accuracy search of ``workers.measure.autosearch``) force a given set of nodes to fp32.

**Node keys.**  A node is identified by ``scope + first named output`` where the main graph's scope
is ``""`` and a subgraph's scope is ``"<owner key>::<attribute>::"`` (``<attribute>[i]`` for a
GRAPHS attribute).  A value is identified the same way (``scope + name``).  Keys need no node names,
are unique even when sibling If branches reuse a value name, are identical on the ONNX proto and on
the onnx-ir model, and do not change when the pass inserts casts, so a key computed on the fp32
model still names the same node in its converted model.

**Guarantees of the rules.**  A node is kept fp32 by calibration only when it would otherwise run
low; each such node carries a reason naming the value and its observed range.  Overflow (|x| above
``overflow_margin`` x the dtype's max) propagates fp32 forward like a DENY op; mostly-underflowing
values and over-long reductions keep only the node itself in fp32.  Forced nodes propagate like
DENY.  Unknown keys in ``force_fp32`` are an :class:`~amp_pass.errors.OptionsError`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import onnx_ir as ir

from amp_pass.errors import OptionsError
from amp_pass.paint import SOURCES, Painter
from amp_pass.policy import DENY, Policy
from amp_pass.walk import is_control_flow, iter_nodes

if TYPE_CHECKING:
    from amp_pass.options import ConversionOptions

SEP = "::"
FP16_MAX = 65504.0
#: Ops whose output sums many products/terms; value: how to read the reduction length.
REDUCTION_OPS = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose", "ReduceSum", "ReduceMean", "ReduceL1",
                           "ReduceL2", "ReduceSumSquare", "ReduceLogSumExp", "ReduceProd"})
LOW_MAX = {ir.DataType.FLOAT16: FP16_MAX, ir.DataType.BFLOAT16: 3.3895313892515355e38}
LOW_NAME = {ir.DataType.FLOAT16: "fp16", ir.DataType.BFLOAT16: "bf16"}
FORCED_REASON = "forced fp32"


# ---------------------------------------------------------------------------- identities


def node_key(scope: str, output_names: Iterable[str], op_type: str, index: int) -> str:
    """The key of a node in ``scope``: its first non-empty output name (``op#index`` if it has none)."""
    for name in output_names:
        if name:
            return f"{scope}{name}"
    return f"{scope}{op_type}#{index}"


def subgraph_scope(owner_key: str, attribute: str, position: int | None) -> str:
    """Scope prefix of the body held by ``attribute`` of the node ``owner_key`` (position for GRAPHS)."""
    suffix = attribute if position is None else f"{attribute}[{position}]"
    return f"{owner_key}{SEP}{suffix}{SEP}"


def graph_scopes(graph: ir.Graph) -> tuple[dict[ir.Graph, str], dict[ir.Node, str]]:
    """Scope prefix of every (sub)graph and key of every node of ``graph``, recursively."""
    scopes: dict[ir.Graph, str] = {}
    keys: dict[ir.Node, str] = {}

    def visit(g: ir.Graph, scope: str) -> None:
        scopes[g] = scope
        for index, node in enumerate(g):
            key = node_key(scope, (v.name or "" for v in node.outputs), node.op_type, index)
            keys[node] = key
            for attr in node.attributes.values():
                if attr.type is ir.AttributeType.GRAPH:
                    visit(attr.as_graph(), subgraph_scope(key, attr.name, None))
                elif attr.type is ir.AttributeType.GRAPHS:
                    for pos, sub in enumerate(attr.as_graphs()):
                        visit(sub, subgraph_scope(key, attr.name, pos))

    visit(graph, "")
    return scopes, keys


def value_key(value: ir.Value, scopes: Mapping[ir.Graph, str]) -> str | None:
    """The key of ``value`` (scope of the graph that defines it + its name), None if unknown."""
    producer = value.producer()
    home = producer.graph if producer is not None else value.graph
    if home is None or not value.name:
        return None
    return f"{scopes.get(home, '')}{value.name}"


# ---------------------------------------------------------------------------- ranges


@dataclass(frozen=True)
class ValueRange:
    """Observed statistics of one float value, aggregated over inputs and loop iterations.

    ``count`` elements seen (0: never computed), ``nonzero`` of them non-zero, ``flush_fp16`` /
    ``flush_bf16`` non-zero ones that round to zero in that dtype; ``shape`` when it was constant.
    """

    absmax: float
    count: int
    nonzero: int
    flush_fp16: int
    flush_bf16: int
    shape: tuple[int, ...] | None = None

    def flush_fraction(self, low: ir.DataType) -> float:
        """Fraction of the non-zero values that flush to zero in ``low``."""
        flushed = self.flush_fp16 if low is ir.DataType.FLOAT16 else self.flush_bf16
        return flushed / self.nonzero if self.nonzero else 0.0


@dataclass(frozen=True)
class CalibrationRanges:
    """Measured ranges by value key, and the thresholds of the rules that read them.

    ``overflow_margin``: keep fp32 when |x| max > margin x the dtype's max (0.5: half of 65504);
    ``underflow_fraction``: keep fp32 when more than this fraction of non-zero values flush to zero;
    ``max_reduction``: keep fp32 when a node sums more than this many terms per output element.
    """

    values: Mapping[str, ValueRange] = field(default_factory=dict)
    overflow_margin: float = 0.5
    underflow_fraction: float = 0.5
    max_reduction: int = 32768
    source: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (``from_dict`` reads it back)."""
        return {"overflow_margin": self.overflow_margin, "underflow_fraction": self.underflow_fraction,
                "max_reduction": self.max_reduction, "source": self.source,
                "values": {k: {"absmax": v.absmax, "count": v.count, "nonzero": v.nonzero,
                               "flush_fp16": v.flush_fp16, "flush_bf16": v.flush_bf16,
                               "shape": list(v.shape) if v.shape is not None else None}
                           for k, v in sorted(self.values.items())}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CalibrationRanges:
        """Inverse of ``to_dict``."""
        values = {k: ValueRange(float(v["absmax"]), int(v["count"]), int(v["nonzero"]), int(v["flush_fp16"]),
                                int(v["flush_bf16"]), tuple(v["shape"]) if v.get("shape") is not None else None)
                  for k, v in data.get("values", {}).items()}
        return cls(values, float(data.get("overflow_margin", 0.5)), float(data.get("underflow_fraction", 0.5)),
                   int(data.get("max_reduction", 32768)), str(data.get("source", "")))


def _fmt(r: ValueRange) -> str:
    return f"observed |x| max {r.absmax:.4g}, {r.nonzero}/{r.count} non-zero"


def _static_dims(value: ir.Value | None, r: ValueRange | None) -> tuple[int, ...] | None:
    if value is not None and value.shape is not None and all(isinstance(d, int) for d in value.shape):
        return tuple(int(d) for d in value.shape)  # type: ignore[arg-type]
    return r.shape if r is not None else None


def reduction_length(node: ir.Node, dims: list[tuple[int, ...] | None]) -> int | None:
    """How many terms each output element of ``node`` sums (None when shapes are unknown)."""
    op = node.op_type
    a = dims[0] if dims else None
    if op == "MatMul":
        return a[-1] if a else None
    if op == "Gemm":
        trans = node.attributes.get("transA")
        return (a[0] if trans is not None and trans.as_int() else a[1]) if a and len(a) == 2 else None
    if op in ("Conv", "ConvTranspose"):
        w = dims[1] if len(dims) > 1 else None
        if not w or len(w) < 3:
            return None
        group = node.attributes.get("group")
        g = group.as_int() if group is not None else 1
        per = w[1] if op == "Conv" else max(w[0] // max(g, 1), 1)
        return per * math.prod(w[2:])
    if a is None:
        return None
    axes_attr = node.attributes.get("axes")
    axes: list[int] | None = list(axes_attr.as_ints()) if axes_attr is not None else None
    if axes is None and len(node.inputs) > 1 and node.inputs[1] is not None:
        const = node.inputs[1].const_value
        if const is None:
            return None
        axes = [int(x) for x in const.numpy().reshape(-1)]
    if not axes:
        return math.prod(a) if a else 1
    return math.prod(a[ax % len(a)] for ax in axes) if a else 1


def calibration_decisions(graph: ir.Graph, ranges: CalibrationRanges, low: ir.DataType
                          ) -> dict[ir.Node, tuple[str, bool]]:
    """Nodes the ranges keep in fp32: node -> (reason, propagates).  Control flow nodes are skipped."""
    scopes, _ = graph_scopes(graph)
    limit = ranges.overflow_margin * LOW_MAX[low]
    out: dict[ir.Node, tuple[str, bool]] = {}
    for node in iter_nodes(graph):
        if is_control_flow(node) or (node.op_type in SOURCES and node.domain in ("", "ai.onnx")):
            continue
        decided: tuple[str, bool] | None = None
        for role, values in (("output", node.outputs), ("input", node.inputs)):
            for v in values:
                if v is None or v.dtype is not ir.DataType.FLOAT or v.const_value is not None:
                    continue
                key = value_key(v, scopes)
                r = ranges.values.get(key) if key else None
                if r is None or not r.count:
                    continue
                if r.absmax > limit:
                    decided = (f"calibration: {role} {v.name!r} {_fmt(r)} exceeds {ranges.overflow_margin:g} x "
                               f"{LOW_NAME[low]} max {LOW_MAX[low]:.5g}", True)
                    break
                frac = r.flush_fraction(low)
                if frac > ranges.underflow_fraction:
                    decided = (f"calibration: {role} {v.name!r} {_fmt(r)}: {frac:.0%} of its non-zero values "
                               f"flush to zero in {LOW_NAME[low]}", False)
                    break
            if decided:
                break
        if decided is None and node.op_type in REDUCTION_OPS and node.domain in ("", "ai.onnx"):
            dims = [_static_dims(v, ranges.values.get(value_key(v, scopes) or "") if v is not None else None)
                    for v in node.inputs]
            n = reduction_length(node, dims)
            if n is not None and n > ranges.max_reduction:
                decided = (f"calibration: reduction over {n} terms exceeds max_reduction {ranges.max_reduction}",
                           False)
        if decided is not None:
            out[node] = decided
    return out


# ---------------------------------------------------------------------------- painting hook


class CalibratedPainter(Painter):
    """The pass's painter with extra fp32 decisions: node -> (reason, propagates like DENY).

    A decision only changes a node that the policy would otherwise let run low (its reason then
    replaces the policy's); nodes already fp32 keep their own reason.
    """

    def __init__(self, graph: ir.Graph, policy: Policy, opset: int, low: ir.DataType, keep_io_types: bool,
                 decisions: Mapping[ir.Node, tuple[str, bool]]) -> None:
        super().__init__(graph, policy, opset, low, keep_io_types)
        self.decisions = dict(decisions)

    def _classify(self) -> None:
        super()._classify()
        for node, (reason, propagates) in self.decisions.items():
            if node in self.blocked or node in self.tainted or node not in self.p.slots:
                continue
            if self.p.classes.get(node) == DENY:
                continue
            self.p.reasons[node] = reason
            (self.tainted if propagates else self.blocked).add(node)


def forced_decisions(graph: ir.Graph, force_fp32: Iterable[str], reason: str = FORCED_REASON
                     ) -> dict[ir.Node, tuple[str, bool]]:
    """Decisions for the node keys ``force_fp32``; OptionsError naming any key not in the model."""
    wanted = set(force_fp32)
    if not wanted:
        return {}
    _, keys = graph_scopes(graph)
    by_key = {k: n for n, k in keys.items()}
    unknown = sorted(wanted - set(by_key))
    if unknown:
        shown = ", ".join(repr(k) for k in unknown[:5])
        raise OptionsError(f"force_fp32 names {len(unknown)} node key(s) not in the model: {shown}")
    return {by_key[k]: (f"{reason}: {k}", True) for k in sorted(wanted)}


def make_painter(graph: ir.Graph, policy: Policy, opset: int, low: ir.DataType, options: ConversionOptions
                 ) -> Painter:
    """The painter for ``options``: the plain one, or one with calibration and forced-fp32 decisions."""
    force = getattr(options, "force_fp32", frozenset())
    ranges = getattr(options, "calibration", None)
    if not force and ranges is None:
        return Painter(graph, policy, opset, low, options.keep_io_types)
    decisions: dict[ir.Node, tuple[str, bool]] = {}
    if ranges is not None:
        decisions.update(calibration_decisions(graph, ranges, low))
    decisions.update(forced_decisions(graph, force))
    return CalibratedPainter(graph, policy, opset, low, options.keep_io_types, decisions)


def low_node_keys(graph: ir.Graph, policy: Policy, opset: int, low: ir.DataType, options: ConversionOptions
                  ) -> list[str]:
    """Keys of the nodes that would run low under ``options`` (pre-order: outer node before its bodies).

    Constant sources and retargeted Casts are left out: forcing them fp32 changes nothing by itself.
    """
    painting = make_painter(graph, policy, opset, low, options).run()
    _, keys = graph_scopes(graph)
    return [keys[n] for n in iter_nodes(graph)
            if n in painting.low_nodes and not (n.op_type in SOURCES and n.domain in ("", "ai.onnx"))]
