"""The accuracy-guided search (policy auto) on built models and on the real zoo models."""

from __future__ import annotations

import math

import onnx
import pytest

from amp_pass import ConversionOptions
from tests.auto.conftest import assert_valid
from tests.auto.models import feeds_for, loop_if_hot, overflow_chain
from workers.measure.autosearch import Tolerance, ToleranceError, auto_search
from workers.measure.calibrate import collect_ranges


def _search(model: onnx.ModelProto, **kw: object):  # type: ignore[no-untyped-def]
    return auto_search(model, [feeds_for(model)], ConversionOptions(policy="auto"), **kw)  # type: ignore[arg-type]


def test_auto_meets_tolerance_where_default_fails_keeping_most_compute_low() -> None:
    model = overflow_chain(layers=10, hot=3)
    found = _search(model)
    assert not found.default.met and math.isinf(found.default.max_abs)
    assert found.met and found.final.cosine >= 0.9995
    assert found.forced == ["m3"]  # the unnamed MatMul whose activations overflow fp16
    report = found.result.report  # type: ignore[union-attr]
    assert report.low_precision_compute_fraction >= 0.8
    assert report.policy == "auto"
    assert any(k.reason.startswith("auto: calibration: output 'm3'") for k in report.kept_fp32)
    assert_valid(found.result.model)  # type: ignore[union-attr]
    d = found.to_dict()
    assert d["forced_fp32"][0]["node"] == "m3" and d["evaluations"] == len(d["steps"]) >= 2


def test_search_without_calibration_flags_uses_sensitivity_and_is_deterministic(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def no_disk(*args: object, **kwargs: object) -> None:
        raise AssertionError("the search must work in memory")

    monkeypatch.setattr(onnx, "save", no_disk)
    monkeypatch.setattr(onnx, "save_model", no_disk)
    model = overflow_chain(layers=10, hot=5)
    feeds = feeds_for(model)
    # an overflow margin no value reaches: the ranking comes only from the measured error jumps
    calibration = collect_ranges(model, [feeds], keep_arrays=True, overflow_margin=1e9)
    runs = [auto_search(model, [feeds], ConversionOptions(policy="auto"), calibration=calibration)
            for _ in range(2)]
    assert runs[0].met and runs[0].forced == ["m5"]
    assert runs[0].forced == runs[1].forced
    assert [(s.phase, s.forced, s.met, s.cosine) for s in runs[0].steps] == \
        [(s.phase, s.forced, s.met, s.cosine) for s in runs[1].steps]
    assert "search: local error jump" in runs[0].reasons["m5"]


def test_search_on_subgraphs_forces_body_nodes() -> None:
    found = _search(loop_if_hot())
    assert found.met
    assert set(found.forced) == {"h_last::body::u", "h_last::body::hb::then_branch::z"}
    assert found.final.compute_low == found.final.compute_nodes - 2
    assert_valid(found.result.model)  # type: ignore[union-attr]


def test_unreachable_tolerance_returns_the_most_accurate_set_never_worse_than_default() -> None:
    model = overflow_chain(layers=4, hot=1, width=64)
    found = _search(model, tolerance=Tolerance(cosine=1.5), max_steps=8)  # cosine never exceeds 1
    assert not found.met
    assert len(found.steps) <= 8
    assert found.final.error_key() <= found.default.error_key()


def test_tolerance_parsing() -> None:
    t = Tolerance.parse("cosine=0.999, max_abs=1e-2")
    assert (t.cosine, t.max_abs, t.snr_db) == (0.999, 0.01, None)
    assert str(t) == "cosine=0.999,max_abs=0.01"
    for bad in ("cos=1", "cosine=x", "", "cosine"):
        with pytest.raises(ToleranceError):
            Tolerance.parse(bad)


@pytest.mark.parametrize(("name", "dtype", "tolerance"), [
    ("silero_vad", "fp16", None), ("silero_vad", "bf16", None), ("ppocr_mobile_cls", "fp16", None),
    ("ppocr_v4_rec", "fp16", None),
    ("ppocr_mobile_cls", "fp16", "cosine=0.9999999"),  # stricter than the default painting reaches: a search
])
def test_real_models_auto_never_worse_than_default(name: str, dtype: str, tolerance: str | None,
                                                   real_model_path) -> None:  # type: ignore[no-untyped-def]
    from workers.zoo.inputs import make_feeds
    from workers.zoo.manifest import load_zoo

    entry = load_zoo().get(name)
    model = onnx.load(str(real_model_path(name)))
    # bf16 at the model's opset: the "auto" upgrade to opset 22 gives Conv(22) nodes that onnxruntime 1.31's
    # CPU provider has no kernel for, so no bf16 conversion of a conv model could be measured at all
    options = ConversionOptions(dtype=dtype, policy="auto", target_opset="keep" if dtype == "bf16" else "auto")
    found = auto_search(model, [make_feeds(entry, entry.seed)], options,
                        Tolerance.parse(tolerance) if tolerance else None, max_steps=6)
    assert found.final.error_key() <= found.default.error_key()
    assert found.met or not found.default.met
    assert len(found.steps) <= 6
    if found.default.met:
        assert found.forced == [] and found.final.compute_low == found.default.compute_low
    else:
        assert tolerance is not None and found.forced and found.final.cosine > found.default.cosine
    assert_valid(found.result.model)  # type: ignore[union-attr]
