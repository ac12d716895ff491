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
  With ``skip_opaque``, nodes the pass can never change are left out of the IR (see ``opaque``).
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

import numpy as np
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
#: Tensor element types that are not floating point (uint8..uint64, bool, string).
_NON_FLOAT = frozenset({2, 3, 4, 5, 6, 7, 8, 9, 12, 13})
_GRAPH_HOLDERS = frozenset({"If", "Loop", "Scan", "SequenceMap"})


class NodeRecord(NamedTuple):
    """A node as read: its proto, attribute objects, input and output values, whether it holds graphs."""

    proto: onnx.NodeProto
    attrs: tuple[ir.Attr, ...]
    inputs: tuple[ir.Value | None, ...]
    outputs: tuple[ir.Value, ...]
    has_graph: bool
    index: int = -1  # position in its graph proto's node list (-1: not read from there)


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
    opaque: tuple[tuple[int, onnx.NodeProto], ...] = ()  # nodes left out of the IR, with their positions
    infos: Mapping[str, onnx.ValueInfoProto] | None = None  # value_info of their outputs (not graph outputs)


@dataclass
class Origins:
    """Where each IR object came from (filled by ``read_model``, read by ``write_model``)."""

    nodes: dict[ir.Node, NodeRecord] = field(default_factory=dict)
    graphs: dict[ir.Graph, GraphRecord] = field(default_factory=dict)
    infos: dict[ir.Value, InfoRecord] = field(default_factory=dict)
    tensors: dict[ir.Value, tuple[onnx.TensorProto, object]] = field(default_factory=dict)  # (proto, tensor read)
    model: onnx.ModelProto | None = None
    #: names (of nodes and values) defined by the nodes left out of the IR: new names must avoid them
    reserved: set[str] = field(default_factory=set)
    opaque_count: int = 0

    def adopt(self, node: ir.Node, proto: onnx.NodeProto) -> None:
        """Record ``node`` (built by the caller from ``proto``, without graph attributes) as read."""
        self.nodes[node] = NodeRecord(proto, tuple(node.attributes.values()), tuple(node.inputs),
                                      tuple(node.outputs), False)


class ReadTensor(ir.serde.TensorProtoTensor):
    """onnx-ir's lazy tensor over a TensorProto that also records whether its data was read:
    ``numpy()`` checks the data's size against the dims (too little raises), so ``protowrite`` sizes
    only the large tensors the pass never read."""

    __slots__ = ("data_read",)

    def __init__(self, proto: onnx.TensorProto) -> None:
        super().__init__(proto)
        self.data_read = False

    def numpy(self) -> np.ndarray:
        """The data as numpy (as ``TensorProtoTensor.numpy``); marks the tensor read."""
        array = super().numpy()
        self.data_read = True
        return array


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


class _Lazy:
    """A value defined by a node left out of the IR: made an ``ir.Value`` only if an IR node reads it."""

    __slots__ = ("info",)

    def __init__(self, info: onnx.ValueInfoProto | None) -> None:
        self.info = info


def _elem(info: onnx.ValueInfoProto | None) -> int:
    """The tensor element type ``info`` declares (0: unknown, or not a tensor)."""
    if info is None:
        return 0
    tp = info.type
    return tp.tensor_type.elem_type if tp.HasField("tensor_type") else 0


