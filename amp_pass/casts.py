"""Cast insertion: apply a painting to the graph.

Guarantees: every value's declared dtype matches its producer; every consumer reads the dtype it
was painted for; one Cast per (value, dtype, scope) shared by all consumers in that scope, placed in
the consumer's graph (right after the producer when it lives there, else at the top of the scope);
casts of initializers and Constant values are folded into a converted copy; main-graph output names
are preserved; every new name is unique in the model.
"""

from __future__ import annotations

import onnx_ir as ir

from amp_pass.paint import Painting
from amp_pass.ranges import constant_array, to_low
from amp_pass.schema import accepts
from amp_pass.walk import NameGen, graph_list, is_control_flow, node_subgraphs

SUFFIX = {ir.DataType.FLOAT16: "fp16", ir.DataType.BFLOAT16: "bf16", ir.DataType.FLOAT: "fp32"}


#: Ops whose output dtype is an attribute (``dtype``): a low node among them has the attribute rewritten.
DTYPE_ATTR_OPS = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "EyeLike"})
#: Low nodes that ``_retarget`` rewrites so they produce the low dtype themselves.
RETARGETED = frozenset({"Cast", "Constant", "ConstantOfShape"}) | DTYPE_ATTR_OPS


def _shape(value: ir.Value) -> ir.Shape | None:
    return value.shape.copy() if value.shape is not None else None


