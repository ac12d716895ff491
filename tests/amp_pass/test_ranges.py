"""Range safety of constants: ``ranges.range_problem`` against a direct statement of its rule."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx_ir as ir
import pytest

from amp_pass.ranges import UNDERFLOW_NORM_FRACTION, check_and_convert, range_problem

LOWS = {ir.DataType.FLOAT16: np.finfo(np.float16), ir.DataType.BFLOAT16: ml_dtypes.finfo(ml_dtypes.bfloat16)}


def spec(array: np.ndarray, low: ir.DataType) -> tuple[str, float] | None:
    """The rule written out plainly: judge the finite values; overflow when the largest magnitude
    exceeds the dtype's max; underflow when the values at most half the smallest subnormal (they round
    to zero) carry more than UNDERFLOW_NORM_FRACTION of the norm.  Returns (kind, figure) or None."""
    info = LOWS[low]
    mags = np.abs(array[np.isfinite(array)]).astype(np.float64)
    if mags.size == 0:
        return None
    if mags.max() > float(info.max):
        return "range", float(mags.max())
    flushed = mags[(mags > 0) & (mags <= float(info.smallest_subnormal) / 2)]
    lost, total = float(np.linalg.norm(flushed)), float(np.linalg.norm(mags))
    if flushed.size and lost > UNDERFLOW_NORM_FRACTION * total:
        return "underflow", float(flushed.size)
    return None


def cases() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    normal = rng.standard_normal(5000).astype(np.float32)
    return {
        "normal": normal,
        "overflow": np.array([1.0, -7e4, 3.0], dtype=np.float32),
        "just_over_fp16": np.array([65504.0, 65505.0], dtype=np.float32),
        "inf_and_small": np.array([np.inf, 2.0, -np.inf], dtype=np.float32),
        "inf_and_large": np.array([np.inf, 1e5], dtype=np.float32),
        "nan_only": np.array([np.nan, np.nan], dtype=np.float32),
        "bulk_underflow": np.full((3, 4), 1e-9, dtype=np.float32) * np.array([1, -1, 1, -1], dtype=np.float32),
        "few_tiny": np.concatenate([normal, np.array([1e-9, -1e-9], dtype=np.float32)]),
        "negative_zero": np.array([-0.0, 0.0, 1.0], dtype=np.float32),
        "bf16_underflow": np.full(16, 1e-40, dtype=np.float32),
        "mixed_nan_tiny": np.array([np.nan, 1e-9, 1e-9, 2e-9], dtype=np.float32),
    }


@pytest.mark.parametrize("low", list(LOWS), ids=["fp16", "bf16"])
@pytest.mark.parametrize("name", list(cases()))
def test_range_problem_follows_the_rule(name: str, low: ir.DataType) -> None:
    array = cases()[name]
    want = spec(array, low)
    got = range_problem(array, low, "constant 'c'")
    if want is None:
        assert got is None
        return
    kind, figure = want
    assert got is not None and got.startswith(kind)
    if kind == "range":
        assert f"max |x|={figure:.3g}" in got
    else:
        assert f"has {int(figure)}/{np.isfinite(array).sum()} non-zero values" in got


@pytest.mark.parametrize("low", list(LOWS), ids=["fp16", "bf16"])
@pytest.mark.parametrize("name", list(cases()))
def test_check_and_convert_agrees(name: str, low: ir.DataType) -> None:
    """No problem ⇒ the exact ``astype`` conversion is returned; a problem ⇒ nothing converted.
    (Non-finite arrays are left unconverted even when their finite part is fine.)"""
    array = cases()[name]
    problem, converted = check_and_convert(array, low, "constant 'c'")
    assert problem == range_problem(array, low, "constant 'c'") or not np.isfinite(array).all() and problem is None
    if problem is not None or not np.isfinite(array).all():
        assert converted is None
    else:
        expected = array.astype(np.float16 if low is ir.DataType.FLOAT16 else ml_dtypes.bfloat16)
        assert converted is not None and converted.tobytes() == expected.tobytes()


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_subnormal_weights_keep_their_consumer_fp32(convert, dtype: str) -> None:
    """A weight of fp32 subnormals (its float32 sum of squares is 0) flushes to zero in both dtypes:
    its Conv stays fp32 with an underflow reason, the other Conv goes low (a ZeroDivisionError once)."""
    from onnx import TensorProto, helper
    from onnx import numpy_helper as nh

    from tests.amp_pass.graphs import model

    f = TensorProto.FLOAT
    rng = np.random.default_rng(3)
    g = helper.make_graph(
        [helper.make_node("Conv", ["X", "W"], ["a"], name="conv_ok"),
         helper.make_node("Conv", ["a", "Wsub"], ["Y"], name="conv_subnormal")],
        "main", [helper.make_tensor_value_info("X", f, [1, 2, 3, 3])], [helper.make_tensor_value_info("Y", f, [1, 2, 3, 3])],
        [nh.from_array(rng.standard_normal((2, 2, 1, 1)).astype(np.float32), "W"),
         nh.from_array(np.full((2, 2, 1, 1), 1e-42, np.float32), "Wsub")])
    report = convert(model(g, 17), dtype).report.to_dict()
    kept = {k["node"]: k["reason"] for k in report["kept_fp32"]}
    assert kept["conv_subnormal"].startswith("underflow") and "4/4 non-zero values" in kept["conv_subnormal"]
    assert "conv_ok" not in kept
