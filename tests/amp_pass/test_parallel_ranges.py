"""The threaded range check of large constants (``Painter._prefetch_large``) changes nothing but speed."""

from __future__ import annotations

import threading

import numpy as np
import onnx
import pytest
from onnx import numpy_helper as nh

from amp_pass import ConversionOptions, convert_model
from amp_pass import paint as paint_mod
from amp_pass.errors import InvalidModelError
from tests.amp_pass import graphs as G
from tests.amp_pass.models import assert_valid, emulated_cosines, random_feeds


def _convert(model: onnx.ModelProto, dtype: str, workers: int, monkeypatch: pytest.MonkeyPatch
             ) -> tuple[onnx.ModelProto, dict, set[bool]]:
    """Convert with ``workers`` threads; also say whether the checks ran off the main thread."""
    off_main: set[bool] = set()
    check = paint_mod.check_and_convert

    def spy(array: np.ndarray, low, what: str):  # noqa: ANN001, ANN202 - same signature as the spied function
        off_main.add(threading.current_thread() is not threading.main_thread())
        return check(array, low, what)

    monkeypatch.setattr(paint_mod, "LARGE_WORKERS", workers)
    monkeypatch.setattr(paint_mod, "check_and_convert", spy)
    result = convert_model(model, ConversionOptions(dtype=dtype))
    monkeypatch.undo()
    report = result.report.to_dict()
    report.pop("seconds")
    return result.model, report, off_main


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_threaded_range_check_changes_nothing(dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model = G.big_weights()
    serial, serial_report, serial_threads = _convert(model, dtype, 1, monkeypatch)
    threaded, threaded_report, threaded_threads = _convert(model, dtype, 2, monkeypatch)
    assert serial_threads == {False}
    assert True in threaded_threads  # the large weights were checked on the pool
    assert threaded.SerializeToString(deterministic=True) == serial.SerializeToString(deterministic=True)
    assert threaded_report == serial_report
    assert_valid(threaded, dtype)
    reasons = {k["node"]: k["reason"] for k in threaded_report["kept_fp32"]}
    if dtype == "fp16":
        assert reasons["mm_huge"].startswith("range")
        assert reasons["mm_tiny"].startswith("underflow")
    else:  # 1e5 and 1e-9 are both within bf16's range
        assert "mm_huge" not in reasons and "mm_tiny" not in reasons
    assert "deny_sum" in reasons
    again = convert_model(threaded, ConversionOptions(dtype=dtype)).model
    assert again.SerializeToString(deterministic=True) == threaded.SerializeToString(deterministic=True)
    feeds = random_feeds(model, seed=3)
    for name, cos in emulated_cosines(model, threaded, feeds).items():
        assert cos >= (0.999 if dtype == "fp16" else 0.99), (name, cos)


def test_unreadable_large_weight_is_the_same_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """A weight over the input check's size limit whose data is short fails when the pass reads it,
    with the same one-line error whether or not the pool read it first."""
    model = G.big_weights()
    bad = next(t for t in model.graph.initializer if t.name == "W1")
    bad.raw_data = bad.raw_data[:-4]
    errors = []
    for workers in (1, 2):
        monkeypatch.setattr(paint_mod, "LARGE_WORKERS", workers)
        with pytest.raises(InvalidModelError) as info:
            convert_model(model, ConversionOptions())
        errors.append(str(info.value))
    assert errors[0] == errors[1]
    assert "W1" in errors[0] and len(errors[0].splitlines()) == 1
    assert nh.to_array(next(t for t in model.graph.initializer if t.name == "W0")).shape == (512, 512)
