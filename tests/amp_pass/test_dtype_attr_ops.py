"""Ops whose output dtype is an attribute (RandomNormal, RandomUniform, the *Like forms, EyeLike): when a
user policy lowers them, the attribute says the low dtype, so the model stays valid (it was invalid: the
attribute kept FLOAT while the output was declared low)."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from amp_pass import ConversionOptions, convert_model
from tests.amp_pass.models import assert_valid

F = TensorProto.FLOAT
LOW = {"fp16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16}


def _generators(opset: int) -> onnx.ModelProto:
    n = helper.make_node
    x = helper.make_tensor_value_info("x", F, [4, 4])
    branch = helper.make_graph(  # a generator inside an If branch too
        [n("RandomUniform", [], ["ru"], shape=[4, 4], seed=2.0), n("Add", ["ru", "x"], ["b_out"])], "then",
        [], [helper.make_tensor_value_info("b_out", F, [4, 4])])
    other = helper.make_graph([n("Identity", ["x"], ["o_out"])], "else", [],
                              [helper.make_tensor_value_info("o_out", F, [4, 4])])
    nodes = [
        n("RandomNormal", [], ["rn"], shape=[4, 4], seed=1.0, scale=1e-3),
        n("RandomNormalLike", ["x"], ["rnl"], seed=3.0, scale=1e-3, dtype=F),
        n("RandomUniformLike", ["x"], ["rul"], seed=4.0),
        n("EyeLike", ["x"], ["eye"], dtype=F),
        n("Sum", ["rn", "rnl", "rul", "eye", "x"], ["s"]),
        n("ReduceMax", ["x"], ["m"], keepdims=0),
        n("Greater", ["m", "zero"], ["c"]),
        n("If", ["c"], ["i"], then_branch=branch, else_branch=other),
        n("Add", ["s", "i"], ["y"]),
    ]
    zero = helper.make_tensor("zero", F, [], [0.0])
    g = helper.make_graph(nodes, "gen", [x], [helper.make_tensor_value_info("y", F, [4, 4])], [zero])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    onnx.checker.check_model(m, full_check=True)
    return m


def _all_nodes(g: onnx.GraphProto) -> list[onnx.NodeProto]:
    out = []
    for node in g.node:
        out.append(node)
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                out += _all_nodes(a.g)
    return out


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_lowered_generators_name_the_low_dtype(tmp_path: Path, dtype: str) -> None:
    policy = tmp_path / "gen.toml"
    policy.write_text('base = "default"\n[ops]\nallow = ["RandomNormal", "RandomUniform", "RandomNormalLike", '
                      '"RandomUniformLike", "EyeLike", "Sum"]\n')
    options = ConversionOptions(dtype=dtype, policy=str(policy))  # type: ignore[arg-type]
    res = convert_model(_generators(17), options)
    onnx.checker.check_model(res.model, full_check=True)
    if dtype == "fp16":  # onnxruntime through the emulation (its CPU provider has no fp16 RandomNormal);
        assert_valid(res.model, "bf16")  # bf16 needs opset 22, for whose generators it has no kernel at all
    again = convert_model(res.model, options)
    assert again.model.SerializeToString() == res.model.SerializeToString()
    gens = {n.op_type: n for n in _all_nodes(res.model.graph)
            if n.op_type in ("RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "EyeLike")}
    assert set(gens) == {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "EyeLike"}
    dtypes = {op: next((a.i for a in n.attribute if a.name == "dtype"), None) for op, n in gens.items()}
    # every lowered generator names the low type, RandomUniformLike too (it had no attribute: its output
    # followed its input, which is on another type variable and stays fp32)
    assert dtypes == dict.fromkeys(dtypes, LOW[dtype])
    assert res.report.nodes_low >= 5
