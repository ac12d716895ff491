"""Opset planning (``ConversionOptions.target_opset``): bf16 needs late opsets, "auto" upgrades to them.

Every conversion goes through the ``convert`` fixture: full checker, onnxruntime load (bf16 through
the emulation), idempotence and no mutation of the input.
"""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto as T

from amp_pass import ConversionOptions, OptionsError, convert_model
from amp_pass import opset as opset_mod
from tests.amp_pass import graphs as G
from tests.amp_pass.models import emulated_cosines, random_feeds


def _opset(m: onnx.ModelProto) -> int:
    return next(o.version for o in m.opset_import if o.domain in ("", "ai.onnx"))


def _compute_kept(report: dict) -> list[tuple[str, str]]:
    return [(k["node"], k["reason"]) for k in report["kept_fp32"] if k["op_type"] in ("Conv", "MatMul")]


def test_auto_upgrades_subgraphs_for_bf16(convert) -> None:
    m = G.conv_loop_if(11)
    r = convert(m, "bf16")
    d = r.report.to_dict()
    assert (d["opset_in"], d["opset_out"], d["notes"]) == (11, 22, [])
    assert _opset(r.model) == 22 and r.model.ir_version >= 10
    assert d["compute_low"] == d["compute_nodes"] == 3, _compute_kept(d)  # Conv + the two branch MatMuls
    # the version converter rewrote the Unsqueeze/Squeeze inside the If branch (axes became an input)
    loop = next(n for n in r.model.graph.node if n.op_type == "Loop")
    body_if = next(n for n in loop.attribute[0].g.node if n.op_type == "If")
    then_g = next(a.g for a in body_if.attribute if a.name == "then_branch")
    assert [len(n.input) for n in then_g.node if n.op_type in ("Unsqueeze", "Squeeze")] == [2, 2]
    assert {o.type.tensor_type.elem_type for b in body_if.attribute for o in b.g.output} == {T.BFLOAT16}
    cos = emulated_cosines(m, r.model, random_feeds(m))
    assert cos and min(cos.values()) >= 0.99, cos


def test_fp16_auto_keeps_the_opset_and_keep_is_byte_identical(convert) -> None:
    m = G.conv_loop_if(11)
    auto = convert(m, "fp16")
    assert (auto.report.opset_in, auto.report.opset_out) == (11, 11) and _opset(auto.model) == 11
    keep = convert_model(m, ConversionOptions(dtype="fp16", target_opset="keep"))
    assert keep.model.SerializeToString() == auto.model.SerializeToString()


def test_auto_picks_the_lowest_opset_the_allow_ops_need(convert) -> None:
    r12 = convert(G.shared_input(opset=12), "bf16")  # MatMul accepts bf16 from 13: no need for 22
    assert (r12.report.opset_in, r12.report.opset_out) == (12, 13)
    assert _compute_kept(r12.report.to_dict()) == []
    already = convert(G.shared_input(opset=17), "bf16")
    assert (already.report.opset_in, already.report.opset_out) == (17, 17)


def test_explicit_target_opset(convert) -> None:
    r = convert(G.conv_loop_if(11), "fp16", target_opset=18)
    assert (r.report.opset_in, r.report.opset_out) == (11, 18) and _opset(r.model) == 18
    for bad in (0, 99, "latest", 13.0):
        with pytest.raises(OptionsError):
            convert_model(G.conv_loop_if(11), ConversionOptions(dtype="bf16", target_opset=bad))  # type: ignore


def test_failed_upgrade_keeps_the_opset_with_a_note(convert, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(model: onnx.ModelProto, target: int) -> onnx.ModelProto:
        raise RuntimeError("No Adapter For Frobnicate\nsecond line")

    monkeypatch.setattr(opset_mod.version_converter, "convert_version", broken)
    r = convert(G.conv_loop_if(11), "bf16")
    d = r.report.to_dict()
    assert (d["opset_in"], d["opset_out"]) == (11, 11) and _opset(r.model) == 11
    assert d["notes"] == ["opset upgrade 11 -> 22 failed, kept opset 11: No Adapter For Frobnicate"]
    kept = _compute_kept(d)
    assert len(kept) == 3 and all("schema" in why for _, why in kept)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_large_constant_nodes_keep_their_place(convert, dtype: str) -> None:
    """Large main-graph Constants (W, 1 KiB; B is small and stays) skip the checker/inference skeleton
    and come back as Constant nodes: in place without an upgrade (fp16), at the top of the graph after
    one (bf16: opset 12 -> 13)."""
    m = G.large_constants(12)
    r = convert(m, dtype)
    order = [n.name for n in r.model.graph.node if n.name in ("relu", "const_w", "mm0", "const_b", "add_b")]
    if dtype == "fp16":
        assert order == ["relu", "const_w", "mm0", "const_b", "add_b"]
    else:
        assert r.report.opset_out == 13 and order == ["const_w", "relu", "mm0", "const_b", "add_b"]
    assert [o.name for o in r.model.graph.output] == ["Y", "W"]
    assert r.model.graph.output[1].type.tensor_type.elem_type == T.FLOAT  # keep_io_types
    d = r.report.to_dict()
    assert d["compute_low"] == d["compute_nodes"] == 2, _compute_kept(d)
    cos = emulated_cosines(m, r.model, random_feeds(m))
    assert cos and min(cos.values()) >= (0.999 if dtype == "fp16" else 0.99), cos
