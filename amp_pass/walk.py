"""Explicit scope walking over nested graphs (If/Loop/Scan bodies), pre-order, each graph once: on the
onnx-ir model, and (``proto_*``) on protobuf nodes and graphs."""

from __future__ import annotations

from collections.abc import Iterator

import onnx
import onnx_ir as ir

CONTROL_FLOW = frozenset({"If", "Loop", "Scan"})
#: Standard ops that hold graph attributes; other standard ops never do (skips attribute scans).
_GRAPH_HOLDERS = CONTROL_FLOW | {"SequenceMap"}


def node_subgraphs(node: ir.Node) -> list[ir.Graph]:
    """The graphs held by ``node``'s attributes, in attribute order."""
    found: list[ir.Graph] = []
    if (node.domain in ("", "ai.onnx") and node.op_type not in _GRAPH_HOLDERS) or not node.attributes:
        return found
    for attr in node.attributes.values():
        if attr.type is ir.AttributeType.GRAPH:
            found.append(attr.value)
        elif attr.type is ir.AttributeType.GRAPHS:
            found.extend(attr.value)
    return found


def proto_subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The graphs held by a protobuf node's attributes, in attribute order."""
    found: list[onnx.GraphProto] = []
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            found.append(attr.g)
        elif attr.type == onnx.AttributeProto.GRAPHS:
            found.extend(attr.graphs)
    return found


def iter_proto_nodes(graph: onnx.GraphProto | onnx.FunctionProto) -> Iterator[onnx.NodeProto]:
    """Every node of a protobuf graph (or function body) and of its nested subgraphs, outer node first."""
    for node in graph.node:
        yield node
        for sub in proto_subgraphs(node):
            yield from iter_proto_nodes(sub)


def iter_graphs(graph: ir.Graph) -> Iterator[ir.Graph]:
    """``graph`` then every nested subgraph, depth first, each exactly once."""
    yield graph
    for node in graph:
        for sub in node_subgraphs(node):
            yield from iter_graphs(sub)


def graph_list(graph: ir.Graph) -> list[ir.Graph]:
    """``list(iter_graphs(graph))``: the pass computes it once (the set of graphs never changes while
    it runs: it only adds and removes Cast/Constant nodes) instead of walking the model per step."""
    return list(iter_graphs(graph))


def iter_nodes(graph: ir.Graph) -> Iterator[ir.Node]:
    """Every node of ``graph`` and of its nested subgraphs (outer node before its bodies' nodes)."""
    for node in graph:
        yield node
        for sub in node_subgraphs(node):
            yield from iter_nodes(sub)


def is_control_flow(node: ir.Node) -> bool:
    """Whether ``node`` is an ONNX If, Loop or Scan."""
    return node.domain in ("", "ai.onnx") and node.op_type in CONTROL_FLOW and bool(node_subgraphs(node))


class NameGen:
    """Fresh names unique across the whole model (all graphs, values and nodes, and ``reserved``: names
    used outside the IR)."""

    def __init__(self, graph: ir.Graph, graphs: list[ir.Graph] | None = None,
                 reserved: frozenset[str] | set[str] = frozenset()) -> None:
        used: set[str | None] = set(reserved)
        for g in graphs if graphs is not None else iter_graphs(graph):
            used.update([v.name for v in g.inputs])
            used.update([v.name for v in g.outputs])
            used.update(g.initializers)
            for node in g:
                used.add(node.name)
                used.update([v.name for v in node.outputs])
                used.update([v.name for v in node.inputs if v is not None])
        used.discard(None)  # (and "" may be in the set: fresh() never returns it anyway)
        self._used: set[str] = used  # type: ignore[assignment]

    def fresh(self, base: str) -> str:
        """``base`` if unused, else ``base_1``, ``base_2``... (the returned name is then taken)."""
        name, i = base, 0
        while name in self._used:
            i += 1
            name = f"{base}_{i}"
        self._used.add(name)
        return name
