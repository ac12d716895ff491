"""Synthetic models that make each rule of the pass's default policy observable.

Each model is small (a few KB, milliseconds to run) and deterministic for a seed.  Removing one rule of
the default policy changes a verdict on at least one of them (``tests/workers/revision/test_policy_mutation.py``
proves it for every DENY entry and for the range check, pinned types, subgraph painting and cast sharing):

- ``deny_*``: one branch per DENY op, ``x_<op> -> <op> -> y_<op>``, fed directly by its own graph input
  (so the op and everything after it run fp32 under the default policy).  The zoo entry's input spec
  (``zoo.toml``) draws values that low precision gets wrong: arguments beyond fp16 range after the op
  (exp/sinh/cosh of ~12, sums of ~1e5, norms of large vectors), values that flush to zero in fp16
  (logs of 1e-9), large arguments where fp16's spacing is 0.5 (sin of ~1000, logits of ~1000), and
  statistics of values with a large mean.  Where the op's output itself is large and smooth, the branch
  subtracts its typical value (``y = op(x) - c``, catastrophic cancellation) so that the output's
  rounding at magnitude ``c`` shows against a small result, in bf16 as well as fp16.
- ``deny_exp``: an exact permutation MatMul (ALLOW: low) then Exp of values ~11: the Exp must stay fp32
  whether the mutation moves it to ALLOW or to INFER (an INFER op follows its low producer).
- ``range_big_const`` / ``range_tiny_const``: a constant beyond fp16's range (9e4) / of values that
  flush to zero in fp16 (1e-9) multiplied into a low-precision MatMul's output.
- ``pinned_types``: a Resize whose ``scales`` input is ``tensor(float)`` by schema, and a Celu (float
  only at opset 12+) after a low Conv.
- ``cast_share``: one low value read by several fp32 (DENY) consumers and one fp32 input read by two
  MatMuls: one shared Cast each, or several.
- ``deny_recurrent_cpu``: LSTM, GRU and RNN (DENY on the ``cpu`` target overlay).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F, I64, I32 = TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32


class GraphBuilder:
    """Collects nodes, inputs, outputs and initializers of one graph; ``model()`` checks the result."""

    def __init__(self, name: str, opset: int) -> None:
        self.name, self.opset = name, opset
        self.nodes: list[onnx.NodeProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self.inits: list[onnx.TensorProto] = []

    def input(self, name: str, shape: list[int], elem: int = F) -> str:
        """Declare a graph input; returns its name."""
        self.inputs.append(helper.make_tensor_value_info(name, elem, shape))
        return name

    def const(self, name: str, value: object, dtype: type = np.float32) -> str:
        """Add an initializer holding ``value`` as ``dtype``; returns its name."""
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def node(self, op: str, inputs: list[str], out: str, **attrs: object) -> str:
        """Add one node with a single output ``out``; returns ``out``."""
        self.nodes.append(helper.make_node(op, inputs, [out], name=f"{out}_{op}", **attrs))
        return out

    def output(self, name: str, elem: int = F, shape: list[int] | None = None) -> None:
        """Declare ``name`` a graph output of element type ``elem`` (``shape`` None: from shape inference)."""
        self.outputs.append(helper.make_tensor_value_info(name, elem, shape))

    def model(self) -> onnx.ModelProto:
        """The model (IR 8, default domain at ``opset``; output shapes from ONNX shape inference),
        checked with the full ONNX checker."""
        graph = helper.make_graph(self.nodes, self.name, self.inputs, [], initializer=self.inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)], ir_version=8)
        inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(m).graph.value_info}
        m.graph.output.extend(out if out.type.tensor_type.HasField("shape") else inferred.get(out.name, out)
                              for out in self.outputs)
        onnx.checker.check_model(m, full_check=True)
        return m


def _unary(b: GraphBuilder, op: str, shape: list[int], offset: float | None = None, **attrs: object) -> None:
    """Branch ``y_<op> = op(x_<op>) [- offset]``."""
    key = op.lower()
    y = b.node(op, [b.input(f"x_{key}", shape)], f"{key}_out" if offset is not None else f"y_{key}", **attrs)
    if offset is not None:
        b.node("Sub", [y, b.const(f"c_{key}", offset)], f"y_{key}")
    b.output(f"y_{key}")


def deny_exp(seed: int) -> onnx.ModelProto:
    """``y = Exp(x P)`` with a seeded permutation ``P`` (exact in any dtype); x ~ 11 makes e^x > 65504."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("deny_exp", 17)
    perm = np.eye(16, dtype=np.float32)[rng.permutation(16)]
    b.node("MatMul", [b.input("x", [4, 16]), b.const("perm", perm)], "xp")
    b.node("Exp", ["xp"], "y")
    b.output("y")
    return b.model()


