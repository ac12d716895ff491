"""The job result's JSON form is stable and round-trips, non-finite floats included."""

from __future__ import annotations

import json
import math

import pytest

from workers.result import (
    AccuracyReport,
    ConvergenceStats,
    GraphFacts,
    JobResult,
    LatencyStats,
    OutputMetrics,
)


def _sample() -> JobResult:
    worst = OutputMetrics(max_abs=0.5, mean_abs=0.01, max_rel=0.2, cosine=0.9995, snr_db=float("inf"))
    return JobResult(
        model="m", dtype="fp16", policy="default", target="cpu", status="pass", revision="a" * 40,
        accuracy=AccuracyReport(mode="emulation", provider="CPUExecutionProvider",
                                per_output={"y": worst}, worst=worst),
        latency=LatencyStats(provider="CPUExecutionProvider", samples_ms=[1.0, 2.0], p50_ms=1.5),
        convergence=ConvergenceStats(steps=2, step_errors=[0.0, float("nan")]),
        graph=GraphFacts(casts_inserted=3, kept_fp32=[{"node": "n", "op_type": "Pow", "graph": "main",
                                                        "reason": "DENY list: Pow"}]),
        environment={"onnxruntime": "1.0"}, timings={"total_s": 1.0},
    )


def test_round_trip_preserves_everything() -> None:
    r = _sample()
    text = r.to_json()
    json.loads(text)  # strict JSON (no NaN/Infinity tokens)
    back = JobResult.from_json(text)
    assert back.accuracy is not None and back.accuracy.worst.snr_db == float("inf")
    assert back.convergence is not None and math.isnan(back.convergence.step_errors[1])
    assert back.to_json() == text


def test_unknown_status_rejected() -> None:
    with pytest.raises(ValueError, match="unknown job status"):
        JobResult(model="m", dtype="fp16", policy="default", target="cpu", status="great")


def test_newer_schema_rejected() -> None:
    d = _sample().to_dict()
    d["schema_version"] = 99
    with pytest.raises(ValueError, match="newer"):
        JobResult.from_dict(d)


def test_convergence_error_unit_round_trips_and_legacy_results_are_absolute() -> None:
    r = _sample()
    assert r.convergence is not None and r.convergence.error_unit == "relative"  # what the job computes now
    d = r.to_dict()
    assert d["convergence"]["error_unit"] == "relative"
    assert JobResult.from_dict(d).convergence.error_unit == "relative"  # type: ignore[union-attr]
    del d["convergence"]["error_unit"]  # as stored before the field existed (plain max|diff| errors)
    legacy = JobResult.from_dict(d)
    assert legacy.convergence is not None and legacy.convergence.error_unit == "absolute"
    assert json.loads(legacy.to_json())["convergence"]["error_unit"] == "absolute"


def test_unknown_convergence_error_unit_rejected() -> None:
    d = _sample().to_dict()
    d["convergence"]["error_unit"] = "percent"
    with pytest.raises(ValueError, match="unknown convergence error unit"):
        JobResult.from_dict(d)


def test_a_result_with_metric_keys_of_a_newer_worker_still_reads() -> None:
    """A stored result whose output metrics carry a key this version does not know (a newer worker wrote it)
    reads back with the known figures intact instead of failing the whole page."""
    from workers.result import JobResult, OutputMetrics

    metrics = {"max_abs": 0.5, "cosine": 0.99, "a_future_figure": 3}
    data = {"status": "pass", "model": "m", "dtype": "fp16", "policy": "default", "target": "cpu",
            "accuracy": {"mode": "emulation", "provider": "cpu", "per_output": {"y": metrics}, "worst": metrics}}
    result = JobResult.from_dict(data)
    assert result.accuracy is not None
    assert result.accuracy.worst == OutputMetrics(max_abs=0.5, cosine=0.99)
    assert result.accuracy.per_output["y"].max_abs == 0.5
