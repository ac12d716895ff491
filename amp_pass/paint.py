"""Painting: decide which nodes and values run low precision, to a fixpoint across subgraphs.

Rules (after TensorFlow grappler's AMP): ALLOW nodes are low; DENY nodes (and nodes kept fp32 by
range safety) are fp32 and that fp32 propagates forward through INFER/CLEAR nodes; INFER/CLEAR nodes
follow their producers according to the policy rule; constant sources (Constant, ConstantOfShape)
and ``Cast(to=float)`` are retargeted when every consumer wants the low dtype.  Control flow is
painted by slot: an If output is low only when both branches produce it low; a Loop/Scan carried
value is low only when its body produces it low (one dtype for every iteration).
Guarantees: only positions listed by ``schema.low_slots`` change dtype; the result is a fixpoint.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from amp_pass import policy as pol
from amp_pass.errors import InvalidModelError
from amp_pass.ranges import check_and_convert, constant_array, convert_clean
from amp_pass.schema import Slots, accepts, low_slots
from amp_pass.walk import is_control_flow, iter_nodes, node_subgraphs

LOW, CONST, DENYCAT, NEUTRAL = "low", "const", "deny", "neutral"
SOURCES = frozenset({"Constant", "ConstantOfShape", "Cast"})
#: Constants up to this many elements are range-checked together, before painting (see _prefetch_ranges).
SMALL_CONSTANT = 4096
#: Larger constants are checked and converted on this many threads when together they hold at least
#: LARGE_PARALLEL_ELEMENTS elements (see Painter._prefetch_large).
LARGE_WORKERS = min(4, os.cpu_count() or 1)
LARGE_PARALLEL_ELEMENTS = 1 << 20


@dataclass
class Painting:
    """The decisions of one painting run (consumed by cast insertion and the report)."""

    low: ir.DataType
    low_nodes: set[ir.Node] = field(default_factory=set)
    low_values: set[ir.Value] = field(default_factory=set)
    slots: dict[ir.Node, Slots] = field(default_factory=dict)
    reasons: dict[ir.Node, str] = field(default_factory=dict)
    classes: dict[ir.Node, str | None] = field(default_factory=dict)
    float_nodes: set[ir.Node] = field(default_factory=set)
    converted: dict[ir.Value, np.ndarray] = field(default_factory=dict)  # constants already rounded to low
    iterations: int = 0

    def is_low_value(self, value: ir.Value) -> bool:
        """Whether ``value`` carries the low dtype after conversion."""
        return value in self.low_values or value.dtype is self.low


def _is_constant(value: ir.Value) -> bool:
    if value.is_initializer() and not value.is_graph_input():
        return True
    node = value.producer()
    return node is not None and node.op_type in ("Constant", "ConstantOfShape") and node.domain in ("", "ai.onnx")


class Painter:
    """Runs the painting algorithm on one model graph with a resolved policy."""

    def __init__(self, graph: ir.Graph, policy: pol.Policy, opset: int, low: ir.DataType,
                 keep_io_types: bool) -> None:
        self.graph, self.policy, self.opset, self.low = graph, policy, opset, low
        self.keep_io_types = keep_io_types
        self.p = Painting(low=low)
        self.tainted: set[ir.Node] = set()
        self.blocked: set[ir.Node] = set()
        self._range_cache: dict[ir.Value, str | None] = {}
        self._static: dict[ir.Value, tuple[str | None, ir.Node | None]] = {}
        self._nodes = list(iter_nodes(graph))  # structure is fixed while painting
        self._subs = {n: node_subgraphs(n) for n in self._nodes if is_control_flow(n)}
        self._fp32_carried: set[ir.Value] = set()  # Loop/Scan body state inputs starting out of range

    # ------------------------------------------------------------------ static analysis
    def _range(self, value: ir.Value) -> str | None:
        if value not in self._range_cache:
            arr = constant_array(value) if _is_constant(value) else None
            problem, converted = (None, None) if arr is None else \
                check_and_convert(arr, self.low, f"constant {value.name!r}")
            self._range_cache[value] = problem
            if converted is not None:
                self.p.converted[value] = converted
        return self._range_cache[value]

    def _prefetch_ranges(self) -> None:
        """Range-check the small constant inputs of all nodes at once (``ranges.convert_clean``); the
        rest (large tensors, and any small one that is not clean) are checked one by one when needed.
        Same results as checking each on demand; an unreadable tensor is left to that on-demand check."""
        small: dict[ir.Value, np.ndarray] = {}
        for node in self._nodes:
            if node in self._subs:
                continue
            for v in node.inputs:
                if v is None or v in small or v.dtype is not ir.DataType.FLOAT or not _is_constant(v):
                    continue
                tensor = v.const_value
                if tensor is not None and tensor.size > SMALL_CONSTANT:
                    continue  # not read here (reading a tensor proto's data copies it)
                try:
                    arr = constant_array(v)
                except InvalidModelError:
                    continue
                if arr is not None and arr.dtype == np.float32 and 0 < arr.size <= SMALL_CONSTANT:
                    small[v] = arr
        for v, converted in zip(small, convert_clean(list(small.values()), self.low), strict=True):
            if converted is not None:
                self._range_cache[v] = None
                self.p.converted[v] = converted

    def _prefetch_large(self, pending: list[tuple[ir.Node, Slots, str, str]]) -> None:
        """Range-check and convert, on ``LARGE_WORKERS`` threads, the large constants that the range
        loop of ``_classify`` reads (the slot inputs of ``pending``), so that its ``_range`` calls find
        them done.  numpy releases the GIL in the reductions and the conversion, so on a model whose
        weights dominate (light_resnet50: 25M weights) this runs about twice as fast on two cores.
        Same results as checking each on demand (``check_and_convert`` is a pure function of the
        array); a tensor that cannot be read is left to that on-demand check, which raises in order."""
        todo: dict[ir.Value, None] = {}
        total = 0
        for node, slots, *_ in pending:
            for i in slots.inputs:
                v = node.inputs[i]
                if v is None or v in todo or v in self._range_cache or v.dtype is not ir.DataType.FLOAT \
                        or not _is_constant(v) or (tensor := v.const_value) is None or tensor.size <= SMALL_CONSTANT:
                    continue
                todo[v] = None
                total += tensor.size
        if len(todo) < 2 or total < LARGE_PARALLEL_ELEMENTS or LARGE_WORKERS < 2:
            return  # one tensor, or too little work to pay for the threads: on demand

        def check(v: ir.Value) -> tuple[ir.Value, str | None, np.ndarray | None] | None:
            try:
                arr = constant_array(v)
            except InvalidModelError:
                return None
            if arr is None:
                return v, None, None
            return (v, *check_and_convert(arr, self.low, f"constant {v.name!r}"))

        largest_first = sorted(todo, key=lambda v: -v.const_value.size)  # type: ignore[union-attr]
        with ThreadPoolExecutor(max_workers=LARGE_WORKERS) as pool:
            for done in pool.map(check, largest_first):
                if done is not None:
                    v, problem, converted = done
                    self._range_cache[v] = problem
                    if converted is not None:
                        self.p.converted[v] = converted

    def _classify(self) -> None:
        p = self.p
        self._prefetch_ranges()
        pending: list[tuple[ir.Node, Slots, str, str]] = []  # nodes whose verdict waits on their constants' ranges
        for node in self._nodes:
            if node in self._subs:
                continue
            cls, why = self.policy.classify(node.op_type, node.domain, node.name or "")
            p.classes[node] = cls
            if any(v.dtype is ir.DataType.FLOAT for v in node.outputs):
                p.float_nodes.add(node)
            slots, reason = low_slots(node, self.opset, self.low)
            if slots is None:
                p.reasons[node] = reason
                self.blocked.add(node)
                continue
            p.slots[node] = slots
            if node.op_type in SOURCES and node.domain in ("", "ai.onnx"):
                p.reasons[node] = "source: kept fp32 because a consumer needs fp32"
                continue
            if cls is None:
                p.reasons[node] = why
                self.blocked.add(node)
                continue
            if cls == pol.DENY:
                p.reasons[node] = why
                self.tainted.add(node)
                continue
            pending.append((node, slots, cls, why))
        self._prefetch_large(pending)
        for node, slots, cls, why in pending:
            for i in slots.inputs:
                v = node.inputs[i]
                if v is not None and (problem := self._range(v)):
                    p.reasons[node] = problem
                    # an out-of-range constant makes large outputs: fp32 propagates like DENY;
                    # an underflowing one only needs this node in fp32
                    (self.tainted if problem.startswith("range") else self.blocked).add(node)
                    break
            else:
                p.reasons[node] = why if cls == pol.ALLOW else f"{cls.upper()} op {node.op_type}: " \
                    "inputs are not low precision (follows its producers)"
        self._carried_constants()

    def _carried_state(self, node: ir.Node) -> list[tuple[int, ir.Value | None, ir.Value]]:
        """(k, initial value, body input) of each state a Loop or Scan carries (none for other nodes)."""
        body = self._subs[node][0] if self._subs.get(node) else None
        if body is None or node.op_type not in ("Loop", "Scan"):
            return []
        if node.op_type == "Loop":
            return [(k, node.inputs[2 + k], body.inputs[2 + k])
                    for k in range(len(node.inputs) - 2) if 2 + k < len(body.inputs)]
        n_state = len(node.inputs) - int(node.attributes["num_scan_inputs"].value)
        return [(k, node.inputs[k], body.inputs[k]) for k in range(min(n_state, len(body.inputs)))]

    def _carried_constants(self) -> None:
        """A Loop/Scan state whose initial value is a constant the low dtype cannot hold stays fp32, and the
        body nodes reading it are treated as readers of that constant: an overflowing start taints them
        (fp32 propagates like DENY), an underflowing one keeps them fp32 (the constant check of _classify,
        which sees only direct readers, would otherwise miss a value that enters a body as carried state)."""
        for node in self._subs:
            for k, initial, inner in self._carried_state(node):
                problem = self._range(initial) if initial is not None else None
                if not problem:
                    continue
                self._fp32_carried.add(inner)
                self.p.reasons[node] = f"{node.op_type} state {k} starts from an out-of-range {problem}"
                for user, _ in inner.uses():
                    if user in self.p.slots:
                        self.p.reasons[user] = f"reads {node.op_type} state {k}, which starts from {problem}"
                        (self.tainted if problem.startswith("range") else self.blocked).add(user)

    # ------------------------------------------------------------------ dynamic painting
    def category(self, value: ir.Value) -> str:
        """LOW, CONST, DENY or NEUTRAL: what the producer of ``value`` contributes to painting."""
        if value in self.p.low_values:
            return LOW
        if value in self._fp32_carried:
            return DENYCAT
        static = self._static.get(value)
        if static is None:  # what does not change while painting: dtypes, constness, producers
            static = self._static[value] = (LOW if value.dtype is self.low else CONST if _is_constant(value)
                                            else None, value.producer())
        if static[0] is not None:
            return static[0]
        if static[1] is not None and static[1] in self.tainted:
            return DENYCAT
        return NEUTRAL

    def _wants_low(self, node: ir.Node, index: int) -> bool:
        """Whether consumer ``node`` reads its input ``index`` in the low dtype (current painting)."""
        if node in self.p.low_nodes:
            return index in self.p.slots[node].inputs
        if node in self._subs and node.op_type in ("Loop", "Scan"):
            body = self._subs[node][0]  # node input i feeds body input i for Loop and Scan
            return index < len(body.inputs) and body.inputs[index] in self.p.low_values
        return False

    def _paint_node(self, node: ir.Node) -> bool:
        p = self.p
        if node in self.blocked or node in p.low_nodes or node not in p.slots:
            return False
        slots = p.slots[node]
        cls = p.classes[node]
        is_source = node.op_type in SOURCES and node.domain in ("", "ai.onnx")
        if is_source:
            paint = self._source_low(node, slots)
        elif node in self.tainted:
            return False
        elif cls == pol.ALLOW:
            paint = True
        else:
            cats = [self.category(node.inputs[i]) for i in slots.inputs if node.inputs[i] is not None]
            lows = cats.count(LOW)
            denies = cats.count(DENYCAT)
            nonconst = len(cats) - cats.count(CONST)
            rule = self.policy.rule
            if rule == "eager":
                paint = lows >= 1
            elif rule == "all_low":
                paint = lows >= 1 and lows == nonconst
            else:
                paint = lows >= 1 and denies == 0
            if not paint and denies and rule != "eager":
                self.tainted.add(node)
                p.reasons[node] = f"{cls.upper()} op {node.op_type}: fed by an fp32 (deny) path"
        if not paint:
            return False
        p.low_nodes.add(node)
        p.reasons.pop(node, None)
        for i in slots.outputs:
            p.low_values.add(node.outputs[i])
        return True

    def _source_low(self, node: ir.Node, slots: Slots) -> bool:
        if not slots.outputs or node.op_type == "Cast" and not accepts(node, self.opset, 0, self.low, output=True):
            return False
        out = node.outputs[0]
        if out.is_graph_output():
            return False
        uses = list(out.uses())
        if not uses:
            return False
        if node.op_type != "Cast" and (problem := self._range(out)):
            self.p.reasons[node] = problem
            return False
        return all(self._wants_low(user, idx) for user, idx in uses)

    def _paint_control_flow(self, node: ir.Node) -> bool:
        changed = False
        bodies = self._subs[node]
        p = self.p

        def mark(values: list[ir.Value]) -> None:
            nonlocal changed
            if not all(accepts(node, self.opset, 0, self.low, output=True) for _ in values[:1]):
                return  # the control-flow schema at this opset does not carry the low dtype
            for v in values:
                if v.dtype is ir.DataType.FLOAT and v not in p.low_values:
                    p.low_values.add(v)
                    changed = True

        if node.op_type == "If" and len(bodies) == 2:
            for k, out in enumerate(node.outputs):
                if all(k < len(b.outputs) and self.category(b.outputs[k]) == LOW for b in bodies):
                    mark([out])
        elif node.op_type == "Loop":
            body = bodies[0]
            n_carried = len(node.inputs) - 2
            for k, out in enumerate(node.outputs):
                if 1 + k >= len(body.outputs) or self.category(body.outputs[1 + k]) != LOW:
                    continue
                if k < n_carried and 2 + k < len(body.inputs) and body.inputs[2 + k] in self._fp32_carried:
                    continue
                mark([out] + ([body.inputs[2 + k]] if k < n_carried and 2 + k < len(body.inputs) else []))
        elif node.op_type == "Scan":
            body = bodies[0]
            n_state = len(node.inputs) - int(node.attributes["num_scan_inputs"].value)
            for k, out in enumerate(node.outputs):
                if k < len(body.outputs) and self.category(body.outputs[k]) == LOW:
                    if k < n_state and k < len(body.inputs) and body.inputs[k] in self._fp32_carried:
                        continue
                    mark([out] + ([body.inputs[k]] if k < n_state and k < len(body.inputs) else []))
            for j in range(n_state, min(len(node.inputs), len(body.inputs))):
                v = node.inputs[j]
                if v is not None and self.category(v) == LOW:
                    mark([body.inputs[j]])
        return changed

    def run(self, max_iterations: int = 100) -> Painting:
        """Paint to a fixpoint and return the decisions."""
        self._classify()
        if not self.keep_io_types:
            for v in self.graph.inputs:
                if v.dtype is ir.DataType.FLOAT and not v.is_initializer():
                    self.p.low_values.add(v)
        active = self._nodes
        for it in range(1, max_iterations + 1):
            # nodes that _paint_node would now return False for without doing anything are dropped
            # (same visiting order for the rest, so the same fixpoint with fewer calls)
            active = [n for n in active if n in self._subs or self._may_paint(n)]
            changed = False
            for node in active:
                if node in self._subs:
                    changed |= self._paint_control_flow(node)
                else:
                    changed |= self._paint_node(node)
            self.p.iterations = it
            if not changed:
                break
        return self.p

    def _may_paint(self, node: ir.Node) -> bool:
        """False when ``_paint_node(node)`` returns False with no effect now and in every later round."""
        if node in self.blocked or node in self.p.low_nodes or node not in self.p.slots:
            return False
        return node not in self.tainted or (node.op_type in SOURCES and node.domain in ("", "ai.onnx"))
