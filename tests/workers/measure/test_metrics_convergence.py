"""Accuracy metrics, the k-rule, and the divergence verdict on known curves."""

from __future__ import annotations

import math

import numpy as np

from workers.measure.convergence import judge_errors, step_error, step_errors
from workers.measure.metrics import Tolerance, compare_outputs, judge, output_metrics, top1_agreement


def test_output_metrics_known_values() -> None:
    ref = np.array([1.0, -2.0, 4.0, 0.0], np.float32)
    got = np.array([1.5, -2.0, 4.0, 0.001], np.float32)
    m = output_metrics(ref, got, baseline=ref + np.float32(1e-4))
    assert math.isclose(m.max_abs, 0.5, rel_tol=1e-6)
    assert math.isclose(m.mean_abs, (0.5 + 0.001) / 4, rel_tol=1e-5)
    # relative error floored at 1e-3 * max|ref| = 0.004 for the zero element: 0.001 / 0.004
    assert math.isclose(m.max_rel, 0.5, rel_tol=1e-6)
    assert math.isclose(m.snr_db, 10 * math.log10(21.0 / (0.25 + 1e-6)), rel_tol=1e-4)
    assert 0.97 < m.cosine < 1.0
    assert math.isclose(m.baseline_max_abs, 1e-4, rel_tol=1e-2)


def test_nonfinite_outputs_are_counted_and_fail() -> None:
    ref = {"y": np.array([1.0, 2.0, 3.0], np.float32)}
    got = {"y": np.array([1.0, np.inf, np.nan], np.float32)}
    per, worst = compare_outputs(ref, got)
    assert (worst.nan_count, worst.inf_count) == (1, 1)
    assert math.isinf(worst.max_abs)
    ok, reason = judge(per, ref, Tolerance(), k=3.0)
    assert not ok and "NaN/Inf" in reason


def test_k_rule_scales_with_rerun_noise() -> None:
    rng = np.random.default_rng(0)
    ref = {"y": rng.standard_normal(1000).astype(np.float32)}
    got = {"y": ref["y"] + np.float32(0.02)}
    tol = Tolerance(atol=1e-3, rtol=0.0, min_cosine=0.0)
    quiet = {"y": ref["y"] + np.float32(1e-5)}
    noisy = {"y": ref["y"] + np.float32(0.01)}
    assert not judge(compare_outputs(ref, got, quiet)[0], ref, tol, k=3.0)[0]
    assert judge(compare_outputs(ref, got, noisy)[0], ref, tol, k=3.0)[0]      # 0.02 <= 3 * 0.01 + 0.001
    assert not judge(compare_outputs(ref, got, noisy)[0], ref, tol, k=1.0)[0]  # 0.02 > 1 * 0.01 + 0.001


def test_task_metric_and_cosine_rules() -> None:
    ref = np.array([[0.1, 0.9], [0.6, 0.4], [0.3, 0.7], [0.2, 0.8]], np.float32)
    got = np.array([[0.1, 0.9], [0.4, 0.6], [0.3, 0.7], [0.2, 0.8]], np.float32)
    assert top1_agreement(ref, got) == 0.75
    per, worst = compare_outputs({"p": ref}, {"p": got}, task="top1")
    assert worst.task_metric == 0.75 and worst.task_metric_name == "top1"
    ok, reason = judge(per, {"p": ref}, Tolerance(atol=1.0, rtol=0.0, min_cosine=0.0, task_min=1.0), k=3.0)
    assert not ok and "top1" in reason
    ok, reason = judge(per, {"p": ref}, Tolerance(atol=1.0, rtol=0.0, min_cosine=0.999), k=3.0)
    assert not ok and "cosine" in reason


