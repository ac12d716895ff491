"""bf16 with ``keep_io_types=False`` below opset 13, where Cast cannot carry bf16.

Without ALLOW ops the "auto" planner used to keep the model's opset while painting still made the
graph inputs bf16, so the Cast between them and their fp32 consumers was invalid.  Now "auto" reaches
opset 13 (Cast's first bf16 opset) and an opset that stays lower ("keep", an explicit one) keeps the
inputs/outputs fp32 with a note.  Every conversion goes through the ``convert`` fixture: full checker,
onnxruntime load (through the emulation), idempotence, input left untouched.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from amp_pass.opset import casts_accept, required_opset
from tests.amp_pass import graphs as G
from tests.amp_pass.models import emulated_cosines, proto_graphs, random_feeds

BF16 = "tensor(bfloat16)"


def _opset(m: onnx.ModelProto) -> int:
    return next(o.version for o in m.opset_import if o.domain in ("", "ai.onnx"))


def relu_exp(opset: int) -> onnx.ModelProto:
    """Relu -> Exp: no ALLOW op under the default policy (Exp is DENY)."""
    g = h.make_graph([h.make_node("Relu", ["X"], ["r"], name="relu"), h.make_node("Exp", ["r"], ["Y"], name="exp")],
                     "main", [h.make_tensor_value_info("X", T.FLOAT, [2, 4])],
                     [h.make_tensor_value_info("Y", T.FLOAT, [2, 4])])
    return G.model(g, opset)


def if_inside_loop(opset: int) -> onnx.ModelProto:
    """``graphs.if_inside_loop`` (Loop body holding an If over outer weights) at ``opset``."""
    return G.model(G.if_inside_loop().graph, opset)


@pytest.fixture
def deny_matmul(tmp_path: Path) -> str:
    path = tmp_path / "deny_matmul.toml"
    path.write_text('[ops]\ndeny = ["MatMul"]\n')
    return str(path)


def _io_types(m: onnx.ModelProto) -> set[int]:
    return {v.type.tensor_type.elem_type for v in (*m.graph.input, *m.graph.output)}


def _cast_types(m: onnx.ModelProto) -> set[int]:
    return {a.i for g in proto_graphs(m.graph) for n in g.node if n.op_type == "Cast" for a in n.attribute}


@pytest.mark.parametrize("opset", [11, 12])
@pytest.mark.parametrize("case", ["relu_exp", "if_inside_loop"])
def test_auto_reaches_the_cast_opset_for_low_io(convert, deny_matmul: str, opset: int, case: str) -> None:
    m = relu_exp(opset) if case == "relu_exp" else if_inside_loop(opset)
    policy = "default" if case == "relu_exp" else deny_matmul
    r = convert(m, "bf16", keep_io_types=False, policy=policy)
    d = r.report.to_dict()
    assert (d["opset_in"], d["opset_out"]) == (opset, 13) and _opset(r.model) == 13
    assert d["notes"] == [] and d["compute_low"] == 0
    # what --no-keep-io-types asks for: the float inputs become bf16 (outputs carry what their
    # producers make, here fp32 Exp/Tanh)
    assert {v.type.tensor_type.elem_type for v in r.model.graph.input} == {T.BFLOAT16}
    cos = emulated_cosines(m, r.model, random_feeds(m))
    assert cos and min(cos.values()) >= 0.99, cos


@pytest.mark.parametrize("opset", [11, 12])
@pytest.mark.parametrize("case", ["relu_exp", "if_inside_loop"])
@pytest.mark.parametrize("target", ["keep", "explicit"])
def test_an_opset_below_13_keeps_fp32_io_with_a_note(convert, deny_matmul: str, opset: int, case: str,
                                                      target: str) -> None:
    m = relu_exp(opset) if case == "relu_exp" else if_inside_loop(opset)
    policy = "default" if case == "relu_exp" else deny_matmul
    r = convert(m, "bf16", keep_io_types=False, policy=policy, target_opset="keep" if target == "keep" else opset)
    d = r.report.to_dict()
    assert (d["opset_in"], d["opset_out"]) == (opset, opset) and _opset(r.model) == opset
    assert d["notes"] == [f"inputs and outputs kept fp32: Cast cannot carry bf16 at opset {opset} "
                          "(keep_io_types=False needs a later opset; --opset auto reaches it)"]
    assert d["keep_io_types"] is True
    assert _io_types(r.model) == {T.FLOAT} and T.BFLOAT16 not in _cast_types(r.model)


def test_with_allow_ops_at_a_kept_low_opset_everything_stays_fp32(convert) -> None:
    """MatMul is ALLOW but takes bf16 only from 13: at a kept opset 12 no bf16 value may appear."""
    r = convert(G.model(G.if_inside_loop().graph, 12), "bf16", keep_io_types=False, target_opset="keep")
    assert _io_types(r.model) == {T.FLOAT} and T.BFLOAT16 not in _cast_types(r.model)
    assert r.report.compute_low == 0


def test_the_planner_needs_cast_only_for_low_io() -> None:
    m = relu_exp(11)
    never = lambda _op, _name: False  # noqa: E731 - no ALLOW op
    assert required_opset(m, BF16, never) == 11
    assert required_opset(m, BF16, never, low_io=True) == 13
    assert required_opset(relu_exp(17), BF16, never, low_io=True) == 17
    assert required_opset(m, "tensor(float16)", never, low_io=True) == 11  # fp16 Casts exist at every opset
    assert [v for v in range(7, 23) if casts_accept(v, BF16)][0] == 13


def test_fp16_low_io_at_opset_11_is_unchanged(convert) -> None:
    """fp16 is carried by Cast at every opset: no upgrade, no note, an fp16 input."""
    r = convert(relu_exp(11), "fp16", keep_io_types=False)
    assert (r.report.opset_out, r.report.notes) == (11, [])
    assert r.model.graph.input[0].type.tensor_type.elem_type == T.FLOAT16
