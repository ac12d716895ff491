"""Two rules of the measured coverage (workers.measure.graph_facts) pinned: only default-domain ops count as compute
nodes (a ``com.microsoft`` MatMul or Attention is not the compute the coverage counts), and a compute node
is low precision only when **every** float input and output it has is the job's low type."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from workers.measure.graph_facts import count_graph

F, LOW = T.FLOAT, {"fp16": T.FLOAT16, "bf16": T.BFLOAT16}


def _model(nodes: list[onnx.NodeProto], types: dict[str, int], inputs: list[str], outputs: list[str]) -> \
        onnx.ModelProto:
    """A model whose every value's element type is declared (inputs, outputs and value_info)."""
    vi = [h.make_tensor_value_info(n, t, [2, 2]) for n, t in types.items() if n not in inputs + outputs]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info(n, types[n], [2, 2]) for n in inputs],
                     [h.make_tensor_value_info(n, types[n], [2, 2]) for n in outputs], value_info=vi)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)], ir_version=8)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_only_default_domain_ops_are_compute_nodes(dtype: str) -> None:
    lo = LOW[dtype]
    nodes = [h.make_node("MatMul", ["a", "b"], ["c"], name="mm"),
             h.make_node("MatMul", ["c", "b"], ["d"], name="ms_mm", domain="com.microsoft"),
             h.make_node("Attention", ["d", "b"], ["e"], name="ms_attn", domain="com.microsoft")]
    m = _model(nodes, {"a": lo, "b": lo, "c": lo, "d": F, "e": F}, ["a", "b"], ["e"])
    got = count_graph(m, None, dtype)
    assert (got.compute_nodes, got.compute_low) == (1, 1)  # the two com.microsoft nodes are not counted
    assert got.compute_by_op == {"MatMul": {"total": 1, "low": 1}}


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_compute_node_is_low_only_when_every_float_input_and_output_is(dtype: str) -> None:
    lo = LOW[dtype]
    nodes = [h.make_node("MatMul", ["a", "b"], ["c"], name="all_low"),      # low in, low out: low
             h.make_node("MatMul", ["a", "b"], ["d"], name="fp32_out"),     # low in, fp32 out: not low
             h.make_node("MatMul", ["a", "w"], ["e"], name="fp32_in"),      # one fp32 input: not low
             h.make_node("MatMul", ["w", "w"], ["f"], name="all_fp32")]     # fp32: not low
    m = _model(nodes, {"a": lo, "b": lo, "w": F, "c": lo, "d": F, "e": lo, "f": F}, ["a", "b", "w"],
               ["c", "d", "e", "f"])
    got = count_graph(m, None, dtype)
    assert (got.compute_nodes, got.compute_low) == (4, 1)