def deny_elementwise(seed: int) -> onnx.ModelProto:
    """Exponentials, logs, powers and trigonometry: one DENY op per branch (see the module doc)."""
    b = GraphBuilder("deny_elementwise", 17)
    for op in ("Log", "Reciprocal", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh",
               "Acosh", "Atanh"):
        _unary(b, op, [4, 16])
    b.node("Pow", [b.input("x_pow", [4, 16]), b.const("exponent", 5.0 + 0.25 * (seed % 4))], "y_pow")
    b.output("y_pow")
    return b.model()


def deny_reductions(seed: int) -> onnx.ModelProto:
    """Reductions, cumulative sums, Lp pooling and determinants: sums beyond fp16 range, or (means and
    log-sum-exp, whose results stay near their inputs) large values minus their typical result."""
    b = GraphBuilder("deny_reductions", 17)
    b.node("ReduceSum", [b.input("x_reducesum", [2, 1024]), b.const("axis1", [1], np.int64)], "y_reducesum",
           keepdims=0)
    b.output("y_reducesum")
    for op in ("ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceProd", "ReduceSumSquare"):
        _unary(b, op, [8, 64] if op in ("ReduceL1", "ReduceL2") else [8, 16], axes=[1], keepdims=0)
    _unary(b, "ReduceMean", [8, 4], offset=1000.5, axes=[1], keepdims=0)
    _unary(b, "ReduceLogSumExp", [8, 4], offset=1001.9, axes=[1], keepdims=0)
    b.node("CumSum", [b.input("x_cumsum", [2, 1024]), b.const("axis_last", 1, np.int64)], "y_cumsum")
    b.output("y_cumsum")
    _unary(b, "LpPool", [1, 2, 64], kernel_shape=[8], strides=[8], p=2)
    _unary(b, "GlobalLpPool", [1, 2, 16], p=2)
    b.node("Det", [b.input("x_det", [4, 5, 5])], "det")
    b.node("Mul", ["det", b.const("det_sign", (-1.0) ** seed)], "y_det")
    b.output("y_det")
    return b.model()


