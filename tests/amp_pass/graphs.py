"""Small synthetic graphs, one per rule of the pass (built inline with onnx.helper)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

F = T.FLOAT


def _w(name: str, shape: tuple[int, ...], seed: int, scale: float = 0.5) -> onnx.TensorProto:
    rng = np.random.default_rng(seed)
    return nh.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def model(graph: onnx.GraphProto, opset: int = 17, functions: list[onnx.FunctionProto] | None = None
          ) -> onnx.ModelProto:
    """A model around ``graph`` at ``opset`` (IR version 8), checked by the ONNX checker."""
    m = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)], ir_version=8, functions=functions or [])
    onnx.checker.check_model(m, full_check=True)
    return m


def loop_with_captured_weights() -> onnx.ModelProto:
    """Loop whose body multiplies the carried state by an outer-scope weight W (captured)."""
    body = h.make_graph(
        [h.make_node("MatMul", ["h_in", "W"], ["mm"], name="body_mm"),
         h.make_node("Tanh", ["mm"], ["h_out"], name="body_tanh"),
         h.make_node("Identity", ["cond_in"], ["cond_out"], name="body_cond")],
        "loop_body",
        [h.make_tensor_value_info("i", T.INT64, []), h.make_tensor_value_info("cond_in", T.BOOL, []),
         h.make_tensor_value_info("h_in", F, [2, 4])],
        [h.make_tensor_value_info("cond_out", T.BOOL, []), h.make_tensor_value_info("h_out", F, [2, 4])])
    g = h.make_graph(
        [h.make_node("MatMul", ["X", "W"], ["x0"], name="pre_mm"),
         h.make_node("Loop", ["M", "", "x0"], ["Y"], body=body, name="loop")],
        "main", [h.make_tensor_value_info("X", F, [2, 4])], [h.make_tensor_value_info("Y", F, [2, 4])],
        [_w("W", (4, 4), 1), nh.from_array(np.array(3, np.int64), "M")])
    return model(g)


def _loop_body_with_if(then_g: onnx.GraphProto, else_g: onnx.GraphProto, op: str, name: str) -> onnx.GraphProto:
    """A Loop body (i, cond_in, h_in) -> (cond_out, h_out): ``If(i < two)`` over the two branches, then
    ``op`` (node ``name``) on its result; ``two`` is an outer-scope value."""
    return h.make_graph(
        [h.make_node("Less", ["i", "two"], ["lt"], name="body_less"),
         h.make_node("If", ["lt"], ["br"], then_branch=then_g, else_branch=else_g, name="body_if"),
         h.make_node(op, ["br"], ["h_out"], name=name),
         h.make_node("Identity", ["cond_in"], ["cond_out"], name="body_cond")],
        "loop_body",
        [h.make_tensor_value_info("i", T.INT64, []), h.make_tensor_value_info("cond_in", T.BOOL, []),
         h.make_tensor_value_info("h_in", F, [2, 4])],
        [h.make_tensor_value_info("cond_out", T.BOOL, []), h.make_tensor_value_info("h_out", F, [2, 4])])


def if_inside_loop(disagree: bool = False) -> onnx.ModelProto:
    """Loop body holding an If whose branches use outer weights; with ``disagree`` one branch is Exp."""
    then_g = h.make_graph([h.make_node("MatMul", ["h_in", "W1"], ["t_out"], name="then_mm")], "then_b", [],
                          [h.make_tensor_value_info("t_out", F, [2, 4])])
    else_node = h.make_node("Exp", ["h_in"], ["e_out"], name="else_exp") if disagree else \
        h.make_node("MatMul", ["h_in", "W2"], ["e_out"], name="else_mm")
    else_g = h.make_graph([else_node], "else_b", [], [h.make_tensor_value_info("e_out", F, [2, 4])])
    body = _loop_body_with_if(then_g, else_g, "Tanh", "body_tanh")
    g = h.make_graph(
        [h.make_node("Loop", ["M", "", "X"], ["Y"], body=body, name="loop")],
        "main", [h.make_tensor_value_info("X", F, [2, 4])], [h.make_tensor_value_info("Y", F, [2, 4])],
        [_w("W1", (4, 4), 2), _w("W2", (4, 4), 3), nh.from_array(np.array(4, np.int64), "M"),
         nh.from_array(np.array(2, np.int64), "two")])
    return model(g)


def scan_model() -> onnx.ModelProto:
    """Scan accumulating MatMul(x_t, W) into a state; emits the state per step."""
    body = h.make_graph(
        [h.make_node("MatMul", ["x_t", "W"], ["mm"], name="scan_mm"),
         h.make_node("Add", ["mm", "s_in"], ["s_out"], name="scan_add"),
         h.make_node("Identity", ["s_out"], ["y_t"], name="scan_id")],
        "scan_body",
        [h.make_tensor_value_info("s_in", F, [1, 4]), h.make_tensor_value_info("x_t", F, [1, 4])],
        [h.make_tensor_value_info("s_out", F, [1, 4]), h.make_tensor_value_info("y_t", F, [1, 4])])
    g = h.make_graph(
        [h.make_node("Scan", ["S0", "X"], ["S", "Ys"], body=body, num_scan_inputs=1, name="scan")],
        "main", [h.make_tensor_value_info("S0", F, [1, 4]), h.make_tensor_value_info("X", F, [5, 1, 4])],
        [h.make_tensor_value_info("S", F, [1, 4]), h.make_tensor_value_info("Ys", F, [5, 1, 4])],
        [_w("W", (4, 4), 4)])
    return model(g)


def pinned_inputs(opset: int = 15) -> onnx.ModelProto:
    """Conv -> BatchNormalization -> Clip(min,max) -> Pad(value) -> Resize(roi, scales) with pinned inputs."""
    c = 4
    g = h.make_graph(
        [h.make_node("Conv", ["X", "Wc"], ["c"], pads=[1, 1, 1, 1], name="conv"),
         h.make_node("BatchNormalization", ["c", "bn_s", "bn_b", "bn_m", "bn_v"], ["bn"], name="bn"),
         h.make_node("Clip", ["bn", "lo", "hi"], ["cl"], name="clip"),
         h.make_node("Pad", ["cl", "pads", "pad_value"], ["pd"], name="pad"),
         h.make_node("Resize", ["pd", "roi", "scales"], ["rs"], mode="nearest", name="resize"),
         h.make_node("Conv", ["rs", "Wc2"], ["Y"], name="conv2")],
        "main", [h.make_tensor_value_info("X", F, [1, c, 6, 6])], [h.make_tensor_value_info("Y", F, [1, 2, 16, 16])],
        [_w("Wc", (c, c, 3, 3), 5, 0.3), _w("Wc2", (2, c, 1, 1), 6),
         nh.from_array(np.ones(c, np.float32), "bn_s"), nh.from_array(np.zeros(c, np.float32), "bn_b"),
         nh.from_array(np.full(c, 0.1, np.float32), "bn_m"), nh.from_array(np.full(c, 2.0, np.float32), "bn_v"),
         nh.from_array(np.array(-1.0, np.float32), "lo"), nh.from_array(np.array(1.0, np.float32), "hi"),
         nh.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads"),
         nh.from_array(np.array(0.5, np.float32), "pad_value"),
         nh.from_array(np.zeros(0, np.float32), "roi"),
         nh.from_array(np.array([1, 1, 2, 2], np.float32), "scales")])
    return model(g, opset)


def out_of_range_constants() -> onnx.ModelProto:
    """Values beyond fp16 (Mul by 1e6, BatchNorm variance 1e8) and a bulk-underflowing weight."""
    c = 3
    g = h.make_graph(
        [h.make_node("Conv", ["X", "Wc"], ["c"], name="conv"),
         h.make_node("Mul", ["c", "big"], ["m"], name="mul_big"),
         h.make_node("BatchNormalization", ["m", "bn_s", "bn_b", "bn_m", "bn_v"], ["bn"], name="bn_big_var"),
         h.make_node("Constant", [], ["tiny"], name="tiny_const",
                     value=nh.from_array(np.full((c, c, 1, 1), 1e-9, np.float32), "tiny_t")),
         h.make_node("Conv", ["bn", "tiny"], ["c2"], name="conv_tiny"),
         h.make_node("Mul", ["c2", "scale_up"], ["Y"], name="mul_up")],
        "main", [h.make_tensor_value_info("X", F, [1, c, 4, 4])], [h.make_tensor_value_info("Y", F, [1, c, 4, 4])],
        [_w("Wc", (c, c, 1, 1), 7), nh.from_array(np.array(1e6, np.float32), "big"),
         nh.from_array(np.ones(c, np.float32), "bn_s"), nh.from_array(np.zeros(c, np.float32), "bn_b"),
         nh.from_array(np.zeros(c, np.float32), "bn_m"), nh.from_array(np.full(c, 1e8, np.float32), "bn_v"),
         nh.from_array(np.array(1e9, np.float32), "scale_up")])
    return model(g, 9)


def ir3_model() -> onnx.ModelProto:
    """IR version 3 / opset 7: the weight is an initializer and (as IR 3 requires) a graph input."""
    g = h.make_graph(
        [h.make_node("MatMul", ["X", "W"], ["m"], name="mm"), h.make_node("Relu", ["m"], ["Y"], name="relu")],
        "main", [h.make_tensor_value_info("X", F, [2, 3]), h.make_tensor_value_info("W", F, [3, 2])],
        [h.make_tensor_value_info("Y", F, [2, 2])], [_w("W", (3, 2), 5)])
    m = model(g, 7)
    m.ir_version = 3
    return m


def existing_casts() -> onnx.ModelProto:
    """A Shape -> Cast(to=float) divisor inside a low region, and a no-op Cast(to=float) of a float."""
    g = h.make_graph(
        [h.make_node("MatMul", ["X", "W"], ["mm"], name="mm"),
         h.make_node("Shape", ["mm"], ["shp"], name="shape"),
         h.make_node("Gather", ["shp", "one"], ["n"], axis=0, name="gather"),
         h.make_node("Cast", ["n"], ["nf"], to=F, name="cast_n"),
         h.make_node("Div", ["mm", "nf"], ["d"], name="div"),
         h.make_node("Cast", ["d"], ["d32"], to=F, name="cast_noop"),
         h.make_node("MatMul", ["d32", "W"], ["Y"], name="mm2")],
        "main", [h.make_tensor_value_info("X", F, [2, 4])], [h.make_tensor_value_info("Y", F, [2, 4])],
        [_w("W", (4, 4), 8), nh.from_array(np.array(1, np.int64), "one")])
    return model(g)


def with_function() -> onnx.ModelProto:
    """A model-local function LinTanh(x, w) = Tanh(MatMul(x, w)) called twice."""
    fn = h.make_function("local", "LinTanh", ["x", "w"], ["y"],
                         [h.make_node("MatMul", ["x", "w"], ["t"]), h.make_node("Tanh", ["t"], ["y"])],
                         [h.make_opsetid("", 17)])
    g = h.make_graph(
        [h.make_node("LinTanh", ["X", "W"], ["a"], domain="local", name="call1"),
         h.make_node("LinTanh", ["a", "W"], ["Y"], domain="local", name="call2")],
        "main", [h.make_tensor_value_info("X", F, [2, 4])], [h.make_tensor_value_info("Y", F, [2, 4])],
        [_w("W", (4, 4), 9)])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("local", 1)], ir_version=8,
                     functions=[fn])
    onnx.checker.check_model(m, full_check=True)
    return m


def shared_input(opset: int = 17) -> onnx.ModelProto:
    """One fp32 input read by three MatMuls, a Softmax (deny) and a name that collides with ours."""
    g = h.make_graph(
        [h.make_node("MatMul", ["X", "W"], ["a"], name="mm_a"),
         h.make_node("MatMul", ["X", "W"], ["b"], name="mm_b"),
         h.make_node("MatMul", ["X", "W"], ["X_fp16"], name="mm_c"),
         h.make_node("Add", ["a", "b"], ["ab"], name="add"),
         h.make_node("Add", ["ab", "X_fp16"], ["abc"], name="add2"),
         h.make_node("Softmax", ["abc"], ["Y"], axis=-1, name="softmax")],
        "main", [h.make_tensor_value_info("X", F, [2, 4])], [h.make_tensor_value_info("Y", F, [2, 4])],
        [_w("W", (4, 4), 10)])
    return model(g, opset)


def conv_loop_if(opset: int = 11) -> onnx.ModelProto:
    """Conv, then a Loop whose body holds an If: its then branch runs MatMul with a captured weight
    and Unsqueeze/Squeeze with ``axes`` attributes (inputs from opset 13), its else branch MatMul."""
    then_g = h.make_graph(
        [h.make_node("MatMul", ["h_in", "W1"], ["t_mm"], name="then_mm"),
         h.make_node("Unsqueeze", ["t_mm"], ["t_u"], axes=[0], name="then_unsq"),
         h.make_node("Squeeze", ["t_u"], ["t_out"], axes=[0], name="then_sq")],
        "then_b", [], [h.make_tensor_value_info("t_out", F, [2, 4])])
    else_g = h.make_graph([h.make_node("MatMul", ["h_in", "W2"], ["e_out"], name="else_mm")], "else_b", [],
                          [h.make_tensor_value_info("e_out", F, [2, 4])])
    body = _loop_body_with_if(then_g, else_g, "Relu", "body_relu")
    g = h.make_graph(
        [h.make_node("Conv", ["X", "K"], ["c"], name="conv"),
         h.make_node("Reshape", ["c", "shape"], ["x0"], name="reshape"),
         h.make_node("Loop", ["M", "", "x0"], ["Y"], body=body, name="loop")],
        "main", [h.make_tensor_value_info("X", F, [1, 2, 2, 2])], [h.make_tensor_value_info("Y", F, [2, 4])],
        [_w("K", (2, 2, 1, 1), 11), _w("W1", (4, 4), 12), _w("W2", (4, 4), 13),
         nh.from_array(np.array([2, 4], np.int64), "shape"), nh.from_array(np.array(4, np.int64), "M"),
         nh.from_array(np.array(2, np.int64), "two")])
    return model(g, opset)


def large_constants(opset: int = 12) -> onnx.ModelProto:
    """Weights stored in main-graph Constant nodes (as Paddle2ONNX exports do), one of them captured by
    a Loop body and one also a graph output."""
    rng = np.random.default_rng(14)
    w = nh.from_array((rng.standard_normal((16, 16)) * 0.3).astype(np.float32), "w_t")
    b = nh.from_array((rng.standard_normal((16,)) * 0.1).astype(np.float32), "b_t")
    body = h.make_graph(
        [h.make_node("MatMul", ["h_in", "W"], ["mm"], name="body_mm"),
         h.make_node("Tanh", ["mm"], ["h_out"], name="body_tanh"),
         h.make_node("Identity", ["cond_in"], ["cond_out"], name="body_cond")],
        "loop_body",
        [h.make_tensor_value_info("i", T.INT64, []), h.make_tensor_value_info("cond_in", T.BOOL, []),
         h.make_tensor_value_info("h_in", F, [2, 16])],
        [h.make_tensor_value_info("cond_out", T.BOOL, []), h.make_tensor_value_info("h_out", F, [2, 16])])
    g = h.make_graph(
        [h.make_node("Relu", ["X"], ["x_relu"], name="relu"),
         h.make_node("Constant", [], ["W"], value=w, name="const_w"),
         h.make_node("MatMul", ["x_relu", "W"], ["mm0"], name="mm0"),
         h.make_node("Constant", [], ["B"], value=b, name="const_b"),
         h.make_node("Add", ["mm0", "B"], ["x0"], name="add_b"),
         h.make_node("Loop", ["M", "", "x0"], ["Y"], body=body, name="loop")],
        "main", [h.make_tensor_value_info("X", F, [2, 16])],
        [h.make_tensor_value_info("Y", F, [2, 16]), h.make_tensor_value_info("W", F, [16, 16])],
        [nh.from_array(np.array(3, np.int64), "M")])
    return model(g, opset)


def int_paths(opset: int = 17) -> onnx.ModelProto:
    """Float compute interleaved with integer shape arithmetic (the nodes ``protoio`` may leave out of
    the IR), inside If and Loop bodies too: int Casts (a no-op one among them) feeding int-only nodes,
    int values read across scopes, an int Constant large enough for the skeleton to move, int graph
    outputs, an int value holding the name the pass would give W's fp16 copy."""
    i64 = T.INT64
    big = nh.from_array(np.arange(256, dtype=np.int64) % 4, "big_idx")  # 2 KiB: left out of the skeleton
    then_g = h.make_graph(
        [h.make_node("Add", ["n_int", "one"], ["t_int"], name="then_int_add"),  # reads outer ints
         h.make_node("MatMul", ["X", "W"], ["t_mm"], name="then_mm"),
         h.make_node("Reshape", ["t_mm", "shape_i64"], ["t_out"], name="then_reshape"),
         h.make_node("Mul", ["t_int", "one"], ["t_int2"], name="then_int_mul")],
        "then", [], [h.make_tensor_value_info("t_out", F, [2, 4]), h.make_tensor_value_info("t_int2", i64, [])])
    else_g = h.make_graph(
        [h.make_node("Sub", ["n_int", "one"], ["e_int"], name="else_int_sub"),
         h.make_node("Exp", ["X"], ["e_out"], name="else_exp")],
        "else", [], [h.make_tensor_value_info("e_out", F, [2, 4]), h.make_tensor_value_info("e_int", i64, [])])
    body = h.make_graph(
        [h.make_node("Add", ["i", "one"], ["i1"], name="body_int_add"),
         h.make_node("Cast", ["i1"], ["i1f"], to=F, name="body_cast_f"),
         h.make_node("Mul", ["h_in", "i1f"], ["h_mul"], name="body_mul"),
         h.make_node("MatMul", ["h_mul", "W"], ["h_out"], name="body_mm"),
         h.make_node("Identity", ["cond_in"], ["cond_out"], name="body_cond"),
         h.make_node("Mul", ["i1", "n_int"], ["scan_int"], name="body_int_last")],
        "loop_body",
        [h.make_tensor_value_info("i", i64, []), h.make_tensor_value_info("cond_in", T.BOOL, []),
         h.make_tensor_value_info("h_in", F, [2, 4])],
        [h.make_tensor_value_info("cond_out", T.BOOL, []), h.make_tensor_value_info("h_out", F, [2, 4]),
         h.make_tensor_value_info("scan_int", i64, [])])
    g = h.make_graph(
        [h.make_node("Shape", ["X"], ["shp"], name="shape"),
         h.make_node("Cast", ["shp"], ["shp32"], to=T.INT32, name="cast_i32"),
         h.make_node("Cast", ["shp32"], ["shp32b"], to=T.INT32, name="cast_noop_i32"),
         h.make_node("Cast", ["shp32b"], ["shape_i64"], to=i64, name="cast_i64"),
         h.make_node("Neg", ["shp32b"], ["shape_neg"], name="int_neg"),  # an int node reading a no-op Cast
         h.make_node("Gather", ["big", "big_idx"], ["W_fp16"], axis=0, name="gather_big"),  # the name the
         h.make_node("ReduceSum", ["W_fp16"], ["n_int"], keepdims=0, name="int_sum"),  # fp16 copy of W wants
         h.make_node("Constant", [], ["big"], value=nh.from_array(np.arange(8, dtype=np.int64), "bigv"),
                     name="small_int_const"),
         h.make_node("Greater", ["n_int", "one"], ["cond"], name="int_cmp"),
         h.make_node("If", ["cond"], ["branch", "branch_int"], then_branch=then_g, else_branch=else_g, name="if"),
         h.make_node("Loop", ["M", "", "branch"], ["looped", "scans"], body=body, name="loop"),
         h.make_node("MatMul", ["looped", "W"], ["Y"], name="final_mm"),
         h.make_node("Add", ["branch_int", "one"], ["Y_int"], name="int_out")],
        "main", [h.make_tensor_value_info("X", F, [2, 4])],
        [h.make_tensor_value_info("Y", F, [2, 4]), h.make_tensor_value_info("Y_int", i64, []),
         h.make_tensor_value_info("scans", i64, [None]), h.make_tensor_value_info("shape_neg", T.INT32, [2])],
        [_w("W", (4, 4), 11), nh.from_array(np.array(1, np.int64), "one"), nh.from_array(np.array(2, np.int64), "M")])
    # the large int Constant node must come first (it is read by gather_big): move it to the top
    g.node.insert(0, h.make_node("Constant", [], ["big_idx"], value=big, name="big_int_const"))
    nodes = list(g.node)
    small = next(n for n in nodes if n.name == "small_int_const")
    nodes.remove(small)
    nodes.insert(1, small)
    del g.node[:]
    g.node.extend(nodes)
    return model(g, opset)