class CastInserter:
    """Rewrites the graph after painting; counts the casts it inserts."""

    def __init__(self, graph: ir.Graph, painting: Painting, opset: int, keep_io_types: bool,
                 graphs: list[ir.Graph] | None = None, reserved: frozenset[str] | set[str] = frozenset()) -> None:
        self.graph, self.p, self.opset, self.keep_io = graph, painting, opset, keep_io_types
        self.low = painting.low
        self.graphs = graphs if graphs is not None else graph_list(graph)  # fixed: only nodes change
        self.names = NameGen(graph, self.graphs, reserved)
        self.orig: dict[ir.Value, ir.DataType | None] = {}
        self.cache: dict[tuple[ir.Value, ir.DataType, ir.Graph], ir.Value] = {}
        self.casts_inserted = 0
        self.constants_folded = 0

    # ------------------------------------------------------------------ what each side wants
    def produced(self, value: ir.Value) -> ir.DataType | None:
        return self.low if value in self.p.low_values else self.orig.get(value, value.dtype)

    def wanted(self, node: ir.Node, index: int, value: ir.Value) -> ir.DataType | None:
        orig = self.orig.get(value, value.dtype)
        if node in self._control_flow:
            if node.op_type in ("Loop", "Scan"):
                body = node_subgraphs(node)[0]
                if index < len(body.inputs) and body.inputs[index] in self.p.low_values:
                    return self.low
            return orig
        if node in self.p.low_nodes and index in self.p.slots[node].inputs:
            return self.low
        slots = self.p.slots.get(node)
        have = self.produced(value)
        if have is not None and have is not orig and slots is not None and index in slots.free_inputs \
                and accepts(node, self.opset, index, have):
            return have
        if have is not None and have is not orig and node.op_type == "Cast" and index == 0:
            return have  # Cast reads any dtype
        return orig

    def wanted_output(self, graph: ir.Graph, k: int, value: ir.Value) -> ir.DataType | None:
        owner = self._owner.get(graph)
        if owner is None:  # main graph
            return self.orig.get(value, value.dtype) if self.keep_io else self.produced(value)
        node, pos = owner
        if node.op_type == "If":
            target = node.outputs[k] if k < len(node.outputs) else None
        elif node.op_type == "Loop":
            target = node_subgraphs(node)[0].inputs[k + 1] if 1 <= k < len(node.inputs) - 1 else (
                node.outputs[k - 1] if k >= 1 and k - 1 < len(node.outputs) else None)
        else:  # Scan
            target = node.outputs[k] if k < len(node.outputs) else None
        if target is not None and target in self.p.low_values:
            return self.low
        return self.orig.get(value, value.dtype)

    # ------------------------------------------------------------------ building casts
    def _fold_constant(self, value: ir.Value, dtype: ir.DataType) -> ir.Value | None:
        if dtype not in (ir.DataType.FLOAT16, ir.DataType.BFLOAT16):
            return None
        low_arr = self.p.converted.get(value) if dtype is self.low else None
        if low_arr is None:
            arr = constant_array(value)
            if arr is None:
                return None
            low_arr = to_low(arr, dtype)
        owner = value.graph if value.is_initializer() else value.producer().graph  # type: ignore[union-attr]
        name = self.names.fresh(f"{value.name}_{SUFFIX[dtype]}")
        tensor = ir.Tensor(low_arr, name=name)
        if value.is_initializer():
            new = ir.Value(name=name, type=ir.TensorType(dtype), shape=_shape(value), const_value=tensor)
            owner.register_initializer(new)  # type: ignore[union-attr]
        else:
            node = ir.Node("", "Constant", [], attributes=[ir.AttrTensor("value", tensor)],
                           outputs=[ir.Value(name=name, type=ir.TensorType(dtype), shape=_shape(value))],
                           name=self.names.fresh(f"{name}_const"))
            owner.insert_after(value.producer(), node)  # type: ignore[union-attr, arg-type]
            new = node.outputs[0]
        self.constants_folded += 1
        return new

    def cast_of(self, value: ir.Value, dtype: ir.DataType, scope: ir.Graph) -> ir.Value:
        """The value ``value`` converted to ``dtype``, visible in ``scope`` (created once)."""
        producer = value.producer()
        const_home: ir.Graph | None = None
        if value.is_initializer() and not value.is_graph_input():
            const_home = value.graph
        elif producer is not None and producer.op_type in ("Constant", "ConstantOfShape") \
                and producer.domain in ("", "ai.onnx"):
            const_home = producer.graph  # type: ignore[assignment]
        if const_home is not None:
            key = (value, dtype, const_home)
            if key in self.cache:
                return self.cache[key]
            folded = self._fold_constant(value, dtype)
            if folded is not None:
                self.cache[key] = folded
                return folded
        key = (value, dtype, scope)
        if key in self.cache:
            return self.cache[key]
        name = self.names.fresh(f"{value.name or 'v'}_{SUFFIX[dtype]}")
        out = ir.Value(name=name, type=ir.TensorType(dtype), shape=_shape(value))
        node = ir.Node("", "Cast", [value], attributes=[ir.AttrInt64("to", int(dtype))], outputs=[out],
                       name=self.names.fresh(f"{name}_cast"))
        if producer is not None and producer.graph is scope:
            scope.insert_after(producer, node)
        elif len(scope) > 0:
            scope.insert_before(scope[0], node)
        else:
            scope.append(node)
        self.casts_inserted += 1
        self.cache[key] = out
        return out

    # ------------------------------------------------------------------ driver
    def run(self) -> None:
        """Retarget sources, set dtypes, insert casts at every mismatch, fix graph outputs."""
        graphs = self.graphs
        self._control_flow: set[ir.Node] = set()
        self._owner: dict[ir.Graph, tuple[ir.Node, int]] = {}
        for g in graphs:
            for node in g:
                subs = node_subgraphs(node)
                if subs:
                    for pos, sub in enumerate(subs):
                        self._owner[sub] = (node, pos)
                    if is_control_flow(node):
                        self._control_flow.add(node)
        # only painted values change dtype (below): every other value keeps its dtype, so ``orig`` of a
        # value not recorded here is its current dtype
        self.orig = {v: v.dtype for v in self.p.low_values}
        for node in list(self.p.low_nodes):
            if node.op_type in RETARGETED and node.domain in ("", "ai.onnx"):
                self._retarget(node)
        for v in self.p.low_values:
            v.dtype = self.low
        for g in graphs:
            for node in list(g):
                for i, v in enumerate(node.inputs):
                    if v is None:
                        continue
                    have, want = self.produced(v), self.wanted(node, i, v)
                    if have is not want and want is not None and have is not None:
                        node.replace_input_with(i, self.cast_of(v, want, g))
            for k, v in enumerate(list(g.outputs)):
                have, want = self.produced(v), self.wanted_output(g, k, v)
                if have is want or want is None or have is None:
                    continue
                self._fix_output(g, k, v, want)
        self._fold_initializers_in_place()

    def _fix_output(self, g: ir.Graph, k: int, v: ir.Value, want: ir.DataType) -> None:
        if g is self.graph:  # keep the public output name on the output
            public = v.name
            v.name = self.names.fresh(f"{public}_{SUFFIX[self.produced(v) or self.low]}")
            out = ir.Value(name=public, type=ir.TensorType(want), shape=_shape(v))
            node = ir.Node("", "Cast", [v], attributes=[ir.AttrInt64("to", int(want))], outputs=[out],
                           name=self.names.fresh(f"{public}_cast"))
            producer = v.producer()
            if producer is not None and producer.graph is g:
                g.insert_after(producer, node)
            else:
                g.append(node)
            self.casts_inserted += 1
        else:
            out = self.cast_of(v, want, g)
        g.outputs[k] = out

    def _retarget(self, node: ir.Node) -> None:
        """Make a low node whose output dtype an attribute names (or whose constant it holds) produce low."""
        if node.op_type == "Cast":
            node.attributes["to"] = ir.AttrInt64("to", int(self.low))
            return
        if node.op_type in DTYPE_ATTR_OPS:
            # RandomNormal/RandomUniform produce their ``dtype`` (float when absent); the *Like forms and
            # EyeLike produce it when given and their input's type otherwise, and that input is on another
            # type variable (never cast to low): a low output must be named by the attribute
            node.attributes["dtype"] = ir.AttrInt64("dtype", int(self.low))
            return
        attr = node.attributes.get("value")
        low_arr = self.p.converted.get(node.outputs[0])
        if low_arr is None:
            arr = constant_array(node.outputs[0])
            if arr is None:
                return
            low_arr = to_low(arr, self.low)
        name = attr.value.name if attr is not None and attr.type is ir.AttributeType.TENSOR else None
        node.attributes["value"] = ir.AttrTensor("value", ir.Tensor(low_arr, name=name))
        for key in ("value_float", "value_floats"):
            node.attributes.pop(key, None)

    def _fold_initializers_in_place(self) -> None:
        """An fp32 initializer whose every use now reads its low copy is replaced by that copy."""
        for g in self.graphs:
            for name, init in list(g.initializers.items()):
                if init.dtype is not ir.DataType.FLOAT or init.is_graph_input() or init.is_graph_output():
                    continue
                if init.uses():
                    continue
                g.initializers.pop(name)