def deny_normalisations(seed: int) -> onnx.ModelProto:
    """Softmax-like ops of large logits, normalisations of values with a large mean or of tiny vectors,
    and losses summed over a large batch."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("deny_normalisations", 17)
    for op in ("Softmax", "LogSoftmax", "Hardmax"):
        _unary(b, op, [4, 16], axis=-1)
    _unary(b, "LpNormalization", [4, 16], axis=-1, p=2)
    _unary(b, "MeanVarianceNormalization", [1, 4, 8, 8], axes=[0, 2, 3])  # explicit: the default trips onnx
    _unary(b, "LRN", [1, 4, 8, 8], size=3)
    scale = (1.0 + 0.1 * rng.standard_normal(4)).astype(np.float32)
    b.node("InstanceNormalization", [b.input("x_instancenormalization", [1, 4, 64]), b.const("in_scale", scale),
                                     b.const("in_bias", np.zeros(4))], "y_instancenormalization")
    b.output("y_instancenormalization")
    b.node("NegativeLogLikelihoodLoss", [b.input("x_negativeloglikelihoodloss", [1024, 4]),
                                         b.input("t_negativeloglikelihoodloss", [1024], I64)],
           "y_negativeloglikelihoodloss", reduction="sum")
    b.output("y_negativeloglikelihoodloss")
    b.node("SoftmaxCrossEntropyLoss", [b.input("x_softmaxcrossentropyloss", [64, 16]),
                                       b.input("t_softmaxcrossentropyloss", [64], I64)],
           "y_softmaxcrossentropyloss", reduction="none")
    b.output("y_softmaxcrossentropyloss")
    return b.model()


def deny_generators(seed: int) -> onnx.ModelProto:
    """Random generators, EyeLike, Range and Multinomial.  The generators draw from a narrow band around
    1000.27 (fp16 rounds it to 1000.5, bf16 to 1000), minus 1000: nearly deterministic, so a provider with
    another random stream (CUDA) still agrees with the CPU reference.  EyeLike's identity is added to
    values of ~1000 (the Add follows EyeLike's class).  Range and Multinomial (whose logits make one
    class certain) have no low-precision output type at opset 17: the pass cannot change them."""
    b = GraphBuilder("deny_generators", 17)
    s = float(seed * 16)
    band = {"low": 1000.27, "high": 1000.28}
    b.node("RandomNormal", [], "rn", shape=[64], mean=1000.275, scale=1e-3, seed=s + 1)
    b.node("Sub", ["rn", b.const("thousand", 1000.0)], "y_randomnormal")
    b.node("RandomUniform", [], "ru", shape=[64], seed=s + 2, **band)
    b.node("Sub", ["ru", "thousand"], "y_randomuniform")
    b.node("RandomNormalLike", [b.input("x_randomnormallike", [64])], "rnl", mean=1000.275, scale=1e-3, seed=s + 3)
    b.node("Sub", ["rnl", "thousand"], "y_randomnormallike")
    b.node("RandomUniformLike", [b.input("x_randomuniformlike", [64])], "rul", seed=s + 4, **band)
    b.node("Sub", ["rul", "thousand"], "y_randomuniformlike")
    b.node("EyeLike", [b.input("x_eyelike", [8, 8])], "eye")
    b.node("Add", ["eye", b.input("big_eyelike", [8, 8])], "eye_big")
    b.node("Sub", ["eye_big", "thousand"], "y_eyelike")
    b.node("Range", [b.const("r_start", 0.5), b.const("r_limit", 8.0), b.const("r_delta", 0.25)], "y_range")
    logits = np.full((2, 8), -60.0, np.float32)
    logits[:, seed % 8] = 60.0
    b.node("Multinomial", [b.const("logits", logits)], "y_multinomial", sample_size=4, seed=s + 5)
    for name in ("y_randomnormal", "y_randomuniform", "y_randomnormallike", "y_randomuniformlike", "y_eyelike",
                 "y_range"):
        b.output(name)
    b.output("y_multinomial", I32)
    return b.model()


def deny_opset18(seed: int) -> onnx.ModelProto:
    """ReduceMean-18 and ReduceSum at opset 18 (``axes`` is an input there; listed again in ops.toml)."""
    b = GraphBuilder("deny_opset18", 18)
    axis = b.const("axis1", [1], np.int64)
    b.node("ReduceMean", [b.input("x_reducemean", [8, 4]), axis], "mean", keepdims=0)
    b.node("Sub", ["mean", b.const("c_mean", 1000.5)], "y_reducemean")
    b.node("ReduceSum", [b.input("x_reducesum", [2, 1024]), axis], "y_reducesum", keepdims=0)
    b.node("Mul", ["y_reducesum", b.const("sum_sign", (-1.0) ** seed)], "y_reducesum_signed")
    b.output("y_reducemean")
    b.output("y_reducesum_signed")
    return b.model()


def deny_opset20(seed: int) -> onnx.ModelProto:
    """DFT-20 and STFT of signals of ~150: the DC bins (sums of 512-1024 values) exceed fp16's range."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("deny_opset20", 20)
    b.node("DFT", [b.input("x_dft", [1, 1024, 1]), "", b.const("dft_axis", 1, np.int64)], "y_dft", onesided=1)
    window = (1.0 + 0.01 * rng.standard_normal(512)).astype(np.float32)
    b.node("STFT", [b.input("x_stft", [1, 1024, 1]), b.const("frame_step", 256, np.int64), b.const("window", window)],
           "y_stft", onesided=1)
    b.output("y_dft")
    b.output("y_stft")
    return b.model()


