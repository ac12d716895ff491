"""Lean protobuf <-> onnx-ir bridge for the pass: read a typed model into onnx-ir, write the pass's changes
back into (copies of) the protobuf it was read from.

``onnx_ir.serde`` rebuilds every field of every node, value and shape and serialises all of it again;
on real models that round trip costs more than the pass.  The pass only reads op types, domains,
inputs/outputs, attributes, value dtypes, constant tensors and the graph structure, and only changes
node inputs/outputs, a few attributes (Cast ``to``, Constant ``value``), value dtypes and names, Cast /
Constant nodes and initializers.  So:

* ``read_model`` builds a complete onnx-ir model (values with uses, nodes with all attributes, nested
  graphs as first-class ``ir.Graph`` objects, initializers with lazy tensors) -- but without shapes
  unless asked, and it remembers, for each node, value, graph and initializer, the proto it came from.
* ``amp_pass.protowrite.write_model`` produces the output proto from the IR: every graph, node, value
  info and initializer the pass did not change is the original proto, copied by protobuf in C; changed
  or new ones are serialised (``onnx_ir.serde`` for new nodes and tensors).  Shapes of new values are
  taken from the value they were cast from (or the Constant's tensor), as ``onnx_ir.serde`` would have
  written them.

Guarantees: the source protos are never modified; the IR is the one ``onnx_ir.serde`` builds, minus
shapes when not asked for; what ``write_model`` writes has the same nodes, attributes, initializers,
graph inputs/outputs and value types as ``onnx_ir.serde.serialize_model`` of the same IR (value_info
entries that restate an initializer's type are not repeated); ``supported`` is False for models with
features the reader does not mirror (functions, sparse initializers, quantization annotations,
training info, device configurations): the caller then uses ``onnx_ir.serde``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

import onnx
import onnx_ir as ir
from onnx import AttributeProto

from amp_pass.walk import proto_subgraphs

_GRAPH, _GRAPHS = AttributeProto.GRAPH, AttributeProto.GRAPHS
#: Attribute types read here as ``onnx_ir.serde.deserialize_attribute`` reads them (minus its error wrapper);
#: strings that are not UTF-8, doc strings and references go through serde.
_SIMPLE = {
    AttributeProto.INT: lambda a: ir.AttrInt64(a.name, a.i),
    AttributeProto.FLOAT: lambda a: ir.AttrFloat32(a.name, a.f),
    AttributeProto.INTS: lambda a: ir.AttrInt64s(a.name, a.ints),
    AttributeProto.FLOATS: lambda a: ir.AttrFloat32s(a.name, a.floats),
    AttributeProto.TENSOR: lambda a: ir.AttrTensor(a.name, ir.serde.deserialize_tensor(a.t)),
}
_DTYPES = {int(d): d for d in ir.DataType}


class NodeRecord(NamedTuple):
    """A node as read: its proto, attribute objects, input and output values, whether it holds graphs."""

    proto: onnx.NodeProto
    attrs: tuple[ir.Attr, ...]
    inputs: tuple[ir.Value | None, ...]
    outputs: tuple[ir.Value, ...]
    has_graph: bool


class InfoRecord(NamedTuple):
    """A value's declaration as read: its ValueInfoProto, and the IR type object, name and dtype made of it."""

    info: onnx.ValueInfoProto
    type: object
    name: str
    dtype: ir.DataType | None


class GraphRecord(NamedTuple):
    """A graph as read: its proto, inputs, outputs, initializer values and node count."""

    proto: onnx.GraphProto
    inputs: tuple[ir.Value, ...]
    outputs: tuple[ir.Value, ...]
    initializers: tuple[ir.Value, ...]
    n_nodes: int
    reusable: bool  # False when the IR graph was not read from ``proto`` alone (skeleton stand-ins)


@dataclass
class Origins:
    """Where each IR object came from (filled by ``read_model``, read by ``write_model``)."""

    nodes: dict[ir.Node, NodeRecord] = field(default_factory=dict)
    graphs: dict[ir.Graph, GraphRecord] = field(default_factory=dict)
    infos: dict[ir.Value, InfoRecord] = field(default_factory=dict)
    tensors: dict[ir.Value, tuple[onnx.TensorProto, object]] = field(default_factory=dict)  # (proto, tensor read)
    model: onnx.ModelProto | None = None

    def adopt(self, node: ir.Node, proto: onnx.NodeProto) -> None:
        """Record ``node`` (built by the caller from ``proto``, without graph attributes) as read."""
        self.nodes[node] = NodeRecord(proto, tuple(node.attributes.values()), tuple(node.inputs),
                                      tuple(node.outputs), False)


def _type(tp: onnx.TypeProto) -> ir.TypeProtocol | None:
    if tp.HasField("tensor_type"):
        elem = tp.tensor_type.elem_type
        return ir.TensorType(_DTYPES[elem]) if elem else None
    return ir.serde.deserialize_type_proto_for_type(tp)


def supported(model: onnx.ModelProto) -> bool:
    """Whether ``read_model``/``write_model`` mirror every feature of ``model`` (else use onnx_ir.serde)."""
    return not (model.functions or model.training_info or getattr(model, "configuration", None) or
                _graph_features(model.graph))


def _graph_features(g: onnx.GraphProto) -> bool:
    if g.sparse_initializer or g.quantization_annotation:
        return True
    return any(_graph_features(sub) for n in g.node for sub in proto_subgraphs(n))


