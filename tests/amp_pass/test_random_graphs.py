"""Random valid graphs (elementwise ops, MatMul, Cast pairs, constants in and out of range, nested If
and Loop bodies reading outer-scope values) convert to valid (full checker, onnxruntime load), idempotent models under every option set.

The generator builds [2, 4] float graphs only from parts whose shapes always agree and ops that exist at
the model's opset (7 to 21: below 13 Cast cannot carry bf16, so bf16 with ``keep_io_types=False`` is
drawn there on purpose); a generated model that the full ONNX checker rejects is skipped (not counted).
Seeded: a failure names the seed.
"""

from __future__ import annotations

import random

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper as h
from onnx import numpy_helper as nh

from amp_pass import ConversionOptions, convert_model
from tests.amp_pass.models import assert_valid

F = TensorProto.FLOAT
SHAPE = [2, 4]
UNARY = ["Relu", "Exp", "Tanh", "Sigmoid", "Neg", "Abs", "Sqrt", "Identity", "Softmax", "Log", "Reciprocal", "Erf"]
BINARY = ["Add", "Mul", "Sub", "Div", "Max", "Min", "Pow"]
OPTIONS = [{}, {"keep_io_types": False}, {"policy": "aggressive"}, {"policy": "conservative"}, {"target": "cpu"}]
OPSETS = [7, 8, 9, 10, 11, 12, 13, 17, 21]


class RandomGraphs:
    """Builds random graphs from one ``random.Random`` with ops of ``opset``; every name it makes is unique."""

    def __init__(self, rng: random.Random, opset: int = 17) -> None:
        self.rng = rng
        self.count = 0
        self.unary = [op for op in UNARY if onnx.defs.has(op, opset)]  # (Erf arrives at 9)

    def fresh(self, prefix: str) -> str:
        """A new unique name."""
        self.count += 1
        return f"{prefix}{self.count}"

    def _constant(self, nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto]) -> str:
        name = self.fresh("c")
        value = self.rng.choice([0.5, 2.0, 1e5, 1e-9, -3.0]) * self.rng.choice([1, -1])
        arr = np.full(SHAPE, value, np.float32)
        if self.rng.random() < 0.5:
            inits.append(nh.from_array(arr, name))
        else:
            nodes.append(h.make_node("Constant", [], [name], value=nh.from_array(arr, name + "_t"),
                                     name=self.fresh("n")))
        return name

    def graph(self, inputs: list[str], depth: int, n_nodes: int, n_outputs: int,
              outer: tuple[str, ...] = ()) -> onnx.GraphProto:
        """A graph of ``n_nodes`` random steps over ``inputs`` (and the outer-scope names ``outer``)."""
        rng = self.rng
        nodes: list[onnx.NodeProto] = []
        inits: list[onnx.TensorProto] = []
        avail = [*inputs, *outer]
        made: list[str] = []
        for _ in range(n_nodes):
            out, k, a = self.fresh("v"), rng.random(), rng.choice(avail)
            if k < 0.3:
                op = rng.choice(self.unary)
                if op in ("Sqrt", "Log"):
                    nodes.append(h.make_node("Abs", [a], [t := self.fresh("abs")], name=self.fresh("n")))
                    a = t
                nodes.append(h.make_node(op, [a], [out], name=self.fresh("n")))
            elif k < 0.55:
                op = rng.choice(BINARY)
                b = self._constant(nodes, inits) if rng.random() < 0.4 else rng.choice(avail)
                if op == "Pow":
                    inits.append(nh.from_array(np.array(2.0, np.float32), b := self.fresh("two")))
                nodes.append(h.make_node(op, [a, b], [out], name=self.fresh("n")))
            elif k < 0.7:
                w = self.fresh("w")
                inits.append(nh.from_array(np.random.default_rng(self.count).standard_normal((4, 4)).astype(np.float32), w))
                nodes.append(h.make_node("MatMul", [a, w], [out], name=self.fresh("n")))
            elif k < 0.78:
                mid = self.fresh("cast")
                nodes.append(h.make_node("Cast", [a], [mid], to=rng.choice([TensorProto.FLOAT16, TensorProto.DOUBLE, F]),
                                         name=self.fresh("n")))
                nodes.append(h.make_node("Cast", [mid], [out], to=F, name=self.fresh("n")))
            elif k < 0.85 and depth > 0:
                mean, cond, zero = self.fresh("mean"), self.fresh("cond"), self.fresh("zero")
                inits.append(nh.from_array(np.array(0.0, np.float32), zero))
                nodes.append(h.make_node("ReduceMean", [a], [mean], keepdims=0, name=self.fresh("n")))
                nodes.append(h.make_node("Greater", [mean, zero], [cond], name=self.fresh("n")))
                then_g, else_g = (self.graph([], depth - 1, rng.randrange(1, 4), 1, tuple(avail)) for _ in range(2))
                nodes.append(h.make_node("If", [cond], [out], then_branch=then_g, else_branch=else_g,
                                         name=self.fresh("n")))
            elif depth > 0:
                trips, h_in, c_in, c_out = self.fresh("M"), self.fresh("h"), self.fresh("ci"), self.fresh("co")
                inits.append(nh.from_array(np.array(rng.randrange(1, 4), np.int64), trips))
                body = self.graph([h_in], depth - 1, rng.randrange(1, 4), 1, tuple(avail))
                body.node.append(h.make_node("Identity", [c_in], [c_out], name=self.fresh("n")))
                body.input.insert(0, h.make_tensor_value_info(c_in, TensorProto.BOOL, []))
                body.input.insert(0, h.make_tensor_value_info(self.fresh("i"), TensorProto.INT64, []))
                body.output.insert(0, h.make_tensor_value_info(c_out, TensorProto.BOOL, []))
                nodes.append(h.make_node("Loop", [trips, "", a], [out], body=body, name=self.fresh("n")))
            else:
                nodes.append(h.make_node("Relu", [a], [out], name=self.fresh("n")))
            avail.append(out)
            made.append(out)
        outputs = rng.sample(made, min(n_outputs, len(made)))
        return h.make_graph(nodes, self.fresh("g"), [h.make_tensor_value_info(i, F, SHAPE) for i in inputs],
                            [h.make_tensor_value_info(o, F, SHAPE) for o in outputs], inits)


