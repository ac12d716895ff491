"""Graph facts measured from the converted model file itself, by the measuring side's definitions.

The pass's report says what the pass *thinks* it did, counted with the revision's own op lists; a
verdict must not rest on it (a revision that moves ``MatMul`` to its deny list, or stops painting
inside If/Loop/Scan bodies, would report full coverage).  :func:`measure_graph` counts from the
model the pass wrote:

- **compute nodes** are the default-domain nodes whose op type is in :data:`COMPUTE_OPS`, a list
  that belongs to the workers (versioned by :data:`COMPUTE_OPS_VERSION`, never read from the pass's
  policy); a compute node is **low** when every float-typed input and output it has is the job's low
  dtype (fp16 or bf16) in the converted model;
- every graph is walked: the main graph and every If/Loop/Scan body (any GRAPH/GRAPHS attribute),
  nested to any depth, with the lexical scoping of ONNX (a body sees the names of its outer graphs);
- value types come from ONNX type inference run on a skeleton of the model (large main-graph
  initializers become typed inputs, so their data is never copied), then from what the file
  declares (inputs, outputs, value_info, initializers, Constant values, Cast targets);
- ``low_precision_compute_fraction`` is ``compute_low / compute_nodes``, or None ("not applicable")
  when the model has no compute nodes: never 1.0 for nothing.

Guarantees: pure (the models passed in are never modified); the same file gives the same facts
whatever revision of the pass wrote it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import onnx
from onnx import AttributeProto, TensorProto

from workers.result import GRAPH_FACTS_MEASURED, GraphFacts

#: Version of the compute-op definition below; results counted with different versions do not compare.
COMPUTE_OPS_VERSION = "1"
#: Default-domain op types whose work is the compute mixed precision exists to speed up (float only:
#: integer/quantized ops such as MatMulInteger are not float compute).
COMPUTE_OPS: frozenset[str] = frozenset({
    "Conv", "ConvTranspose", "MatMul", "Gemm", "Einsum", "LSTM", "GRU", "RNN", "Attention",
})
#: Op types that only change a value's type: counted as casts, never as low or fp32 work.
CAST_OPS: frozenset[str] = frozenset({"Cast", "CastLike"})
LOW_DTYPES: dict[str, int] = {"fp16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16}
FLOAT_TYPES = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE})
_DEFAULT_DOMAINS = ("", "ai.onnx")
#: Main-graph initializers above this many bytes are replaced by typed inputs for type inference.
_SKELETON_BYTES = 1 << 16


@dataclass
class Measured:
    """What :func:`count_graph` counted (see the module doc for the definitions)."""

    nodes_total: int = 0
    nodes_low: int = 0
    nodes_kept_fp32: int = 0
    kept_fp32_by_op: dict[str, int] = field(default_factory=dict)
    compute_nodes: int = 0
    compute_low: int = 0
    compute_by_op: dict[str, dict[str, int]] = field(default_factory=dict)  # {op: {"total": n, "low": k}}
    casts_total: int = 0
    casts_original: int = 0
    untyped_nodes: int = 0  # nodes none of whose inputs/outputs has a known type
    graphs: int = 0

    @property
    def casts_inserted(self) -> int:
        """Casts the converted model has beyond the original's (0 when it has fewer)."""
        return max(0, self.casts_total - self.casts_original)

    @property
    def casts_removed(self) -> int:
        """Casts of the original the converted model no longer has, net (0 when it has more)."""
        return max(0, self.casts_original - self.casts_total)

    @property
    def low_precision_compute_fraction(self) -> float | None:
        """``compute_low / compute_nodes``; None when there is no compute node (not applicable)."""
        return self.compute_low / self.compute_nodes if self.compute_nodes else None