class _Reader:
    def __init__(self, origins: Origins, shapes: bool) -> None:
        self.o = origins
        self.shapes = shapes

    def value(self, info: onnx.ValueInfoProto | None, name: str) -> ir.Value:
        if info is None:
            return ir.Value(name=name)
        tp = info.type
        if tp.HasField("tensor_type"):
            elem = tp.tensor_type.elem_type
            dtype = _DTYPES[elem] if elem else None
            t: ir.TypeProtocol | None = ir.TensorType(dtype) if dtype is not None else None
        else:
            t = ir.serde.deserialize_type_proto_for_type(tp)
            dtype = t.dtype if t is not None else None
        shape = ir.serde.deserialize_type_proto_for_shape(tp) if self.shapes else None
        v = ir.Value(name=name, type=t, shape=shape)
        self.o.infos[v] = InfoRecord(info, t, name, dtype)
        return v

    def graph(self, gp: onnx.GraphProto, scopes: list[dict[str, ir.Value]],
              extra: Mapping[str, onnx.TensorProto] | None = None, stand_ins: frozenset[str] = frozenset()
              ) -> ir.Graph:
        infos = {i.name: i for i in gp.value_info}
        values: dict[str, ir.Value] = {}
        inputs: list[ir.Value] = []
        inits: list[ir.Value] = []
        for info in gp.input:
            v = self.value(info, info.name)
            values[info.name] = v
            if info.name not in stand_ins:
                inputs.append(v)
        for name, t in (extra or {}).items():
            v = values[name]
            self._attach(v, t)
            inits.append(v)
        for t in gp.initializer:
            v = values.get(t.name)
            if v is None:
                info = infos.get(t.name)
                v = self.value(info, t.name) if info is not None else \
                    ir.Value(name=t.name, type=ir.TensorType(_DTYPES[t.data_type]))
                if self.shapes and v.shape is None:
                    v.shape = ir.Shape(list(t.dims))
                values[t.name] = v
            self._attach(v, t)
            inits.append(v)
        for n in gp.node:
            for name in n.output:
                if name:
                    if name in values:
                        raise ValueError(f"output {name!r} of {n.op_type} node {n.name!r} is redeclared")
                    values[name] = self.value(infos.get(name), name)
        scopes.append(values)
        nodes = [self.node(n, scopes) for n in gp.node]
        outputs = []
        for info in gp.output:
            v = values.get(info.name)
            if v is None:
                v = self.value(info, info.name)
            elif v not in self.o.infos or self.o.infos[v][0] is not info:
                t = _type(info.type)  # a graph output's own declaration wins, as in onnx_ir.serde
                if t is not None:
                    v.type = t
                if self.shapes:
                    v.shape = ir.serde.deserialize_type_proto_for_shape(info.type)
                self.o.infos[v] = InfoRecord(info, v.type, info.name, v.dtype)
            outputs.append(v)
        scopes.pop()
        g = ir.Graph(inputs, outputs, nodes=nodes, initializers=inits, name=gp.name or None)
        self.o.graphs[g] = GraphRecord(gp, tuple(inputs), tuple(outputs), tuple(inits), len(nodes),
                                       not extra and not stand_ins)
        return g

    def _attach(self, v: ir.Value, t: onnx.TensorProto) -> None:
        tensor = ir.serde.deserialize_tensor(t)
        v.const_value = tensor
        self.o.tensors[v] = (t, tensor)

    def node(self, n: onnx.NodeProto, scopes: list[dict[str, ir.Value]]) -> ir.Node:
        current = scopes[-1]
        inputs: list[ir.Value | None] = []
        for name in n.input:
            v = current.get(name)
            if v is None:
                if not name:
                    inputs.append(None)
                    continue
                for scope in reversed(scopes):
                    v = scope.get(name)
                    if v is not None:
                        break
                else:
                    v = current[name] = ir.Value(name=name)  # undeclared (invalid model): as onnx_ir.serde
            inputs.append(v)
        outputs = [current[name] if name else ir.Value(name="") for name in n.output]
        attrs = []
        has_graph = False
        for a in n.attribute:
            t = a.type
            if t == _GRAPH and not a.ref_attr_name:
                attrs.append(ir.AttrGraph(a.name, self.graph(a.g, scopes)))
                has_graph = True
            elif t == _GRAPHS and not a.ref_attr_name:
                attrs.append(ir.AttrGraphs(a.name, [self.graph(s, scopes) for s in a.graphs]))
                has_graph = True
            elif t in _SIMPLE and not a.doc_string and not a.ref_attr_name:
                attrs.append(_SIMPLE[t](a))
            else:
                attrs.append(ir.serde.deserialize_attribute(a))
        node = ir.Node(n.domain, n.op_type, inputs, attrs, overload=n.overload, outputs=outputs, name=n.name)
        self.o.nodes[node] = NodeRecord(n, tuple(attrs), node.inputs, node.outputs, has_graph)
        return node


def read_model(model: onnx.ModelProto, initializers: Mapping[str, onnx.TensorProto] | None = None,
               stand_ins: frozenset[str] = frozenset(), shapes: bool = False) -> tuple[ir.Model, Origins]:
    """The onnx-ir model of ``model`` (call only when ``supported(model)``) and where its parts came from.

    ``initializers``: main-graph inputs holding these tensors (lazily, without a copy), registered as
    initializers in this order; those named in ``stand_ins`` (stand-ins of the weight-less skeleton of
    ``amp_pass.prepare``) are initializers only, no longer graph inputs.  ``shapes``: also read value
    shapes (the pass itself does not need them; calibration does).
    """
    origins = Origins(model=model)
    graph = _Reader(origins, shapes).graph(model.graph, [], initializers, stand_ins)
    graph.opset_imports.update({o.domain: o.version for o in model.opset_import})
    ir_model = ir.Model(graph, ir_version=model.ir_version)
    return ir_model, origins
