"""A Loop/Scan state that starts from a constant the low dtype cannot hold stays fp32, and so do the body
nodes reading it (the constant check used to see only direct readers: a Loop starting from 1e5 became inf
in fp16 with the default policy)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

from amp_pass import ConversionResult
from tests.amp_pass.models import run_fp32

n = helper.make_node


def _loop_model(start: float) -> onnx.ModelProto:
    """y = Loop(2 steps: v <- v + x @ w) from v0 = start * I, then + x; the body's MatMul is ALLOW."""
    body = helper.make_graph(
        [n("MatMul", ["x", "w"], ["mm"]), n("Add", ["v", "mm"], ["v_out"]), n("Identity", ["c"], ["c_out"])],
        "body", [helper.make_tensor_value_info("i", T.INT64, []), helper.make_tensor_value_info("c", T.BOOL, []),
                 helper.make_tensor_value_info("v", T.FLOAT, [2, 2])],
        [helper.make_tensor_value_info("c_out", T.BOOL, []), helper.make_tensor_value_info("v_out", T.FLOAT, [2, 2])])
    g = helper.make_graph(
        [n("Loop", ["trip", "cond", "v0"], ["vf"], body=body), n("Add", ["vf", "x"], ["y"])], "loop_state",
        [helper.make_tensor_value_info("x", T.FLOAT, [2, 2])], [helper.make_tensor_value_info("y", T.FLOAT, [2, 2])],
        [helper.make_tensor("trip", T.INT64, [], [2]), helper.make_tensor("cond", T.BOOL, [], [True]),
         helper.make_tensor("v0", T.FLOAT, [2, 2], [start, 0, 0, start]),
         helper.make_tensor("w", T.FLOAT, [2, 2], [0.5, 0.25, -0.25, 0.5])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(m, full_check=True)
    return m


def _scan_model(start: float) -> onnx.ModelProto:
    """Scan over 3 rows of x with state s <- s + row @ w, starting from start."""
    body = helper.make_graph(
        [n("MatMul", ["row", "w"], ["mm"]), n("Add", ["s", "mm"], ["s_out"]), n("Identity", ["mm"], ["scan_out"])],
        "sbody", [helper.make_tensor_value_info("s", T.FLOAT, [2]), helper.make_tensor_value_info("row", T.FLOAT, [2])],
        [helper.make_tensor_value_info("s_out", T.FLOAT, [2]), helper.make_tensor_value_info("scan_out", T.FLOAT, [2])])
    g = helper.make_graph(
        [n("Scan", ["s0", "x"], ["sf", "rows"], body=body, num_scan_inputs=1)], "scan_state",
        [helper.make_tensor_value_info("x", T.FLOAT, [3, 2])],
        [helper.make_tensor_value_info("sf", T.FLOAT, [2]), helper.make_tensor_value_info("rows", T.FLOAT, [3, 2])],
        [helper.make_tensor("s0", T.FLOAT, [2], [start, -start]),
         helper.make_tensor("w", T.FLOAT, [2, 2], [0.5, 0.25, -0.25, 0.5])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(m, full_check=True)
    return m


def _emulated(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    from workers.measure.emulation_rewrite import emulate_model

    return run_fp32(emulate_model(model), feeds)


@pytest.mark.parametrize("build,feeds", [
    (_loop_model, {"x": np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)}),
    (_scan_model, {"x": np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], np.float32)}),
])
def test_state_starting_beyond_fp16_stays_fp32(convert: Callable[..., ConversionResult], build, feeds) -> None:
    model = build(1e5)
    res = convert(model, "fp16")  # full checker, onnxruntime, idempotence
    ref, got = run_fp32(model, feeds), _emulated(res.model, feeds)
    for name in ref:
        assert np.isfinite(got[name]).all(), name
        np.testing.assert_allclose(got[name], ref[name], rtol=1e-3)
    reasons = " | ".join(k.reason for k in res.report.kept_fp32)
    assert "state 0, which starts from range" in reasons
    # the same model from an in-range start still runs its body in fp16 (the rule is about the start only)
    small = convert(build(1.0), "fp16").report
    assert small.compute_low == small.compute_nodes == 1


def test_bf16_holds_the_same_start(convert: Callable[..., ConversionResult]) -> None:
    res = convert(_loop_model(1e5), "bf16")  # bf16's range holds 1e5: nothing kept for it
    assert res.report.compute_low == res.report.compute_nodes == 1
