"""One synthetic graph per rule of the pass: subgraphs, pinned inputs, range safety, casts, functions."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T

from tests.amp_pass import graphs as G
from tests.amp_pass.models import emulated_cosines, proto_graphs, random_feeds

LOW = {"fp16": T.FLOAT16, "bf16": T.BFLOAT16}
COS = {"fp16": 0.999, "bf16": 0.99}




def _types(g: onnx.GraphProto) -> dict[str, int]:
    out = {v.name: v.type.tensor_type.elem_type for v in list(g.input) + list(g.output) + list(g.value_info)}
    out.update({t.name: t.data_type for t in g.initializer})
    return out


def _nodes(m: onnx.ModelProto) -> list[tuple[onnx.GraphProto, onnx.NodeProto]]:
    return [(g, n) for g in proto_graphs(m.graph) for n in g.node]


def _node(m: onnx.ModelProto, name: str) -> tuple[onnx.GraphProto, onnx.NodeProto]:
    found = [(g, n) for g, n in _nodes(m) if n.name == name]
    assert len(found) == 1, f"node {name}: {len(found)} found"
    return found[0]


def _input_type(m: onnx.ModelProto, node_name: str, index: int) -> int:
    """Element type of a node input, looking through casts' producers in every enclosing graph."""
    types: dict[str, int] = {}
    for g in proto_graphs(m.graph):
        types.update(_types(g))
        for n in g.node:
            if n.op_type == "Cast":
                types[n.output[0]] = next(a.i for a in n.attribute if a.name == "to")
            if n.op_type == "Constant":
                types[n.output[0]] = n.attribute[0].t.data_type
    _, node = _node(m, node_name)
    return types[node.input[index]]


def _accurate(fp32: onnx.ModelProto, converted: onnx.ModelProto, dtype: str) -> None:
    cos = emulated_cosines(fp32, converted, random_feeds(fp32))
    assert cos and all(c >= COS[dtype] for c in cos.values()), cos


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_loop_with_captured_weights(convert, dtype: str) -> None:
    m = G.loop_with_captured_weights()
    r = convert(m, dtype)
    out = r.model
    assert _input_type(out, "body_mm", 0) == LOW[dtype]
    assert _input_type(out, "body_mm", 1) == LOW[dtype]  # captured W read in low precision
    loop_g, loop = _node(out, "loop")
    body = loop.attribute[0].g
    # carried value keeps one dtype: body input, body output and the Loop output agree
    assert body.input[2].type.tensor_type.elem_type == body.output[1].type.tensor_type.elem_type == LOW[dtype]
    # the captured weight is folded into one low initializer in the main graph, no Cast inside the body
    assert not [n for n in body.node if n.op_type == "Cast"]
    assert [t for t in out.graph.initializer if t.data_type == LOW[dtype]]
    assert out.graph.output[0].type.tensor_type.elem_type == T.FLOAT  # keep_io_types
    _accurate(m, out, dtype)


@pytest.mark.parametrize("disagree", [False, True])
def test_if_inside_loop(convert, disagree: bool) -> None:
    m = G.if_inside_loop(disagree)
    r = convert(m, "fp16")
    g, node = _node(r.model, "body_if")
    then_g, else_g = (a.g for a in sorted(node.attribute, key=lambda a: a.name != "then_branch"))
    t_out = then_g.output[0].type.tensor_type.elem_type
    e_out = else_g.output[0].type.tensor_type.elem_type
    assert t_out == e_out, "If branches disagree on their output type"
    assert t_out == (T.FLOAT if disagree else T.FLOAT16)
    if disagree:  # the low MatMul branch casts back to fp32 inside its own branch
        back = [n for n in then_g.node if n.op_type == "Cast" and n.output[0] == then_g.output[0].name]
        assert len(back) == 1 and back[0].attribute[0].i == T.FLOAT
        assert any(k["node"] == "else_exp" and "DENY" in k["reason"] for k in r.report.to_dict()["kept_fp32"])
    _accurate(m, r.model, "fp16")


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_scan_state_keeps_one_dtype(convert, dtype: str) -> None:
    m = G.scan_model()
    r = convert(m, dtype)
    _, scan = _node(r.model, "scan")
    body = scan.attribute[0].g if scan.attribute[0].type == onnx.AttributeProto.GRAPH else \
        next(a.g for a in scan.attribute if a.name == "body")
    assert body.input[0].type.tensor_type.elem_type == body.output[0].type.tensor_type.elem_type
    assert _input_type(r.model, "scan_mm", 1) == LOW[dtype]
    assert [o.type.tensor_type.elem_type for o in r.model.graph.output] == [T.FLOAT, T.FLOAT]
    _accurate(m, r.model, dtype)


