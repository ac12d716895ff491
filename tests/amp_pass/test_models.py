"""Acceptance on real models: registry models and the light topologies shipped inside onnx.

Each converts at fp16 and bf16, passes the full checker, loads in onnxruntime (bf16 through its
emulation: the CPU provider has no bf16 kernels), is idempotent, reaches cosine >= 0.999 (fp16) /
>= 0.99 (bf16) on every float output under faithful emulation, and has >= 90% of its compute nodes
in low precision or a reason for each one kept fp32.
"""

from __future__ import annotations

import os

import onnx
import pytest

from amp_pass.policy import compute_op_types
from tests.amp_pass.models import LOGITS, emulated_cosines, light_model, light_names, random_feeds

COS = {"fp16": 0.999, "bf16": 0.99}
#: Pre-softmax logits exposed by light_model are not model outputs: deep random-weight networks are
#: chaotic (they amplify any perturbation), so they get a looser bound that still catches overflow.
LOGITS_COS = {"fp16": 0.995, "bf16": 0.98}
DIMS = {"x": [1, 3, 48, 320], "input": [1, 512], "state": [2, 1, 128]}
#: Light topologies whose fully-connected weights are hundreds of MB: minutes on a 2-core machine.
HUGE = {"light_vgg19", "light_zfnet512", "light_bvlc_alexnet"}
RUN_HUGE = os.environ.get("AMPCI_SLOW_TESTS") == "1"


def _coverage_ok(report: dict, dtype: str) -> None:
    frac = report["low_precision_compute_fraction"]
    kept = [k for k in report["kept_fp32"] if k["op_type"] in compute_op_types()]
    assert report["compute_nodes"] - report["compute_low"] == len(kept)
    if frac < 0.9:
        assert kept and all(k["reason"] for k in kept), report
    for k in kept:  # every exception names its cause
        assert any(word in k["reason"] for word in ("schema", "range", "underflow", "DENY", "override")), k


def _accept(convert, model: onnx.ModelProto, dtype: str, feeds: dict, accuracy: bool = True) -> dict:
    result = convert(model, dtype)
    report = result.report.to_dict()
    _coverage_ok(report, dtype)
    if accuracy:
        cos = emulated_cosines(model, result.model, feeds)
        logits = {p.key[len(LOGITS):] for p in model.metadata_props if p.key.startswith(LOGITS)}
        assert cos and all(c >= (LOGITS_COS if n in logits else COS)[dtype] for n, c in cos.items()), cos
    return report


@pytest.mark.realmodel
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("name", ["silero_vad", "ppocr_v4_rec", "ppocr_mobile_cls"])
def test_real_model(convert, real_model_path, name: str, dtype: str) -> None:
    model = onnx.load(str(real_model_path(name)))
    feeds = random_feeds(model, seed=1, dims=DIMS, ints={"sr": 16000})
    if "state" in feeds:
        feeds["state"] *= 0.5
    report = _accept(convert, model, dtype, feeds)
    assert report["low_precision_compute_fraction"] >= 0.9, report["kept_fp32"]
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    assert report["opset_in"] == opset and report["notes"] == []
    # bf16 Conv/LSTM need opset 22, so "auto" upgrades (If bodies included); fp16 keeps the opset
    assert report["opset_out"] == (22 if dtype == "bf16" else opset)


#: bf16 Conv needs opset 22: the light topologies (opset 9) are upgraded by target_opset="auto";
#: three small topologies cover it.
LIGHT_CASES = [(n, "fp16") for n in light_names()] + [
    (n, "bf16") for n in ("light_squeezenet", "light_shufflenet", "light_inception_v1") if n in light_names()]


@pytest.mark.parametrize(("name", "dtype"), LIGHT_CASES)
def test_light_model(convert, name: str, dtype: str) -> None:
    if name in HUGE and not RUN_HUGE:
        pytest.skip(f"{name} has hundreds of MB of weights (minutes here); set AMPCI_SLOW_TESTS=1, "
                    "or see bench/bench_convert.py --light")
    model = light_model(name)
    report = _accept(convert, model, dtype, random_feeds(model))
    assert report["low_precision_compute_fraction"] >= 0.9, report["kept_fp32"]
    assert report["opset_out"] == (22 if dtype == "bf16" else report["opset_in"])


def test_bf16_keep_opset_respects_schemas(convert) -> None:
    """With ``target_opset="keep"`` an opset-9 model keeps its opset and every compute op stays fp32
    for the schema's reason (bf16 Conv arrives at opset 22)."""
    model = light_model("light_squeezenet")
    report = convert(model, "bf16", target_opset="keep").report.to_dict()
    assert report["opset_in"] == report["opset_out"] == 9
    kept = [k for k in report["kept_fp32"] if k["op_type"] in compute_op_types()]
    assert kept and len(kept) == report["compute_nodes"]
    assert all("schema" in k["reason"] for k in kept)
