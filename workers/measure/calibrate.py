"""Calibration: run an fp32 model once and record the range of every intermediate float value.

:func:`collect_ranges` instruments the model in memory and runs it on onnxruntime's CPU provider:

- every float value of the main graph (graph inputs and node outputs) becomes a graph output and its
  statistics are computed in numpy;
- values inside ``If``/``Loop``/``Scan`` bodies (nested to any depth) cannot be exposed directly, so
  each body computes, for each of its float values, a max vector ``[absmax]`` and a count vector
  ``[count, nonzero, flush_fp16, flush_bf16]``; If branches return them (the other branch returns
  zeros), Loop/Scan bodies return them as extra scan outputs that the enclosing graph reduces over
  iterations (max of the max, sum of the counts), so the statistics of a body value aggregate every
  iteration and every executed branch.

Guarantees: the caller's model is never modified; statistics are keyed by the value keys of
:mod:`amp_pass.calibration` (the same keys the pass computes on its IR); values never executed
(a branch not taken, a zero-trip loop) are absent; the result is deterministic for the same feeds.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnx.inliner
from onnx import AttributeProto, GraphProto, NodeProto, TensorProto, helper

from amp_pass.calibration import CalibrationRanges, ValueRange, node_key, subgraph_scope
from workers.measure.sessions import make_session, run_session

F = TensorProto.FLOAT
FLUSH_FP16 = 2.0 ** -25   # |x| <= this rounds to 0 in fp16 (half the smallest subnormal)
FLUSH_BF16 = 2.0 ** -134  # the same for bf16
_CONSTANT_OPS = frozenset({"Constant", "ConstantOfShape"})


class CalibrationError(Exception):
    """The model cannot be instrumented or run for calibration (a user error: ``exit_code`` 2)."""

    exit_code = 2


@dataclass
class Calibration:
    """Ranges by value key plus, for the first feed set, the main-graph arrays by value name."""

    ranges: CalibrationRanges
    arrays: dict[str, np.ndarray] = field(default_factory=dict)


def prepare_for_calibration(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy with local functions inlined and types inferred in every scope (as the pass sees it)."""
    work = onnx.ModelProto()
    work.CopyFrom(model)
    if len(work.functions):
        work = onnx.inliner.inline_local_functions(work, convert_version=True)
    try:
        return onnx.shape_inference.infer_shapes(work, check_type=False, strict_mode=False, data_prop=False)
    except Exception as exc:  # noqa: BLE001 - onnx raises several types
        raise CalibrationError(f"type inference failed: {' '.join(str(exc).split())[:300]}") from None


