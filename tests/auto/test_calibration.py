"""Calibration: ranges measured inside If/Loop bodies, the rules that keep nodes fp32, forced keys."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from amp_pass import ConversionOptions, OptionsError, convert_model
from amp_pass.calibration import CalibrationRanges, ValueRange, graph_scopes, node_key
from amp_pass.prepare import prepare
from tests.auto.conftest import assert_valid
from tests.auto.models import feeds_for, loop_if_hot, overflow_chain, scan_hot
from workers.measure.calibrate import collect_ranges
from workers.measure.emulation import run_emulated
from workers.measure.metrics import output_metrics


def _kept(result: object) -> dict[str, str]:
    return {k.reason.split("'")[1]: k.reason for k in result.report.kept_fp32  # type: ignore[attr-defined]
            if k.reason.startswith("calibration")}


def test_ranges_cover_loop_and_if_bodies_aggregated_over_iterations() -> None:
    model = loop_if_hot()
    feeds = feeds_for(model)
    one = collect_ranges(model, [feeds]).ranges.values
    # the loop body's hot MatMul and the then-branch's MatMul are measured, keyed by scope
    assert one["h_last::body::u"].absmax > 65504
    assert one["h_last::body::hb::then_branch::z"].absmax > 65504
    assert "h_last::body::hb::else_branch::z" not in one  # branch never taken: no observation
    # counts aggregate every iteration (trip=4 iterations of a [1, 64] value)
    assert one["h_last::body::u"].count == 4 * 64
    more = dict(feeds, trip=np.array(7, np.int64))
    seven = collect_ranges(model, [more]).ranges.values
    assert seven["h_last::body::u"].count == 7 * 64
    both = collect_ranges(model, [feeds, more]).ranges.values
    assert both["h_last::body::u"].count == 11 * 64
    assert both["h_last::body::u"].absmax == max(one["h_last::body::u"].absmax, seven["h_last::body::u"].absmax)


def test_scan_body_ranges_and_rule() -> None:
    model = scan_hot()
    feeds = feeds_for(model)
    ranges = collect_ranges(model, [feeds]).ranges
    u = ranges.values["s_last::body::u"]
    assert u.count == 5 * 32 and u.absmax > 65504
    assert ranges.values["s_last::body::row"].count == 5 * 32  # body inputs are measured too
    options = ConversionOptions(calibration=ranges)
    result = convert_model(model, options)
    assert_valid(result.model)
    assert "u" in _kept(result)
    ref = run_emulated(model, feeds)
    assert output_metrics(ref["y"], run_emulated(result.model, feeds)["y"]).cosine > 0.9999
    assert output_metrics(ref["y"], run_emulated(convert_model(model).model, feeds)["y"]).cosine < 0.999
    again = convert_model(result.model, options)
    assert again.model.SerializeToString() == result.model.SerializeToString()


def test_keys_agree_between_proto_and_ir_and_are_unique() -> None:
    model = loop_if_hot()
    ir_model, _ = prepare(model, True)
    _, keys = graph_scopes(ir_model.graph)
    assert len(set(keys.values())) == len(keys)  # both If branches define 'z', keys still differ
    assert {"h_last::body::hb::then_branch::z", "h_last::body::hb::else_branch::z"} <= set(keys.values())
    assert node_key("", ["", "b"], "Split", 3) == "b"
    assert node_key("s::", ["", ""], "Dropout", 3) == "s::Dropout#3"


def test_calibration_keeps_overflowing_body_nodes_fp32_with_reason_valid_and_idempotent() -> None:
    model = loop_if_hot()
    feeds = feeds_for(model)
    ranges = collect_ranges(model, [feeds]).ranges
    options = ConversionOptions(calibration=ranges)
    plain = convert_model(model, ConversionOptions())
    result = convert_model(model, options)
    assert_valid(result.model)
    kept = _kept(result)
    assert set(kept) == {"u", "z"}, kept
    assert "observed |x| max 1.1" in kept["u"] and "exceeds 0.5 x fp16 max 65504" in kept["u"]
    assert result.report.compute_low == plain.report.compute_low - 2
    ref = run_emulated(model, feeds)
    before = output_metrics(ref["y"], run_emulated(plain.model, feeds)["y"])
    after = output_metrics(ref["y"], run_emulated(result.model, feeds)["y"])
    assert before.cosine < 0.99 and after.cosine > 0.9999
    again = convert_model(result.model, options)
    assert again.model.SerializeToString() == result.model.SerializeToString()
    assert again.report.casts_inserted == 0


def test_underflow_and_reduction_rules() -> None:
    model = overflow_chain(layers=3, hot=-1, width=64)
    ir_model, _ = prepare(model, True)
    _, keys = graph_scopes(ir_model.graph)
    assert {"m0", "m1"} <= set(keys.values())
    tiny = ValueRange(absmax=1e-8, count=256, nonzero=256, flush_fp16=200, flush_bf16=0)
    ranges = CalibrationRanges(values={"m1": tiny}, max_reduction=32)
    result = convert_model(model, ConversionOptions(calibration=ranges))
    assert_valid(result.model)
    reasons = [k.reason for k in result.report.kept_fp32]
    assert any("78% of its non-zero values flush to zero in fp16" in r for r in reasons), reasons
    assert sum("reduction over 64 terms exceeds max_reduction 32" in r for r in reasons) == 2, reasons
    bf16 = convert_model(model, ConversionOptions(dtype="bf16", calibration=dataclasses.replace(ranges,
                                                                                                max_reduction=64)))
    assert not [k for k in bf16.report.kept_fp32 if k.reason.startswith("calibration")]


def test_forced_keys_subgraph_and_unknown() -> None:
    model = loop_if_hot()
    forced = frozenset({"h_last::body::hb::else_branch::z", "h0"})
    result = convert_model(model, ConversionOptions(force_fp32=forced))
    assert_valid(result.model)
    reasons = sorted(k.reason for k in result.report.kept_fp32 if k.reason.startswith("forced fp32"))
    assert reasons == ["forced fp32: h0", "forced fp32: h_last::body::hb::else_branch::z"]
    again = convert_model(result.model, ConversionOptions(force_fp32=forced))
    assert again.model.SerializeToString() == result.model.SerializeToString()
    with pytest.raises(OptionsError, match="not in the model: 'nope'"):
        convert_model(model, ConversionOptions(force_fp32=frozenset({"nope"})))


def test_ranges_round_trip_through_json_form() -> None:
    ranges = collect_ranges(overflow_chain(layers=2, hot=0, width=16), [feeds_for(overflow_chain(layers=2, hot=0, width=16))])
    again = CalibrationRanges.from_dict(ranges.ranges.to_dict())
    assert again == dataclasses.replace(ranges.ranges, values=again.values)
    assert dict(again.values) == dict(ranges.ranges.values)