def big_weights(opset: int = 17) -> onnx.ModelProto:
    """Weights large enough for the threaded range check of ``Painter._prefetch_large`` (together over a
    million elements): MatMul weights in the main graph, one out of fp16 range (and bf16-safe), one
    whose values flush to zero in bulk, one also read by a DENY node, and one captured by a Loop body
    inside which an If reads another."""
    rng = np.random.default_rng(21)

    def w(name: str, scale: float, rows: int = 512) -> onnx.TensorProto:
        return nh.from_array((rng.standard_normal((rows, 512)) * scale).astype(np.float32), name)

    then_g = h.make_graph([h.make_node("MatMul", ["h_in", "W_then"], ["t_out"], name="then_mm")], "then", [],
                          [h.make_tensor_value_info("t_out", F, [2, 512])])
    else_g = h.make_graph([h.make_node("Identity", ["h_in"], ["e_out"], name="else_id")], "else", [],
                          [h.make_tensor_value_info("e_out", F, [2, 512])])
    body = h.make_graph(
        [h.make_node("MatMul", ["h_in", "W_loop"], ["mm"], name="body_mm"),
         h.make_node("Tanh", ["mm"], ["mm_t"], name="body_tanh"),
         h.make_node("If", ["cond_in"], ["branch"], then_branch=then_g, else_branch=else_g, name="body_if"),
         h.make_node("Add", ["mm_t", "branch"], ["h_out"], name="body_add"),
         h.make_node("Identity", ["cond_in"], ["cond_out"], name="body_cond")],
        "loop_body",
        [h.make_tensor_value_info("i", T.INT64, []), h.make_tensor_value_info("cond_in", T.BOOL, []),
         h.make_tensor_value_info("h_in", F, [2, 512])],
        [h.make_tensor_value_info("cond_out", T.BOOL, []), h.make_tensor_value_info("h_out", F, [2, 512])])
    g = h.make_graph(
        [h.make_node("MatMul", ["X", "W0"], ["a0"], name="mm0"),
         h.make_node("MatMul", ["a0", "W_huge"], ["a1"], name="mm_huge"),
         h.make_node("MatMul", ["a1", "W_tiny"], ["a2"], name="mm_tiny"),
         h.make_node("MatMul", ["a0", "W1"], ["a3"], name="mm1"),
         h.make_node("ReduceSum", ["W1"], ["w1_sum"], keepdims=0, name="deny_sum"),
         h.make_node("Add", ["a2", "a3"], ["a4"], name="add"),
         h.make_node("Loop", ["M", "C", "a4"], ["Y"], body=body, name="loop")],
        "main", [h.make_tensor_value_info("X", F, [2, 512])],
        [h.make_tensor_value_info("Y", F, [2, 512]), h.make_tensor_value_info("w1_sum", F, [])],
        [w("W0", 0.05), w("W_huge", 0.02), w("W_tiny", 1e-9), w("W1", 0.05), w("W_loop", 0.05),
         w("W_then", 0.05), nh.from_array(np.array(2, np.int64), "M"), nh.from_array(np.array(True), "C")])
    huge = g.initializer[1]
    arr = nh.to_array(huge).copy()
    arr[3, 7] = 1e5  # beyond fp16's 65504, within bf16's range
    huge.CopyFrom(nh.from_array(arr, "W_huge"))
    return model(g, opset)