def _valid(model: onnx.ModelProto) -> bool:
    try:
        onnx.checker.check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError, ValueError):
        return False
    return True


def _check(model: onnx.ModelProto, options: ConversionOptions, where: str) -> None:
    out = convert_model(model, options)
    assert _valid(out.model), f"{where}: invalid output"
    assert_valid(out.model, options.dtype)  # and loads in onnxruntime
    again = convert_model(out.model, options)
    assert again.model.SerializeToString() == out.model.SerializeToString(), f"{where}: not idempotent"
    assert again.report.casts_inserted == again.report.casts_removed == 0, where


def _random_model(rng: random.Random, opset: int) -> onnx.ModelProto:
    g = RandomGraphs(rng, opset).graph(["X", "Z"], 2, rng.randrange(3, 12), rng.randrange(1, 3))
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)], ir_version=8)


@pytest.mark.parametrize("seed", range(4))
def test_random_graphs_convert_to_valid_idempotent_models(seed: int) -> None:
    made = 0
    for case in range(15):
        rng = random.Random(seed * 1000 + case)
        model = _random_model(rng, rng.choice(OPSETS))
        if not _valid(model):
            continue
        made += 1
        options = ConversionOptions(dtype=rng.choice(["fp16", "bf16"]), **rng.choice(OPTIONS))
        _check(model, options, f"seed {seed} case {case} {options}")
    assert made >= 8, "the generator should mostly make valid models"


@pytest.mark.parametrize("opset", range(7, 13))
def test_bf16_low_io_below_opset_13(opset: int) -> None:
    """bf16 without keep_io_types at opsets whose Cast cannot carry bf16: "auto" (upgrades, or keeps
    fp32 I/O when the upgrade fails) and "keep" both give valid, idempotent models."""
    made = 0
    for case in range(3):
        rng = random.Random(opset * 100 + case)
        model = _random_model(rng, opset)
        if not _valid(model):
            continue
        made += 1
        for target in ("auto", "keep"):
            options = ConversionOptions(dtype="bf16", keep_io_types=False, target_opset=target,
                                        policy=rng.choice(["default", "aggressive"]))
            _check(model, options, f"opset {opset} case {case} {options}")
    assert made >= 2, "the generator should mostly make valid models"
