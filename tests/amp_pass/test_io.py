"""File conversion: external data stays external, atomic writes, report consistency."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from amp_pass import ConversionOptions, convert_file
from amp_pass.errors import InvalidModelError
from tests.amp_pass.models import assert_valid, cosine, run_fp32


def _external_model(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    w = nh.from_array((rng.standard_normal((64, 64)) * 0.1).astype(np.float32), "W")
    g = h.make_graph([h.make_node("MatMul", ["X", "W"], ["a"], name="mm"),
                      h.make_node("Relu", ["a"], ["Y"], name="relu")], "g",
                     [h.make_tensor_value_info("X", T.FLOAT, [2, 64])], [h.make_tensor_value_info("Y", T.FLOAT, [2, 64])],
                     [w])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
    src = tmp_path / "src" / "model.onnx"
    src.parent.mkdir()
    onnx.save(m, str(src), save_as_external_data=True, location="model.onnx.data", size_threshold=0)
    return src


def test_external_data_stays_external(tmp_path: Path) -> None:
    src = _external_model(tmp_path)
    dst = tmp_path / "out" / "model16.onnx"
    report = convert_file(src, dst, ConversionOptions(dtype="fp16"))
    assert report.compute_low == 1 and report.seconds > 0
    assert (dst.parent / "model16.onnx.data").is_file()
    raw = onnx.load(str(dst), load_external_data=False)
    assert all(t.data_location == T.EXTERNAL for t in raw.graph.initializer)
    converted = onnx.load(str(dst))
    assert_valid(converted, "fp16")
    feeds = {"X": np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32)}
    assert cosine(run_fp32(onnx.load(str(src)), feeds)["Y"], run_fp32(converted, feeds)["Y"]) >= 0.999
    assert sorted(p.name for p in dst.parent.iterdir()) == ["model16.onnx", "model16.onnx.data"]


def test_report_accounts_for_every_float_node(tmp_path: Path, real_model_path) -> None:
    src = real_model_path("ppocr_mobile_cls")
    report = convert_file(src, tmp_path / "cls.onnx", ConversionOptions(dtype="fp16")).to_dict()
    low = sum(c["low"] for c in report["by_op_type"].values())
    fp32 = sum(c["fp32"] for c in report["by_op_type"].values())
    assert low == report["nodes_low"] and fp32 == len(report["kept_fp32"])
    assert all(k["reason"] and k["graph"] and k["op_type"] for k in report["kept_fp32"])
    assert 0 < report["low_precision_compute_fraction"] <= 1


def test_large_model_path_keeps_tensors_external(tmp_path: Path, monkeypatch) -> None:
    """Models beyond one protobuf go through onnx-ir with lazy tensors (forced here by a tiny limit)."""
    import amp_pass.io as amp_io

    monkeypatch.setattr(amp_io, "LARGE_BYTES", 1)
    src = _external_model(tmp_path)
    dst = tmp_path / "big" / "m.onnx"
    report = convert_file(src, dst, ConversionOptions(dtype="fp16"))
    assert report.compute_low == 1
    assert (dst.parent / "m.onnx.data").is_file()
    assert_valid(onnx.load(str(dst)), "fp16")


def test_large_model_path_rejects_what_the_full_checker_rejects(tmp_path: Path, monkeypatch) -> None:
    """The streamed path checks its input as prepare does: a mistyped output is one line, nothing written."""
    import amp_pass.io as amp_io

    monkeypatch.setattr(amp_io, "LARGE_BYTES", 1)
    src = _external_model(tmp_path)
    m = onnx.load(str(src), load_external_data=False)
    m.graph.output[0].type.tensor_type.elem_type = onnx.TensorProto.DOUBLE
    onnx.save(m, str(src))
    dst = tmp_path / "big" / "m.onnx"
    with pytest.raises(InvalidModelError, match="checker") as err:
        convert_file(src, dst, ConversionOptions(dtype="fp16"))
    assert "\n" not in str(err.value) and not dst.exists()