def low_dtype(dtype: str) -> int:
    """The TensorProto element type of a job dtype (``fp16``/``bf16``); ValueError for anything else."""
    try:
        return LOW_DTYPES[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {', '.join(LOW_DTYPES)}") from None


def measure_graph(converted: onnx.ModelProto, original: onnx.ModelProto | None, dtype: str) -> GraphFacts:
    """The :class:`GraphFacts` of ``converted`` measured by :func:`count_graph` (``source = "measured"``,
    ``compute_ops_version`` set); the pass-report parts (``kept_fp32``, ``pass_*``) and the conversion
    times are left for the caller to fill."""
    c = count_graph(converted, original, dtype)
    return GraphFacts(
        nodes_total=c.nodes_total, nodes_low=c.nodes_low, casts_inserted=c.casts_inserted,
        casts_removed=c.casts_removed, compute_nodes=c.compute_nodes, compute_low=c.compute_low,
        low_precision_compute_fraction=c.low_precision_compute_fraction, source=GRAPH_FACTS_MEASURED,
        compute_ops_version=COMPUTE_OPS_VERSION, compute_by_op=c.compute_by_op, casts_total=c.casts_total,
        casts_original=c.casts_original, nodes_kept_fp32=c.nodes_kept_fp32, kept_fp32_by_op=c.kept_fp32_by_op,
        untyped_nodes=c.untyped_nodes, graphs=c.graphs)


#: ``amp_pass.paint.Painter.run``'s iteration limit: a report at it without a ``converged`` key did not converge.
PAINT_MAX_ITERATIONS = 100
#: The pass report's own counts kept in ``GraphFacts.pass_report`` (information, never evidence).
PASS_REPORT_KEYS = ("nodes_total", "nodes_low", "casts_inserted", "casts_removed", "compute_nodes", "compute_low",
                    "low_precision_compute_fraction", "iterations", "converged", "seconds", "opset_in", "opset_out")


def attach_report(measured: GraphFacts, report: dict[str, Any], samples_s: list[float],
                  reference_s: list[float] | None = None, cpu_s: list[float] | None = None) -> GraphFacts:
    """``measured`` (from :func:`measure_graph`) with the pass report's information
    attached: its fp32 reasons (``kept_fp32``), its own counts (``pass_report``), its painting fixpoint
    (``pass_iterations``; ``pass_converged`` from the report's ``converged``, else whether the iterations
    stayed below :data:`PAINT_MAX_ITERATIONS`; None when the report has no ``iterations``), the
    conversion wall times this worker measured (``convert_seconds`` the first, ``convert_samples_s`` all) and
    the reference workload timed after each (``convert_reference_s``, kept only when paired one to one), and
    the conversion process's own CPU seconds in each (``convert_cpu_s``, kept only when paired one to one).
    The measured counts are never replaced by the report's."""
    iterations = report.get("iterations")
    iterations = int(iterations) if isinstance(iterations, int | float) and not isinstance(iterations, bool) else None
    converged = report.get("converged")
    if not isinstance(converged, bool):
        converged = None if iterations is None else iterations < PAINT_MAX_ITERATIONS
    measured.kept_fp32 = [{k: str(v) for k, v in item.items()} for item in report.get("kept_fp32", [])
                          if isinstance(item, dict)]
    measured.pass_report = {k: report[k] for k in PASS_REPORT_KEYS
                            if k in report and isinstance(report[k], int | float | bool | None)}
    measured.pass_iterations, measured.pass_converged = iterations, converged
    measured.convert_samples_s = [round(float(x), 6) for x in samples_s]
    measured.convert_seconds = measured.convert_samples_s[0] if measured.convert_samples_s else 0.0
    ref = [round(float(x), 6) for x in (reference_s or [])]
    measured.convert_reference_s = ref if len(ref) == len(measured.convert_samples_s) else []
    cpu = [round(float(x), 6) for x in (cpu_s or [])]
    measured.convert_cpu_s = cpu if len(cpu) == len(measured.convert_samples_s) else []
    return measured


def count_graph(converted: onnx.ModelProto, original: onnx.ModelProto | None, dtype: str) -> Measured:
    """Count compute, low-precision, fp32 and cast nodes of ``converted`` in every graph (see module doc).

    ``original``: the fp32 model the pass was given (only its casts are counted, so that
    ``casts_inserted`` is what the conversion added); None counts no original casts."""
    low = low_dtype(dtype)
    out = Measured()
    for graph, types in _typed_graphs(converted):
        out.graphs += 1
        for node in graph.node:
            _count(node, types, low, out)
    if original is not None:
        out.casts_original = sum(1 for g in _graphs(original.graph) for n in g.node if n.op_type in CAST_OPS)
    return out


def _count(node: onnx.NodeProto, types: _Scope, low: int, out: Measured) -> None:
    out.nodes_total += 1
    if node.op_type in CAST_OPS:
        out.casts_total += 1
        return
    ins = [types.get(x) for x in node.input if x]
    outs = [types.get(y) for y in node.output if y]
    if all(t is None for t in ins + outs):
        out.untyped_nodes += 1
    float_outs = [t for t in outs if t in FLOAT_TYPES]
    if float_outs:
        if all(t == low for t in float_outs):
            out.nodes_low += 1
        else:
            out.nodes_kept_fp32 += 1
            out.kept_fp32_by_op[node.op_type] = out.kept_fp32_by_op.get(node.op_type, 0) + 1
    if node.op_type in COMPUTE_OPS and node.domain in _DEFAULT_DOMAINS:
        floats = [t for t in ins + outs if t in FLOAT_TYPES]
        is_low = bool(floats) and all(t == low for t in floats)
        out.compute_nodes += 1
        out.compute_low += int(is_low)
        counts = out.compute_by_op.setdefault(node.op_type, {"total": 0, "low": 0})
        counts["total"] += 1
        counts["low"] += int(is_low)


class _Scope:
    """Element types visible in one graph: its own names, then its outer graphs' (ONNX scoping)."""

    def __init__(self, own: dict[str, int], outer: _Scope | None) -> None:
        self.own, self.outer = own, outer

    def get(self, name: str) -> int | None:
        scope: _Scope | None = self
        while scope is not None:
            t = scope.own.get(name)
            if t is not None:
                return t
            scope = scope.outer
        return None


def _subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    for attr in node.attribute:
        if attr.type == AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == AttributeProto.GRAPHS:
            yield from attr.graphs


def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``graph`` and every graph nested in it, outer before inner."""
    yield graph
    for node in graph.node:
        for sub in _subgraphs(node):
            yield from _graphs(sub)


def _typed_graphs(model: onnx.ModelProto) -> Iterator[tuple[onnx.GraphProto, _Scope]]:
    """Every graph of ``model`` (as stored) with the element types visible in it.

    Inferred types are looked up in the inferred skeleton, graph by graph in the same walk order
    (type inference keeps the node structure), and declared types of the stored model fill the gaps."""
    inferred = _infer(model)
    stored = list(_graphs_with_parent(model.graph, None))
    extra = list(_graphs_with_parent(inferred.graph, None)) if inferred is not None else []
    if len(extra) != len(stored):
        extra = []
    scopes: dict[int, _Scope] = {}
    for i, (graph, parent) in enumerate(stored):
        own = _declared(graph)
        if extra:
            own = {**_declared(extra[i][0]), **own}
        scope = _Scope(own, scopes[parent] if parent is not None else None)
        scopes[i] = scope
        yield graph, scope


def _graphs_with_parent(graph: onnx.GraphProto, parent: int | None,
                        counter: list[int] | None = None) -> Iterator[tuple[onnx.GraphProto, int | None]]:
    """(graph, index of its parent in this walk) for ``graph`` and its nested graphs, outer first."""
    counter = counter if counter is not None else [0]
    me = counter[0]
    counter[0] += 1
    yield graph, parent
    for node in graph.node:
        for sub in _subgraphs(node):
            yield from _graphs_with_parent(sub, me, counter)


def _declared(graph: onnx.GraphProto) -> dict[str, int]:
    """Element types ``graph`` states for its own names (inputs, outputs, value_info, initializers,
    Constant values, Cast/CastLike results)."""
    types: dict[str, int] = {}
    for vi in (*graph.input, *graph.output, *graph.value_info):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            types[vi.name] = vi.type.tensor_type.elem_type
    for t in graph.initializer:
        types[t.name] = t.data_type
    for s in graph.sparse_initializer:
        types[s.values.name] = s.values.data_type
    for node in graph.node:
        if not node.output or not node.output[0]:
            continue
        if node.op_type == "Cast" and node.domain in _DEFAULT_DOMAINS:
            to = next((a.i for a in node.attribute if a.name == "to"), 0)
            if to:
                types.setdefault(node.output[0], to)
        elif node.op_type == "Constant" and node.domain in _DEFAULT_DOMAINS:
            t = _constant_type(node)
            if t:
                types.setdefault(node.output[0], t)
    return types


def _constant_type(node: onnx.NodeProto) -> int:
    for a in node.attribute:
        if a.name == "value" and a.type == AttributeProto.TENSOR:
            return a.t.data_type
        if a.name in ("value_float", "value_floats"):
            return TensorProto.FLOAT
        if a.name in ("value_int", "value_ints"):
            return TensorProto.INT64
    return 0


def _infer(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """ONNX type inference on a skeleton of ``model`` (None when inference cannot run on it)."""
    skeleton = onnx.ModelProto()
    for name in ("ir_version", "opset_import", "functions", "domain", "model_version", "producer_name"):
        if name in ("opset_import", "functions"):
            getattr(skeleton, name).extend(getattr(model, name))
        else:
            setattr(skeleton, name, getattr(model, name))
    g, src = skeleton.graph, model.graph
    g.name = src.name
    g.node.extend(src.node)
    g.output.extend(src.output)
    g.value_info.extend(src.value_info)
    g.sparse_initializer.extend(src.sparse_initializer)
    g.input.extend(src.input)
    have = {vi.name for vi in src.input}
    for t in src.initializer:
        if len(t.raw_data) <= _SKELETON_BYTES and t.data_location != TensorProto.EXTERNAL:
            g.initializer.append(t)
        elif t.name not in have:
            g.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    try:
        return onnx.shape_inference.infer_shapes(skeleton, check_type=False, strict_mode=False)
    except Exception:  # noqa: BLE001 - inference is a help; declared types are the fallback
        return None
