"""Faithful emulation agrees with the ONNX reference evaluator on real fp16/bf16 graphs."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from workers.measure.emulation import EmulatedSession, run_emulated
from workers.measure.emulation_rewrite import LOW_TYPES, emulate_model

F, H, B = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16
NP_LOW = {H: np.float16, B: ml_dtypes.bfloat16}


def _model(nodes, inputs, outputs, inits=(), opset=17, functions=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("local", 1)],
                          ir_version=9, functions=list(functions))
    onnx.checker.check_model(m, full_check=True)
    return m


def _low_values(graph: onnx.GraphProto) -> list[str]:
    """Low-typed values outside round trips (Cast-to-low outputs are the round trip's middle)."""
    middles = {n.output[0] for n in graph.node if n.op_type == "Cast" and n.attribute[0].i in LOW_TYPES}
    bad = [vi.name for vi in [*graph.input, *graph.output, *graph.value_info]
           if vi.type.tensor_type.elem_type in LOW_TYPES and vi.name not in middles]
    bad += [t.name for t in graph.initializer if t.data_type in LOW_TYPES]
    for n in graph.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR and a.t.data_type in LOW_TYPES:
                bad.append(f"{n.name}.{a.name}")
            if a.type == onnx.AttributeProto.GRAPH:
                bad += _low_values(a.g)
    return bad


def _block(low: int, rng: np.random.Generator) -> onnx.ModelProto:
    """fp32 in/out, low inside: MatMul, Add, LayerNorm, Softmax, Pow, Div, Sqrt, ReduceMean, Tanh."""
    lt = NP_LOW[low]
    w = (rng.standard_normal((16, 16)) * 0.5).astype(lt)
    b = rng.standard_normal(16).astype(lt)
    scale = (1 + 0.1 * rng.standard_normal(16)).astype(lt)
    nodes = [
        helper.make_node("Cast", ["x"], ["xl"], to=low),
        helper.make_node("MatMul", ["xl", "w"], ["mm"]),
        helper.make_node("Add", ["mm", "b"], ["h"]),
        helper.make_node("LayerNormalization", ["h", "scale", "b"], ["ln"], axis=-1, epsilon=1e-5),
        helper.make_node("Softmax", ["h"], ["sm"], axis=-1),
        helper.make_node("Pow", ["h", "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1], keepdims=1),
        helper.make_node("Sqrt", ["ms"], ["rms"]),
        helper.make_node("Div", ["h", "rms"], ["hn"]),
        helper.make_node("Tanh", ["hn"], ["t"]),
        helper.make_node("Mul", ["t", "sm"], ["ts"]),
        helper.make_node("Add", ["ts", "ln"], ["o"]),
        helper.make_node("Cast", ["o"], ["y"], to=F),
        helper.make_node("Cast", ["sq"], ["y_sq"], to=F),
    ]
    return _model(nodes, [helper.make_tensor_value_info("x", F, [4, 16])],
                  [helper.make_tensor_value_info("y", F, [4, 16]), helper.make_tensor_value_info("y_sq", F, [4, 16])],
                  [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b"),
                   numpy_helper.from_array(scale, "scale"), numpy_helper.from_array(np.array(2, lt), "two")],
                  opset=17)


@pytest.mark.parametrize("low", [H, B], ids=["fp16", "bf16"])
def test_emulation_agrees_with_reference_evaluator(low: int) -> None:
    rng = np.random.default_rng(1)
    m = _block(low, rng)
    emu = emulate_model(m)
    onnx.checker.check_model(emu, full_check=True)
    assert _low_values(emu.graph) == []
    ulp = 2.0 ** (-10 if low == H else -7)  # relative spacing of the low type
    for scale in (0.3, 1.0, 10.0, 40.0):
        x = (rng.standard_normal((4, 16)) * scale).astype(np.float32)
        got = run_emulated(m, {"x": x})
        want = ReferenceEvaluator(m).run(None, {"x": x})
        # y_sq comes from one elementwise op on rounded inputs: identical to the bit.
        np.testing.assert_array_equal(got["y_sq"], want[1])
        if scale <= 10.0:
            # y goes through reductions (accumulation order differs): within 2 ulps of its magnitude.
            # At scale 40 the reference evaluator's fp16 *accumulation* overflows in ReduceMean,
            # which fp32-accumulating GPU kernels (and the emulation) do not: not comparable there.
            np.testing.assert_allclose(got["y"], want[0], rtol=0, atol=2 * ulp * float(np.abs(want[0]).max()))


def test_emulation_exposes_fp16_overflow() -> None:
    m = _block(H, np.random.default_rng(2))
    x = np.full((4, 16), 300.0, np.float32)  # |h| reaches hundreds: h**2 overflows fp16 (> 65504)
    got = run_emulated(m, {"x": x})
    want = ReferenceEvaluator(m).run(None, {"x": x})
    assert np.isinf(want[1]).any()
    np.testing.assert_array_equal(np.isinf(got["y_sq"]), np.isinf(want[1]))


def test_low_precision_graph_inputs_are_rounded_on_entry_and_outputs_are_fp32() -> None:
    nodes = [helper.make_node("Mul", ["a", "k"], ["p"]), helper.make_node("Add", ["p", "a"], ["y"])]
    m = _model(nodes, [helper.make_tensor_value_info("a", B, [3])], [helper.make_tensor_value_info("y", B, [3])],
               [numpy_helper.from_array(np.array([3.0], ml_dtypes.bfloat16), "k")])
    emu = emulate_model(m)
    assert emu.graph.input[0].name == "a" and emu.graph.input[0].type.tensor_type.elem_type == F
    assert emu.graph.output[0].type.tensor_type.elem_type == F
    a32 = np.array([1.00390625, 257.0, 1e-3], np.float32)  # not representable in bf16
    a_low = a32.astype(ml_dtypes.bfloat16)
    want = ReferenceEvaluator(m).run(None, {"a": a_low})[0].astype(np.float32)
    np.testing.assert_array_equal(run_emulated(m, {"a": a32})["y"], want)
    np.testing.assert_array_equal(run_emulated(m, {"a": a_low})["y"], want)


def test_constant_constantofshape_eyelike_castlike_and_local_function() -> None:
    fn = helper.make_function("local", "Scale", ["u"], ["v"],
                              [helper.make_node("Constant", [], ["c"], value=helper.make_tensor("c", H, [], [0.3])),
                               helper.make_node("Mul", ["u", "c"], ["v"])],
                              opset_imports=[helper.make_opsetid("", 17)])
    nodes = [
        helper.make_node("Cast", ["x"], ["xl"], to=H),
        helper.make_node("Shape", ["xl"], ["shp"]),
        helper.make_node("ConstantOfShape", ["shp"], ["ones"], value=helper.make_tensor("v", H, [1], [0.7])),
        helper.make_node("EyeLike", ["x"], ["eye"], dtype=H),
        helper.make_node("Add", ["xl", "ones"], ["s1"]),
        helper.make_node("MatMul", ["s1", "eye"], ["s2"]),
        helper.make_node("Scale", ["s2"], ["s3"], domain="local"),
        helper.make_node("CastLike", ["x"], ["xl2"], ),
        helper.make_node("Sub", ["s3", "xl2"], ["d"]),
        helper.make_node("Cast", ["d"], ["y"], to=F),
    ]
    nodes[7].input.append("xl")
    m = _model(nodes, [helper.make_tensor_value_info("x", F, [5, 5])], [helper.make_tensor_value_info("y", F, [5, 5])],
               functions=[fn])
    emu = emulate_model(m)
    onnx.checker.check_model(emu, full_check=True)
    assert len(emu.functions) == 0 and _low_values(emu.graph) == []
    x = (np.random.default_rng(3).standard_normal((5, 5)) * 7).astype(np.float32)
    want = ReferenceEvaluator(m).run(None, {"x": x})[0]
    np.testing.assert_array_equal(run_emulated(m, {"x": x})["y"], want)


def _if_loop_model() -> onnx.ModelProto:
    """fp16 If whose branches use an outer fp16 value, and a Loop carrying an fp16 accumulator."""
    then_g = helper.make_graph([helper.make_node("Mul", ["xl", "xl"], ["t_out"])], "then", [],
                               [helper.make_tensor_value_info("t_out", H, [3])])
    else_g = helper.make_graph([helper.make_node("Neg", ["xl"], ["e_out"])], "else", [],
                               [helper.make_tensor_value_info("e_out", H, [3])])
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Mul", ["acc_in", "growth"], ["acc_mul"]),
         helper.make_node("Add", ["acc_mul", "sel"], ["acc_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", H, [3])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", H, [3])])
    nodes = [
        helper.make_node("Cast", ["x"], ["xl"], to=H),
        helper.make_node("ReduceSum", ["x"], ["sx"], keepdims=0),
        helper.make_node("Greater", ["sx", "zero"], ["pos"]),
        helper.make_node("If", ["pos"], ["sel"], then_branch=then_g, else_branch=else_g),
        helper.make_node("Loop", ["trip", "", "xl"], ["acc"], body=body),
        helper.make_node("Cast", ["acc"], ["y"], to=F),
    ]
    nodes[4].input[1] = "true"
    return _model(nodes, [helper.make_tensor_value_info("x", F, [3])], [helper.make_tensor_value_info("y", F, [3])],
                  [numpy_helper.from_array(np.array(0, np.float32), "zero"),
                   numpy_helper.from_array(np.array(12, np.int64), "trip"),
                   numpy_helper.from_array(np.array(True), "true"),
                   numpy_helper.from_array(np.array(1.37, np.float16), "growth")])


def test_if_and_loop_bodies_are_rounded_consistently() -> None:
    m = _if_loop_model()
    emu = emulate_model(m)
    onnx.checker.check_model(emu, full_check=True)
    assert _low_values(emu.graph) == []
    sess = EmulatedSession(m)
    for x in (np.array([1.1, 2.3, 0.7], np.float32), np.array([-3.3, 0.1, -1.9], np.float32)):
        xl = x.astype(np.float16)
        sel = xl * xl if x.sum() > 0 else -xl
        acc = xl
        for _ in range(12):  # each op rounds its result to fp16, as the GPU would
            acc = (acc.astype(np.float32) * np.float32(np.float16(1.37))).astype(np.float16)
            acc = (acc.astype(np.float32) + sel.astype(np.float32)).astype(np.float16)
        np.testing.assert_array_equal(sess.run({"x": x})["y"], acc.astype(np.float32))


def test_input_model_is_not_modified() -> None:
    m = _if_loop_model()
    before = m.SerializeToString()
    emulate_model(m)
    assert m.SerializeToString() == before


def test_scan_body_state_and_scan_inputs_are_rounded() -> None:
    body = helper.make_graph(
        [helper.make_node("Mul", ["s_in", "decay"], ["s_mul"]), helper.make_node("Add", ["s_mul", "u"], ["s_out"]),
         helper.make_node("Identity", ["s_out"], ["trace"])],
        "scan_body",
        [helper.make_tensor_value_info("s_in", H, [2]), helper.make_tensor_value_info("u", H, [2])],
        [helper.make_tensor_value_info("s_out", H, [2]), helper.make_tensor_value_info("trace", H, [2])])
    nodes = [helper.make_node("Cast", ["xs"], ["xs_l"], to=H), helper.make_node("Cast", ["s0"], ["s0_l"], to=H),
             helper.make_node("Scan", ["s0_l", "xs_l"], ["s_last", "tr"], body=body, num_scan_inputs=1),
             helper.make_node("Cast", ["tr"], ["y"], to=F)]
    m = _model(nodes, [helper.make_tensor_value_info("s0", F, [2]), helper.make_tensor_value_info("xs", F, [9, 2])],
               [helper.make_tensor_value_info("y", F, [9, 2])],
               [numpy_helper.from_array(np.array([0.9, 1.1], np.float16), "decay")])
    emu = emulate_model(m)
    onnx.checker.check_model(emu, full_check=True)
    assert _low_values(emu.graph) == []
    rng = np.random.default_rng(5)
    s0, xs = (rng.standard_normal(2) * 50).astype(np.float32), (rng.standard_normal((9, 2)) * 3).astype(np.float32)
    s, want = s0.astype(np.float16), []
    for u in xs.astype(np.float16):
        s = (s.astype(np.float32) * np.float16([0.9, 1.1]).astype(np.float32)).astype(np.float16)
        s = (s.astype(np.float32) + u.astype(np.float32)).astype(np.float16)
        want.append(s.astype(np.float32))
    np.testing.assert_array_equal(run_emulated(m, {"s0": s0, "xs": xs})["y"], np.stack(want))