class _Reader:
    def __init__(self, origins: Origins, shapes: bool, skip_opaque: bool = False) -> None:
        self.o = origins
        self.shapes = shapes
        self.skip_opaque = skip_opaque
        self.cast_outputs: set[str] = set()  # names written by Cast nodes (read by IR nodes only)

    @staticmethod
    def _find(name: str, scopes: list[dict[str, ir.Value | _Lazy]]) -> tuple[dict, ir.Value | _Lazy] | None:
        """The innermost scope defining ``name``, and what it holds there."""
        for scope in reversed(scopes):
            v = scope.get(name)
            if v is not None:
                return scope, v
        return None

    def _dtype_code(self, name: str, scopes: list[dict[str, ir.Value | _Lazy]]) -> int:
        """The element type of the value named ``name`` in ``scopes`` (0: unknown or not a tensor)."""
        found = self._find(name, scopes)
        if found is None:
            return 0
        v = found[1]
        if v.__class__ is _Lazy:
            return _elem(v.info)  # type: ignore[union-attr]
        dtype = v.dtype  # type: ignore[union-attr]
        return int(dtype) if dtype is not None and isinstance(v.type, ir.TensorType) else 0  # type: ignore[union-attr]

    def opaque(self, n: onnx.NodeProto, scopes: list[dict[str, ir.Value | _Lazy]],
               declared: Mapping[str, onnx.ValueInfoProto]) -> bool:
        """Whether the pass can never change ``n``: every input and output is a tensor of a known,
        non-floating-point type, it holds no graph, it is not a Cast and it reads no Cast's output.
        Painting and cast insertion only change floating-point values;
        cast cleanup removes and bypasses Cast nodes only, and every reader of a Cast is in the IR.  So
        leaving such nodes out of the IR changes nothing the pass decides or writes, save possibly where
        the nodes it inserts go among them (always a valid order; see ``protowrite``)."""
        if n.op_type == "Cast" or n.op_type in _GRAPH_HOLDERS or not n.output:
            return False
        for name in n.output:
            if not name or _elem(declared.get(name)) not in _NON_FLOAT:
                return False
        for name in n.input:
            if name and (name in self.cast_outputs or self._dtype_code(name, scopes) not in _NON_FLOAT):
                return False
        for a in n.attribute:
            if a.type == _GRAPH or a.type == _GRAPHS:
                return False
        return True

    def _resolve(self, name: str, scopes: list[dict[str, ir.Value | _Lazy]]) -> ir.Value | None:
        """The IR value named ``name`` in ``scopes`` (made now if a node left out defines it)."""
        found = self._find(name, scopes)
        if found is None:
            return None
        scope, v = found
        if v.__class__ is _Lazy:
            v = scope[name] = self.value(v.info, name)  # type: ignore[union-attr]
        return v  # type: ignore[return-value]

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
        opaque: list[tuple[int, onnx.NodeProto]] = []
        kept: list[tuple[int, onnx.NodeProto]] = []
        if self.skip_opaque:
            declared = dict(infos)
            declared.update((i.name, i) for i in gp.output)
            scopes.append(values)  # (read by ``opaque``; the same dict the nodes are read with below)
            reserved = self.o.reserved
            for at, n in enumerate(gp.node):
                if self.opaque(n, scopes, declared):
                    self._declare(n, values, infos, lazy=True)
                    reserved.update(n.output)
                    if n.name:
                        reserved.add(n.name)
                    opaque.append((at, n))
                else:
                    self._declare(n, values, infos)
                    kept.append((at, n))
                    if n.op_type == "Cast":
                        self.cast_outputs.update(n.output)
            scopes.pop()
            self.o.opaque_count += len(opaque)
        else:
            for n in gp.node:
                self._declare(n, values, infos)
            kept = list(enumerate(gp.node))
        scopes.append(values)
        nodes = [self.node(n, scopes, at) for at, n in kept]
        outputs = []
        for info in gp.output:
            v = values.get(info.name)
            if v.__class__ is _Lazy:
                v = values[info.name] = self.value(v.info, info.name)  # type: ignore[union-attr]
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
        opaque_infos = None
        if opaque:  # what to write back for the outputs of the nodes left out (graph outputs are written apart)
            out_names = {i.name for i in gp.output}
            opaque_infos = {name: infos[name] for _, n in opaque for name in n.output
                            if name in infos and name not in out_names}
        self.o.graphs[g] = GraphRecord(gp, tuple(inputs), tuple(outputs), tuple(inits), len(nodes),
                                       not extra and not stand_ins, tuple(opaque), opaque_infos)
        return g

    def _declare(self, n: onnx.NodeProto, values: dict[str, ir.Value], infos: Mapping[str, onnx.ValueInfoProto],
                 lazy: bool = False) -> None:
        """Define ``n``'s outputs in ``values`` (``lazy``: as ``_Lazy``, for a node left out of the IR)."""
        for name in n.output:
            if name:
                if name in values:
                    raise ValueError(f"output {name!r} of {n.op_type} node {n.name!r} is redeclared")
                values[name] = _Lazy(infos.get(name)) if lazy else self.value(infos.get(name), name)  # type: ignore[assignment]

    def _attach(self, v: ir.Value, t: onnx.TensorProto) -> None:
        if t.data_location != onnx.TensorProto.EXTERNAL and t.data_type != onnx.TensorProto.STRING:
            tensor: ir.TensorProtocol = ReadTensor(t)  # what ir.serde.deserialize_tensor makes, plus data_read
        else:
            tensor = ir.serde.deserialize_tensor(t)
        v.const_value = tensor
        self.o.tensors[v] = (t, tensor)

    def node(self, n: onnx.NodeProto, scopes: list[dict[str, ir.Value]], index: int = -1) -> ir.Node:
        current = scopes[-1]
        inputs: list[ir.Value | None] = []
        for name in n.input:
            v = current.get(name)
            if v is None or v.__class__ is _Lazy:
                if not name:
                    inputs.append(None)
                    continue
                v = self._resolve(name, scopes)  # type: ignore[arg-type]
                if v is None:
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
        self.o.nodes[node] = NodeRecord(n, tuple(attrs), node.inputs, node.outputs, has_graph, index)
        return node


def read_model(model: onnx.ModelProto, initializers: Mapping[str, onnx.TensorProto] | None = None,
               stand_ins: frozenset[str] = frozenset(), shapes: bool = False, skip_opaque: bool = False
               ) -> tuple[ir.Model, Origins]:
    """The onnx-ir model of ``model`` (call only when ``supported(model)``) and where its parts came from.

    ``initializers``: main-graph inputs holding these tensors (lazily, without a copy), registered as
    initializers in this order; those named in ``stand_ins`` (stand-ins of the weight-less skeleton of
    ``amp_pass.prepare``) are initializers only, no longer graph inputs.  ``shapes``: also read value
    shapes (the pass itself does not need them; calibration does).  ``skip_opaque``: leave out of the IR
    the nodes the pass can never change (``_Reader.opaque``; their names are in ``Origins.reserved``):
    only for the pass itself, not for code that lists or numbers every node (calibration keys).
    """
    origins = Origins(model=model)
    graph = _Reader(origins, shapes, skip_opaque).graph(model.graph, [], initializers, stand_ins)
    graph.opset_imports.update({o.domain: o.version for o in model.opset_import})
    ir_model = ir.Model(graph, ir_version=model.ir_version)
    return ir_model, origins