def test_pinned_inputs_keep_their_dtype(convert) -> None:
    m = G.pinned_inputs(15)
    r = convert(m, "fp16")
    out = r.model
    assert _input_type(out, "resize", 0) == T.FLOAT16
    assert _input_type(out, "resize", 1) == T.FLOAT  # roi
    assert _input_type(out, "resize", 2) == T.FLOAT  # scales is tensor(float) in the schema
    assert _input_type(out, "clip", 1) == _input_type(out, "clip", 2) == T.FLOAT16  # tied to the data input
    assert _input_type(out, "pad", 2) == T.FLOAT16  # Pad value matches its data
    assert _input_type(out, "bn", 0) == T.FLOAT16
    assert _input_type(out, "bn", 3) == _input_type(out, "bn", 4) == T.FLOAT  # BN-15 mean/var (T2)
    _accurate(m, out, "fp16")


def test_batchnorm_stats_tied_before_opset_15(convert) -> None:
    r = convert(G.pinned_inputs(13), "fp16")
    assert _input_type(r.model, "bn", 3) == _input_type(r.model, "bn", 4) == T.FLOAT16


def test_bf16_only_where_the_opset_allows_it(convert) -> None:
    r12 = convert(G.shared_input(opset=12), "bf16", target_opset="keep")  # "auto" would upgrade to 13
    kept = {k["node"]: k["reason"] for k in r12.report.to_dict()["kept_fp32"]}
    assert "schema" in kept["mm_a"] and "bfloat16" in kept["mm_a"]
    assert all(n.op_type != "Cast" for _, n in _nodes(r12.model))
    r13 = convert(G.shared_input(opset=13), "bf16")
    assert _input_type(r13.model, "mm_a", 0) == T.BFLOAT16
    _accurate(G.shared_input(opset=13), r13.model, "bf16")


def test_out_of_range_constants_stay_fp32(convert) -> None:
    m = G.out_of_range_constants()
    r = convert(m, "fp16")
    kept = {k["node"]: k["reason"] for k in r.report.to_dict()["kept_fp32"]}
    assert "65504" in kept["mul_big"] and "65504" in kept["bn_big_var"] and "65504" in kept["mul_up"]
    assert "flush to zero" in kept["conv_tiny"] and kept["conv_tiny"].startswith("underflow")
    assert _input_type(r.model, "conv", 0) == T.FLOAT16
    for t in r.model.graph.initializer:
        if t.data_type == T.FLOAT16:
            assert np.all(np.isfinite(onnx.numpy_helper.to_array(t)))
    _accurate(m, r.model, "fp16")


def test_existing_casts_are_retargeted_and_noops_removed(convert) -> None:
    m = G.existing_casts()
    r = convert(m, "fp16")
    _, cast_n = _node(r.model, "cast_n")
    assert cast_n.attribute[0].i == T.FLOAT16  # Cast(to=float) inside a low region retargeted
    assert not [n for _, n in _nodes(r.model) if n.name == "cast_noop"]  # no-op cast removed
    assert r.report.casts_removed == 1
    assert _input_type(r.model, "div", 1) == T.FLOAT16
    _accurate(m, r.model, "fp16")


def test_model_local_function_is_converted(convert) -> None:
    m = G.with_function()
    r = convert(m, "fp16")
    assert r.report.functions_inlined == 1
    mms = [n for _, n in _nodes(r.model) if n.op_type == "MatMul"]
    assert len(mms) == 2 and r.report.compute_low == 2
    _accurate(m, r.model, "fp16")


def test_one_cast_per_value_and_unique_names(convert) -> None:
    m = G.shared_input()
    r = convert(m, "fp16")
    casts_of_x = [n for _, n in _nodes(r.model) if n.op_type == "Cast" and n.input[0] == "X"]
    assert len(casts_of_x) == 1  # one Cast shared by the three MatMuls
    names = [o for _, n in _nodes(r.model) for o in n.output] + [t.name for t in r.model.graph.initializer]
    assert len(names) == len(set(names))
    node_names = [n.name for _, n in _nodes(r.model) if n.name]
    assert len(node_names) == len(set(node_names))