class _Instrumenter:
    """Adds the statistics plumbing to a prepared model (see the module docstring)."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
        self._taken = _all_names(model.graph)
        self._n = itertools.count()

    def fresh(self, base: str) -> str:
        while True:
            name = f"__calib{next(self._n)}_{base}"
            if name not in self._taken:
                self._taken.add(name)
                return name

    def const(self, out: list[NodeProto], value: np.ndarray) -> str:
        name = self.fresh("c")
        out.append(helper.make_node("Constant", [], [name], value=onnx.numpy_helper.from_array(value, name + "_t")))
        return name

    def node(self, out: list[NodeProto], op: str, inputs: list[str], **attrs: object) -> str:
        name = self.fresh(op.lower())
        out.append(helper.make_node(op, inputs, [name], name=name, **attrs))
        return name

    def stats(self, out: list[NodeProto], value: str) -> tuple[str, str]:
        """Nodes computing ``[absmax]`` and ``[count, nonzero, flush_fp16, flush_bf16]`` of ``value``."""
        flat = self.node(out, "Reshape", [self.node(out, "Abs", [value]), self.const(out, np.array([-1], np.int64))])
        mx = self.node(out, "ReduceMax", [self.node(out, "Concat", [flat, self.const(out, np.zeros(1, np.float32))],
                                                     axis=0)], keepdims=1)
        nz = self.node(out, "Greater", [flat, self.const(out, np.array(0.0, np.float32))])
        counts = [self.node(out, "Reshape", [self.node(out, "Cast", [self.node(out, "Size", [value])], to=F),
                                             self.const(out, np.array([1], np.int64))])]
        for mask in (nz, *(self.node(out, "And", [nz, self.node(out, "Not", [self.node(out, "Greater", [
                flat, self.const(out, np.array(t, np.float32))])])]) for t in (FLUSH_FP16, FLUSH_BF16))):
            counts.append(self.node(out, "ReduceSum", [self.node(out, "Cast", [mask], to=F)], keepdims=1))
        return mx, self.node(out, "Concat", counts, axis=0)

    def reduce_iterations(self, out: list[NodeProto], mx: str, cnt: str) -> tuple[str, str]:
        """Stacked per-iteration stats ``[T,1]``/``[T,4]`` reduced to ``[1]``/``[4]`` (T may be 0)."""
        flat = self.node(out, "Reshape", [mx, self.const(out, np.array([-1], np.int64))])
        m = self.node(out, "ReduceMax", [self.node(out, "Concat", [flat, self.const(out, np.zeros(1, np.float32))],
                                                    axis=0)], keepdims=1)
        if self.opset >= 13:
            c = self.node(out, "ReduceSum", [cnt, self.const(out, np.array([0], np.int64))], keepdims=0)
        else:
            c = self.node(out, "ReduceSum", [cnt], axes=[0], keepdims=0)
        return m, c

    def graph(self, g: GraphProto, scope: str, outer: Mapping[str, int], in_graph: bool
              ) -> tuple[list[tuple[str, str, str]], list[str]]:
        """Instrument ``g``; returns (stats available in g: (key, max, counts)), main float values)."""
        types = _types(g, outer)
        stats: list[tuple[str, str, str]] = []
        plain: list[str] = []
        new: list[NodeProto] = []
        inits = {t.name for t in g.initializer}
        for vi in g.input:
            if types.get(vi.name) == F and vi.name not in inits:
                if in_graph:
                    stats.append((scope + vi.name, *self.stats(new, vi.name)))
                else:
                    plain.append(vi.name)
        for index, node in enumerate(list(g.node)):
            new.append(node)
            key = node_key(scope, node.output, node.op_type, index)
            if node.domain in ("", "ai.onnx") and node.op_type in ("If", "Loop", "Scan"):
                stats.extend(self.control_flow(node, key, new, types))
            if node.op_type in _CONSTANT_OPS and node.domain in ("", "ai.onnx"):
                continue
            for name in node.output:
                if name and types.get(name) == F:
                    if in_graph:
                        stats.append((scope + name, *self.stats(new, name)))
                    else:
                        plain.append(name)
        del g.node[:]
        g.node.extend(new)
        return stats, plain

    def control_flow(self, node: NodeProto, key: str, out: list[NodeProto], types: Mapping[str, int]
                     ) -> list[tuple[str, str, str]]:
        attrs = {a.name: a for a in node.attribute}
        if node.op_type == "If":
            then_g, else_g = attrs["then_branch"].g, attrs["else_branch"].g
            lt, _ = self.graph(then_g, subgraph_scope(key, "then_branch", None), types, True)
            le, _ = self.graph(else_g, subgraph_scope(key, "else_branch", None), types, True)
            result = []
            for branch, mine, other in ((then_g, lt, le), (else_g, le, lt)):
                body: list[NodeProto] = []
                names = [(m, c) for _, m, c in mine]
                if branch is then_g:
                    names += [self.zeros(body) for _ in other]
                else:
                    names = [self.zeros(body) for _ in other] + names
                branch.node.extend(body)
                for m, c in names:
                    branch.output.extend([helper.make_tensor_value_info(m, F, [1]),
                                          helper.make_tensor_value_info(c, F, [4])])
            for k, _, _ in lt + le:
                m, c = self.fresh("if_max"), self.fresh("if_cnt")
                node.output.extend([m, c])
                result.append((k, m, c))
            return result
        body_attr = "body"
        g = attrs[body_attr].g
        inner, _ = self.graph(g, subgraph_scope(key, body_attr, None), types, True)
        result = []
        for k, m, c in inner:
            g.output.extend([helper.make_tensor_value_info(m, F, [1]), helper.make_tensor_value_info(c, F, [4])])
            sm, sc = self.fresh("scan_max"), self.fresh("scan_cnt")
            node.output.extend([sm, sc])
            result.append((k, *self.reduce_iterations(out, sm, sc)))
        if node.op_type == "Scan":
            for name in ("scan_output_axes", "scan_output_directions"):
                if name in attrs:
                    attrs[name].ints.extend([0] * (2 * len(inner)))
        return result

    def zeros(self, out: list[NodeProto]) -> tuple[str, str]:
        return self.const(out, np.zeros(1, np.float32)), self.const(out, np.zeros(4, np.float32))


def _types(g: GraphProto, outer: Mapping[str, int]) -> dict[str, int]:
    types = dict(outer)
    for t in g.initializer:
        types[t.name] = t.data_type
    for vi in itertools.chain(g.input, g.value_info, g.output):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            types[vi.name] = vi.type.tensor_type.elem_type
    for node in g.node:  # outputs inference could not type but whose dtype the node states
        attrs = {a.name: a for a in node.attribute}
        if node.op_type == "Cast" and "to" in attrs and node.output and node.output[0] not in types:
            types[node.output[0]] = attrs["to"].i
    return types


def _all_names(g: GraphProto) -> set[str]:
    names = {vi.name for vi in itertools.chain(g.input, g.output, g.value_info)} | {t.name for t in g.initializer}
    for node in g.node:
        names.update(node.input)
        names.update(node.output)
        names.add(node.name)
        for attr in node.attribute:
            subs = [attr.g] if attr.type == AttributeProto.GRAPH else list(attr.graphs)
            for sub in subs:
                names |= _all_names(sub)
    return names


def instrument(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str], list[tuple[str, str, str]]]:
    """An instrumented copy of a prepared model, its exposed main values, and body stats outputs."""
    work = onnx.ModelProto()
    work.CopyFrom(model)
    inst = _Instrumenter(work)
    stats, plain = inst.graph(work.graph, "", {}, in_graph=False)
    have = {o.name for o in work.graph.output}
    for name in plain:
        if name not in have:
            work.graph.output.append(helper.make_tensor_value_info(name, F, None))
            have.add(name)
    for _, m, c in stats:
        work.graph.output.extend([helper.make_tensor_value_info(m, F, [1]), helper.make_tensor_value_info(c, F, [4])])
    return work, plain, stats


def array_range(a: np.ndarray) -> ValueRange:
    """Statistics of one observed array."""
    mags = np.abs(np.asarray(a, dtype=np.float32)).reshape(-1)
    nz = mags > 0
    absmax = float(np.nanmax(mags)) if mags.size and not np.isnan(mags).all() else 0.0
    return ValueRange(absmax, int(mags.size), int(nz.sum()), int((nz & (mags <= FLUSH_FP16)).sum()),
                      int((nz & (mags <= FLUSH_BF16)).sum()), tuple(int(d) for d in np.shape(a)))


def merge(a: ValueRange | None, b: ValueRange) -> ValueRange:
    """Two observations of one value combined (max of maxima, sums of counts, shape if equal)."""
    if a is None:
        return b
    return ValueRange(max(a.absmax, b.absmax), a.count + b.count, a.nonzero + b.nonzero,
                      a.flush_fp16 + b.flush_fp16, a.flush_bf16 + b.flush_bf16,
                      a.shape if a.shape == b.shape else None)


def collect_ranges(model: onnx.ModelProto, feeds_list: Sequence[Mapping[str, np.ndarray]],
                   source: str = "", keep_arrays: bool = False, **thresholds: float) -> Calibration:
    """Run the fp32 ``model`` on every feed set and return the ranges of all its float values.

    ``keep_arrays``: also return the first feed set's main-graph values (by name) for sensitivity
    analysis.  ``thresholds`` go to :class:`CalibrationRanges` (overflow_margin, ...).  Raises
    :class:`CalibrationError` when the model cannot be instrumented or run.
    """
    from workers.measure.sessions import SessionError

    prepared = prepare_for_calibration(model)
    work, plain, stats = instrument(prepared)
    try:
        session = make_session(work, "cpu", optimize=False)
    except SessionError as exc:
        raise CalibrationError(f"instrumented model does not load: {exc}") from None
    names = {i.name for i in session.get_inputs()}
    values: dict[str, ValueRange] = {}
    arrays: dict[str, np.ndarray] = {}
    for n, feeds in enumerate(feeds_list):
        try:
            out = run_session(session, {k: v for k, v in feeds.items() if k in names})
        except SessionError as exc:
            raise CalibrationError(f"fp32 model fails on the calibration inputs: {exc}") from None
        for name in plain:
            arr = out[name] if name in out else feeds.get(name)
            if arr is None:
                continue
            values[name] = merge(values.get(name), array_range(arr))
            if keep_arrays and n == 0:
                arrays[name] = arr
        if keep_arrays and n == 0:
            arrays.update({o.name: out[o.name] for o in model.graph.output if o.name in out})
        for key, m, c in stats:
            mx, cnt = float(out[m].reshape(-1)[0]), out[c].reshape(-1)
            if cnt[0] <= 0:
                continue
            obs = ValueRange(mx, int(cnt[0]), int(cnt[1]), int(cnt[2]), int(cnt[3]))
            values[key] = merge(values.get(key), obs)
    return Calibration(CalibrationRanges(values=values, source=source, **thresholds), arrays)  # type: ignore[arg-type]
