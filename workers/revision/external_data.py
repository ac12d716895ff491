"""External data of a converted model: the pass may not name a file for the worker to read.

The worker loads the converted model from bytes, so onnxruntime and onnx would resolve an initializer's
external-data ``location`` against the worker's working directory (a relative ``../secret``, an absolute path,
a symlink): the pass could make the trusted worker read a file for it and see its bytes come back as a metric.
Only the model file itself is copied out of the sandbox, so no external data can lie inside the job's output
directory: :func:`external_locations` lists every tensor that names one, and the job refuses the model as a
``convert_error`` naming them before anything loads or runs it.
"""

from __future__ import annotations

from collections.abc import Iterator

import onnx


def _graph_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        yield from _node_tensors(node)


def _node_tensors(node: onnx.NodeProto) -> Iterator[onnx.TensorProto]:
    for attr in node.attribute:
        if attr.HasField("t"):
            yield attr.t
        yield from attr.tensors
        if attr.HasField("sparse_tensor"):
            yield attr.sparse_tensor.values
            yield attr.sparse_tensor.indices
        for sparse in attr.sparse_tensors:
            yield sparse.values
            yield sparse.indices
        if attr.HasField("g"):
            yield from _graph_tensors(attr.g)
        for g in attr.graphs:
            yield from _graph_tensors(g)


def external_locations(model: onnx.ModelProto) -> list[str]:
    """``name -> location`` lines of every tensor of ``model`` (graphs, subgraphs, functions, attributes)
    stored as external data; empty when all data is inside the model."""
    tensors = list(_graph_tensors(model.graph))
    for fn in model.functions:
        for node in fn.node:
            tensors.extend(_node_tensors(node))
    out = []
    for t in tensors:
        if t.data_location == onnx.TensorProto.EXTERNAL or len(t.external_data):
            where = next((e.value for e in t.external_data if e.key == "location"), "")
            out.append(f"{t.name or '?'} -> {where!r}")
    return out