def test_keep_io_types_off_folds_low_precision_into_the_signature(convert) -> None:
    m = G.loop_with_captured_weights()
    r = convert(m, "fp16", keep_io_types=False)
    assert r.model.graph.input[0].type.tensor_type.elem_type == T.FLOAT16
    assert r.model.graph.output[0].type.tensor_type.elem_type == T.FLOAT16
    assert not [n for n in r.model.graph.node if n.op_type == "Cast"]
    _accurate(m, r.model, "fp16")


def test_captured_value_is_cast_inside_the_subgraph_scope(convert) -> None:
    """An fp32 outer value (a graph input) read by a low node in a body gets its Cast in that body."""
    from onnx import helper as h

    then_g = h.make_graph([h.make_node("MatMul", ["X", "X"], ["t"], name="then_mm")], "then_b", [],
                          [h.make_tensor_value_info("t", T.FLOAT, [4, 4])])
    else_g = h.make_graph([h.make_node("Relu", ["X"], ["e"], name="else_relu")], "else_b", [],
                          [h.make_tensor_value_info("e", T.FLOAT, [4, 4])])
    g = h.make_graph([h.make_node("If", ["C"], ["Y"], then_branch=then_g, else_branch=else_g, name="if")], "main",
                     [h.make_tensor_value_info("C", T.BOOL, []), h.make_tensor_value_info("X", T.FLOAT, [4, 4])],
                     [h.make_tensor_value_info("Y", T.FLOAT, [4, 4])])
    m = G.model(g)
    r = convert(m, "fp16")
    _, node = _node(r.model, "if")
    branches = {a.name: a.g for a in node.attribute}
    assert [n.op_type for n in branches["then_branch"].node].count("Cast") == 2  # X in, result out
    assert not [n for n in r.model.graph.node if n.op_type == "Cast"]
    feeds = {"C": np.array(True), "X": np.random.default_rng(0).uniform(-1, 1, (4, 4)).astype(np.float32)}
    from tests.amp_pass.models import cosine, run_fp32
    from workers.measure.emulation import run_emulated

    assert cosine(run_fp32(m, feeds)["Y"], run_emulated(r.model, feeds)["Y"]) >= 0.999


def test_ir3_model_weight_stays_an_input(convert) -> None:
    """IR 3 with keep_initializer_inputs: an initializer is also a graph input (a caller may feed it),
    so it is cast at run time, never folded into a new initializer (which IR 3 would require to be an
    input too).  (By default such weights are constants: tests/amp_pass/test_old_ir.py.)"""
    m = G.ir3_model()
    r = convert(m, "fp16", keep_initializer_inputs=True)
    out = r.model
    assert out.ir_version == 3
    assert [t.name for t in out.graph.initializer] == ["W"] and out.graph.initializer[0].data_type == T.FLOAT
    assert _input_type(out, "mm", 1) == T.FLOAT16
    _accurate(m, out, "fp16")


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_integer_paths_are_untouched(convert, dtype: str) -> None:
    """Integer shape arithmetic around and inside If/Loop bodies keeps its nodes and dtypes; the no-op
    int Cast is removed (its reader rewired), the float compute goes low, and new names avoid the names
    the int nodes use."""
    m = G.int_paths()
    r = convert(m, dtype)
    out = r.model
    assert _input_type(out, "final_mm", 0) == LOW[dtype] and _input_type(out, "body_mm", 1) == LOW[dtype]
    names = {n.name for g in proto_graphs(out.graph) for n in g.node}
    assert "cast_noop_i32" not in names
    assert _node(out, "int_neg")[1].input[0] == "shp32"
    for kept in ("gather_big", "int_sum", "int_cmp", "int_out", "then_int_add", "else_int_sub", "body_int_add",
                 "body_int_last", "big_int_const", "small_int_const"):
        assert kept in names, kept
    assert [o.type.tensor_type.elem_type for o in out.graph.output] == [T.FLOAT, T.INT64, T.INT64, T.INT32]
    values = [v for g in proto_graphs(out.graph) for v in list(g.value_info) + list(g.output)]
    assert len({v.name for v in values}) == len(values)
    assert "W_fp16" in {v.name for v in values}  # still the int Gather's output, not W's copy
    assert r.report.nodes_total == sum(1 for g in proto_graphs(m.graph) for _ in g.node)
    _accurate(m, out, dtype)
