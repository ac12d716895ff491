"""Writing back the IR read by ``amp_pass.protoio.read_model`` (see that module for the design).

Guarantees: the source protos are never modified; a graph, node or value declaration the pass did not
change is its source proto, copied by protobuf; changed and new ones are serialised (``onnx_ir.serde``
for new nodes and tensors); what is written has the same nodes, attributes, initializers, graph
inputs/outputs and value types as ``onnx_ir.serde.serialize_model`` of the same IR.
"""

from __future__ import annotations

import operator
from typing import Any

import onnx
import onnx_ir as ir
from onnx import AttributeProto

from amp_pass.protoio import GraphRecord, Origins
from amp_pass.tensor_data import SIZE_CHECK_BYTES, check_raw_size, raw_bytes_needed
from amp_pass.walk import node_subgraphs

_GRAPH, _GRAPHS = AttributeProto.GRAPH, AttributeProto.GRAPHS


class _Writer:
    """Writes an IR read by ``_Reader``: a part whose record says it is unchanged is its proto, copied."""

    def __init__(self, origins: Origins) -> None:
        self.o = origins
        # values whose name or type differs from their declaration as read
        self.renamed: set[ir.Value] = set()
        self.retyped: set[ir.Value] = set()
        for v, rec in origins.infos.items():
            if v.name != rec.name:
                self.renamed.add(v)
            if v.type is not rec.type or v.dtype is not rec.dtype:
                self.retyped.add(v)
        self.changed = self.renamed | self.retyped
        self._clean: dict[ir.Graph, bool] = {}

    # ---------------------------------------------------------------- what changed
    def node_clean(self, node: ir.Node) -> bool:
        """Whether ``node``'s proto as read still describes it (nested graphs included)."""
        rec = self.o.nodes.get(node)
        if rec is None or node.inputs != rec.inputs or node.outputs != rec.outputs:
            return False
        if self.renamed and not (self.renamed.isdisjoint(node.inputs) and self.renamed.isdisjoint(node.outputs)):
            return False
        attrs = _attr_values(node)
        if len(attrs) != len(rec.attrs) or not all(map(operator.is_, attrs, rec.attrs)):
            return False
        return not rec.has_graph or all(self.graph_clean(sub) for sub in node_subgraphs(node))

    def graph_clean(self, g: ir.Graph) -> bool:
        """Whether ``g``'s proto as read still describes it (nodes, values, types, nested graphs)."""
        found = self._clean.get(g)
        if found is not None:
            return found
        rec = self.o.graphs.get(g)
        changed = self.changed
        clean = rec is not None and rec.reusable and len(g) == rec.n_nodes and tuple(g.inputs) == rec.inputs and \
            tuple(g.outputs) == rec.outputs and tuple(g.initializers.values()) == rec.initializers and \
            changed.isdisjoint(g.inputs) and changed.isdisjoint(g.outputs) and \
            all(self.o.tensors.get(v, (None, None))[1] is v.const_value for v in rec.initializers)
        if clean:
            for node in g:
                if not (self.node_clean(node) and changed.isdisjoint(node.outputs)):
                    clean = False
                    break
        self._clean[g] = clean
        return clean

    # ---------------------------------------------------------------- writing
    def info(self, v: ir.Value, container: Any, donor: ir.Value | ir.TensorProtocol | None = None) -> None:
        rec = self.o.infos.get(v)
        if rec is not None:
            if v not in self.changed:
                container.append(rec.info)
                return
            p = container.add()
            p.CopyFrom(rec.info)
            p.name = v.name or ""
            self._set_type(p, v)
            return
        if v.type is None and v.shape is None:
            if v.is_graph_input() or v.is_graph_output():
                container.add().name = v.name or ""
            return
        p = container.add()
        if v.shape is not None or donor is None:
            ir.serde.serialize_value_into(p, v)
            return
        p.name = v.name or ""
        if isinstance(donor, ir.Value):
            src = self.o.infos.get(donor)
            if src is not None and src.info.type.HasField("tensor_type") and \
                    src.info.type.tensor_type.HasField("shape"):
                p.type.tensor_type.shape.CopyFrom(src.info.type.tensor_type.shape)
        else:
            shape = p.type.tensor_type.shape
            for d in donor.shape:
                shape.dim.add().dim_value = int(d)
        self._set_type(p, v)

    @staticmethod
    def _set_type(p: onnx.ValueInfoProto, v: ir.Value) -> None:
        t = v.type
        if isinstance(t, ir.TensorType):
            p.type.tensor_type.elem_type = int(t.dtype)
        elif t is None:
            p.ClearField("type")
        else:
            shape = p.type.tensor_type.shape if p.type.HasField("tensor_type") else None
            p.ClearField("type")
            ir.serde.serialize_type_into(p.type, t)
            if shape is not None and p.type.HasField("tensor_type"):
                p.type.tensor_type.shape.CopyFrom(shape)

    def _donor(self, v: ir.Value) -> ir.Value | ir.TensorProtocol | None:
        """Where a new value's shape comes from: the input of the Cast producing it, or the tensor of
        the Constant producing it."""
        node = v.producer()
        if node is None or node in self.o.nodes or node.domain not in ("", "ai.onnx"):
            return None
        if node.op_type == "Cast" and node.inputs and node.inputs[0] is not None:
            return node.inputs[0]
        attr = node.attributes.get("value") if node.op_type == "Constant" else None
        if attr is not None and attr.type is ir.AttributeType.TENSOR:
            return attr.value
        return None

    def _size_unread(self, g: ir.Graph) -> None:
        """Apply the checker's data-size rule to the large initializers of ``g`` written back as read,
        whose data the pass never read (``tensor_data``; smaller ones were sized up front)."""
        for v in g.initializers.values():
            found = self.o.tensors.get(v)
            if found is None or v.const_value is not found[1] or getattr(found[1], "data_read", True):
                continue
            t = found[0]
            need = raw_bytes_needed(t)
            if need is not None and need > SIZE_CHECK_BYTES and t.HasField("raw_data"):
                check_raw_size(t, "initializer", need)

    def graph(self, g: ir.Graph, dst: onnx.GraphProto) -> None:
        rec = self.o.graphs.get(g)
        self._size_unread(g)
        if rec is not None and self.graph_clean(g):
            dst.CopyFrom(rec.proto)
            return
        if g.name:
            dst.name = g.name
        if rec is not None:
            if rec.proto.doc_string:
                dst.doc_string = rec.proto.doc_string
            dst.metadata_props.extend(rec.proto.metadata_props)
        for v in g.inputs:
            self.info(v, dst.input)
        for name, v in g.initializers.items():
            found = self.o.tensors.get(v)
            if found is not None and v.const_value is found[1] and found[0].name == name:
                dst.initializer.append(found[0])
            elif v.const_value is not None:
                v.const_value.name = name
                ir.serde.serialize_tensor_into(dst.initializer.add(), v.const_value)
        value_info, nodes = dst.value_info, dst.node
        infos, changed, records = self.o.infos, self.changed, self.o.nodes
        opaque = rec.opaque if rec is not None else ()
        k = 0
        for node in g:
            if opaque:  # nodes left out of the IR go back before the first node read after them
                found = records.get(node)
                if found is not None and found.index >= 0:
                    while k < len(opaque) and opaque[k][0] < found.index:
                        self._opaque(opaque[k][1], rec, nodes, value_info)  # type: ignore[arg-type]
                        k += 1
            if self.node_clean(node):
                nodes.append(records[node].proto)
            else:
                self.node(node, nodes)
            for v in node.outputs:
                if v in infos and v not in changed:
                    if not v.is_graph_output():
                        value_info.append(infos[v].info)
                elif v.name and not v.is_graph_output():
                    self.info(v, value_info, self._donor(v))
        for _, proto in opaque[k:]:
            self._opaque(proto, rec, nodes, value_info)  # type: ignore[arg-type]
        for v in g.outputs:
            self.info(v, dst.output, self._donor(v))

    @staticmethod
    def _opaque(proto: onnx.NodeProto, rec: GraphRecord, nodes: Any, value_info: Any) -> None:
        """Write a node left out of the IR, and the declarations of its outputs (as read)."""
        nodes.append(proto)
        declared = rec.infos or {}
        for name in proto.output:
            info = declared.get(name)
            if info is not None:
                value_info.append(info)

    def node(self, node: ir.Node, container: Any) -> None:
        rec = self.o.nodes.get(node)
        if rec is None:
            ir.serde.serialize_node_into(container.add(), node)
            return
        src = rec.proto
        p = container.add()
        if rec.has_graph:  # everything but attributes (nested graphs are written below)
            for name in ("op_type", "domain", "name", "overload", "doc_string"):
                if getattr(src, name):
                    setattr(p, name, getattr(src, name))
            p.metadata_props.extend(src.metadata_props)
            for fd, value in src.ListFields():  # fields added by later ONNX versions (device configurations)
                if fd.name in _NODE_FIELDS_WRITTEN:
                    continue
                if fd.is_repeated:
                    getattr(p, fd.name).extend(value)
                elif fd.message_type is not None:
                    getattr(p, fd.name).CopyFrom(value)
                else:
                    setattr(p, fd.name, value)
        else:
            p.CopyFrom(src)
            del p.input[:], p.output[:], p.attribute[:]
        p.input.extend(v.name if v is not None else "" for v in node.inputs)
        p.output.extend(v.name or "" for v in node.outputs)
        by_name = {a.name: a for a in src.attribute}
        for a in node.attributes.values():
            if a.type is ir.AttributeType.GRAPH:
                pa = p.attribute.add()
                pa.name, pa.type = a.name, _GRAPH
                self.graph(a.value, pa.g)
            elif a.type is ir.AttributeType.GRAPHS:
                pa = p.attribute.add()
                pa.name, pa.type = a.name, _GRAPHS
                for sub in a.value:
                    self.graph(sub, pa.graphs.add())
            elif any(a is b for b in rec.attrs):
                p.attribute.append(by_name[a.name])
            else:
                ir.serde.serialize_attribute_into(p.attribute.add(), a)


_NODE_FIELDS_WRITTEN = frozenset({"op_type", "domain", "name", "overload", "doc_string", "metadata_props", "input",
                                   "output", "attribute"})


def _attr_values(node: ir.Node) -> tuple[ir.Attr, ...]:
    attrs = node.attributes
    return tuple(getattr(attrs, "data", attrs).values())  # onnx-ir's Attributes is a UserDict: skip its wrappers


def write_model(model: ir.Model, origins: Origins) -> onnx.ModelProto:
    """The ModelProto of ``model`` (read by ``read_model`` with ``origins``, then changed by the pass)."""
    src = origins.model
    out = onnx.ModelProto()
    if src is not None:
        for name in ("ir_version", "producer_name", "producer_version", "domain", "model_version", "doc_string"):
            if getattr(src, name):
                setattr(out, name, getattr(src, name))
        out.metadata_props.extend(src.metadata_props)
    else:
        out.ir_version = model.ir_version
    for domain, version in model.opset_imports.items():
        out.opset_import.add(domain=domain, version=version)
    _Writer(origins).graph(model.graph, out.graph)
    return out