def test_bounded_noisy_curves_do_not_diverge() -> None:
    rng = np.random.default_rng(0)
    bounded = list(1e-3 * (1 + 0.3 * rng.standard_normal(64)) ** 2)
    saturating = list(1e-3 * (1 - np.exp(-np.arange(64) / 5.0)) + 1e-6)
    for curve in (bounded, saturating, [0.0] * 64):
        stats = judge_errors(curve, cap=1.0)
        assert not stats.diverged, stats.reason
        assert stats.steps == 64 and stats.max_error == max(curve)


def test_growing_curves_diverge() -> None:
    t = np.arange(64, dtype=np.float64)
    for curve in (1e-4 * t, 1e-5 * t**2, 1e-6 * 1.1**t):
        stats = judge_errors(list(curve), cap=10.0)
        assert stats.diverged and "grows" in stats.reason and stats.slope > 0
    assert "cap" in judge_errors([0.1] * 10 + [2.0] * 10, cap=1.0).reason
    inf = judge_errors([0.1, 0.2, math.inf, math.inf], cap=1.0)
    assert inf.diverged and "step 2" in inf.reason


def test_step_error_is_worst_over_outputs() -> None:
    ref = {"a": np.zeros(3), "b": np.ones(2)}
    assert step_error(ref, {"a": np.array([0.0, 0.1, 0.0]), "b": np.array([1.0, 1.3])}) == 0.30000000000000004
    assert math.isinf(step_error(ref, {"a": np.array([0.0, np.nan, 0.0]), "b": np.ones(2)}))


def test_step_errors_over_all_steps_equal_the_per_step_definition() -> None:
    rng = np.random.default_rng(0)
    ref = [{"a": rng.normal(size=(2, 3)), "b": rng.normal(size=4).astype(np.float32), "e": np.zeros(0)}
           for _ in range(12)]
    got = [{k: (v + rng.normal(scale=1e-3, size=v.shape)).astype(v.dtype) for k, v in r.items()} for r in ref]
    got[3]["a"][0, 1] = np.nan          # converted non-finite where fp32 is finite: inf
    ref[5]["b"][2] = np.inf             # fp32 itself non-finite there: that position is skipped
    got[5]["b"][2] = np.inf
    ref[7]["a"][1, 1] = np.nan          # both NaN: skipped
    got[7]["a"][1, 1] = np.nan
    expected = [step_error(r, g) for r, g in zip(ref, got, strict=True)]
    assert step_errors(ref, got) == expected
    assert math.isinf(expected[3]) and all(math.isfinite(e) for i, e in enumerate(expected) if i != 3)
    assert step_errors([], []) == []



def test_step_errors_are_relative_to_a_growing_output() -> None:
    # an output whose fp32 value counts up to 64 with a constant 1% error, next to one within [-1, 1]
    t = np.arange(1, 65, dtype=np.float64)
    ref = [{"count": np.array([v, 0.5]), "prob": np.array([0.5])} for v in t]
    got = [{"count": np.array([v * 1.01, 0.5]), "prob": np.array([0.5 + 1e-3])} for v in t]
    errors = step_errors(ref, got)
    assert errors == [step_error(r, g) for r, g in zip(ref, got, strict=True)]
    assert np.allclose(errors, 0.01)  # 1% of the count at every step (the 1e-3 of prob is smaller)
    stats = judge_errors(errors, cap=0.5)
    assert not stats.diverged, stats.reason  # in absolute terms the error grows 64x and passes the cap
    assert stats.error_unit == "relative"  # recorded, so the service never compares it with absolute errors


def test_relative_errors_still_catch_unbounded_growth_and_nonfinite() -> None:
    t = np.arange(1, 65, dtype=np.float64)
    ref = [{"s": np.array([10.0 * v])} for v in t]
    got = [{"s": np.array([10.0 * v + 0.01 * v * v])} for v in t]  # drifts faster than the state grows
    stats = judge_errors(step_errors(ref, got), cap=1.0)
    assert stats.diverged and "grows steadily" in stats.reason
    got[40] = {"s": np.array([np.inf])}
    assert "non-finite error from step 40" in judge_errors(step_errors(ref, got), 1.0).reason