def deny_recurrent_cpu(seed: int) -> onnx.ModelProto:
    """An LSTM, a GRU and an RNN (ALLOW, but DENY on the ``cpu`` target): low on cpu only adds casts."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("deny_recurrent_cpu", 17)
    hid, dx = 8, 4
    for op, gates in (("LSTM", 4), ("GRU", 3), ("RNN", 1)):
        key = op.lower()
        w = b.const(f"w_{key}", rng.standard_normal((1, gates * hid, dx)) * dx ** -0.5)
        r = b.const(f"r_{key}", rng.standard_normal((1, gates * hid, hid)) * 0.5 * hid ** -0.5)
        b.nodes.append(helper.make_node(op, [b.input(f"x_{key}", [8, 1, dx]), w, r], [f"y_{key}"],
                                        name=f"{key}_node", hidden_size=hid))
        b.output(f"y_{key}")
    return b.model()


def range_big_const(seed: int) -> onnx.ModelProto:
    """``y = (x W) * 9e4``: the constant exceeds fp16's largest value (65504); bf16 holds it."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("range_big_const", 17)
    w = rng.standard_normal((16, 16)) * 16 ** -0.5
    b.node("MatMul", [b.input("x", [4, 16]), b.const("w", w)], "h")
    b.node("Mul", ["h", b.const("big", 9e4)], "y")
    b.output("y")
    return b.model()


def range_tiny_const(seed: int) -> onnx.ModelProto:
    """``y = (x W) * c`` with ``c`` ~ 1e-9 per channel: every value of ``c`` flushes to zero in fp16."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("range_tiny_const", 17)
    w = rng.standard_normal((16, 16)) * 16 ** -0.5
    b.node("MatMul", [b.input("x", [4, 16]), b.const("w", w)], "h")
    b.node("Mul", ["h", b.const("tiny", rng.uniform(0.5e-9, 2e-9, 16))], "y")
    b.output("y")
    return b.model()


def pinned_types(seed: int) -> onnx.ModelProto:
    """A low Conv feeding a Resize (its ``scales`` input is ``tensor(float)`` by schema) and a Celu (whose
    schema admits only ``tensor(float)``): both must keep those positions fp32."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("pinned_types", 17)
    w = rng.standard_normal((4, 4, 1, 1)) * 0.5
    b.node("Conv", [b.input("x", [1, 4, 8, 8]), b.const("w", w)], "c")
    b.node("Resize", ["c", "", b.const("scales", [1.0, 1.0, 2.0, 2.0])], "y_resize", mode="nearest")
    b.node("Celu", ["c"], "y_celu", alpha=1.0)
    b.output("y_resize")
    b.output("y_celu")
    return b.model()


def cast_share(seed: int) -> onnx.ModelProto:
    """``x`` feeds two MatMuls (one Cast to low, shared); the low ``h`` feeds four DENY ops (one Cast back)."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("cast_share", 17)
    x = b.input("x", [4, 16])
    b.node("MatMul", [x, b.const("w1", rng.standard_normal((16, 16)) * 0.25)], "h")
    b.node("MatMul", [x, b.const("w2", rng.standard_normal((16, 8)) * 0.25)], "y_proj")
    b.node("Softmax", ["h"], "y_softmax", axis=-1)
    b.node("ReduceMean", ["h"], "y_mean", axes=[1], keepdims=0)
    b.node("ReduceSum", ["h", b.const("axis1", [1], np.int64)], "y_sum", keepdims=0)
    b.node("CumSum", ["h", b.const("axis_last", 1, np.int64)], "y_cumsum")
    for name in ("y_proj", "y_softmax", "y_mean", "y_sum", "y_cumsum"):
        b.output(name)
    return b.model()


#: Generator registry of this module (merged into ``workers.zoo.synthetic.GENERATORS``).
RULE_GENERATORS: dict[str, Callable[[int], onnx.ModelProto]] = {
    "deny_exp": deny_exp, "deny_elementwise": deny_elementwise, "deny_reductions": deny_reductions,
    "deny_normalisations": deny_normalisations, "deny_generators": deny_generators, "deny_opset18": deny_opset18,
    "deny_opset20": deny_opset20, "deny_recurrent_cpu": deny_recurrent_cpu, "range_big_const": range_big_const,
    "range_tiny_const": range_tiny_const, "pinned_types": pinned_types, "cast_share": cast_share,
}
