"""Models built for the data-driven precision tests (deterministic for a seed)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _model(graph: onnx.GraphProto, opset: int = 17) -> onnx.ModelProto:
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    onnx.checker.check_model(m, full_check=True)
    return m


def _w(rng: np.random.Generator, name: str, shape: tuple[int, ...], std: float) -> onnx.TensorProto:
    return numpy_helper.from_array((rng.standard_normal(shape) * std).astype(np.float32), name)


def overflow_chain(seed: int = 0, layers: int = 10, hot: int = 3, width: int = 256) -> onnx.ModelProto:
    """``layers`` MatMul+Tanh layers; layer ``hot`` makes activations of ~1e5 (above fp16's 65504) that a
    Div scales back down.  Every weight is inside the fp16 range, so static range checks see nothing;
    the default fp16 painting overflows to inf there.  Unnamed nodes throughout."""
    rng = np.random.default_rng(seed)
    nodes, inits = [], []
    h = "x"
    for i in range(layers):
        std = 6000.0 if i == hot else 1.0 / np.sqrt(width)
        inits.append(_w(rng, f"w{i}", (width, width), std))
        nodes.append(helper.make_node("MatMul", [h, f"w{i}"], [f"m{i}"]))
        h = f"m{i}"
        if i == hot:
            inits.append(numpy_helper.from_array(np.array(60000.0, np.float32), "scale"))
            nodes.append(helper.make_node("Div", [h, "scale"], [f"s{i}"]))
            h = f"s{i}"
            continue
        nodes.append(helper.make_node("Tanh", [h], [f"t{i}"] if i < layers - 1 else ["y"]))
        h = f"t{i}"
    graph = helper.make_graph(nodes, "overflow_chain", [helper.make_tensor_value_info("x", F, [4, width])],
                              [helper.make_tensor_value_info("y", F, [4, width])], initializer=inits)
    return _model(graph)


def loop_if_hot(seed: int = 0, width: int = 64) -> onnx.ModelProto:
    """A Loop whose body holds an If; inside the then-branch a MatMul makes values above 65504 that a Mul
    scales back, and the loop body has its own hot MatMul too.  Nodes are unnamed and the two If
    branches reuse the value name ``z`` (keys must still be distinct)."""
    rng = np.random.default_rng(seed)
    big = 6000.0
    n = helper.make_node
    then_g = helper.make_graph(
        [n("MatMul", ["h_in", "wb"], ["z"]), n("Mul", ["z", "small"], ["zt"])], "then",
        [], [helper.make_tensor_value_info("zt", F, [1, width])])
    else_g = helper.make_graph(
        [n("MatMul", ["h_in", "wn"], ["z"]), n("Tanh", ["z"], ["ze"])], "else",
        [], [helper.make_tensor_value_info("ze", F, [1, width])])
    body = helper.make_graph(
        [n("MatMul", ["h_in", "wl"], ["u"]), n("Mul", ["u", "small"], ["us"]), n("Tanh", ["us"], ["ut"]),
         n("If", ["flag"], ["hb"], then_branch=then_g, else_branch=else_g),
         n("Add", ["ut", "hb"], ["h_sum"]), n("Tanh", ["h_sum"], ["h_out"]), n("Identity", ["cond_in"], ["cond_out"]),
         n("Identity", ["h_out"], ["trace"])],
        "body",
        [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("cond_in", B, []),
         helper.make_tensor_value_info("h_in", F, [1, width])],
        [helper.make_tensor_value_info("cond_out", B, []), helper.make_tensor_value_info("h_out", F, [1, width]),
         helper.make_tensor_value_info("trace", F, [1, width])])
    inits = [_w(rng, "wb", (width, width), big), _w(rng, "wn", (width, width), width ** -0.5),
             _w(rng, "wl", (width, width), big), numpy_helper.from_array(np.array(1 / 60000, np.float32), "small"),
             numpy_helper.from_array(np.array(True), "cond0"), _w(rng, "win", (width, width), width ** -0.5)]
    graph = helper.make_graph(
        [n("MatMul", ["x", "win"], ["h0"]), n("Loop", ["trip", "cond0", "h0"], ["h_last", "traces"], body=body),
         n("Tanh", ["h_last"], ["y"])],
        "loop_if_hot",
        [helper.make_tensor_value_info("x", F, [1, width]), helper.make_tensor_value_info("trip", I64, []),
         helper.make_tensor_value_info("flag", B, [])],
        [helper.make_tensor_value_info("y", F, [1, width]), helper.make_tensor_value_info("traces", F, ["T", 1, width])],
        initializer=inits)
    return _model(graph)


def scan_hot(seed: int = 0, width: int = 32, steps: int = 5) -> onnx.ModelProto:
    """A Scan over ``steps`` rows whose body has a MatMul making values above 65504 (scaled back by a Div);
    carries a state and emits a scan output; unnamed nodes."""
    rng = np.random.default_rng(seed)
    n = helper.make_node
    body = helper.make_graph(
        [n("MatMul", ["row", "wh"], ["u"]), n("Div", ["u", "big"], ["ud"]), n("Add", ["s_in", "ud"], ["s_sum"]),
         n("Tanh", ["s_sum"], ["s_out"]), n("Identity", ["s_out"], ["emit"])],
        "body",
        [helper.make_tensor_value_info("s_in", F, [1, width]), helper.make_tensor_value_info("row", F, [1, width])],
        [helper.make_tensor_value_info("s_out", F, [1, width]), helper.make_tensor_value_info("emit", F, [1, width])])
    inits = [_w(rng, "wh", (width, width), 6000.0), numpy_helper.from_array(np.array(60000.0, np.float32), "big"),
             numpy_helper.from_array(np.zeros((1, width), np.float32), "s0")]
    graph = helper.make_graph(
        [n("Scan", ["s0", "x"], ["s_last", "y"], body=body, num_scan_inputs=1)], "scan_hot",
        [helper.make_tensor_value_info("x", F, [steps, 1, width])],
        [helper.make_tensor_value_info("s_last", F, [1, width]), helper.make_tensor_value_info("y", F,
                                                                                               [steps, 1, width])],
        initializer=inits)
    return _model(graph)


def feeds_for(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs for the models above."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for vi in model.graph.input:
        if vi.name == "trip":
            out[vi.name] = np.array(4, np.int64)
        elif vi.name == "flag":
            out[vi.name] = np.array(True)
        else:
            shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
            out[vi.name] = rng.standard_normal(shape).astype(np.float32)
    return out
