"""Latency verdicts that can fire and cannot be fooled: significance, absolute floor, drift, pooling, power.

Each scenario states the numbers it rests on, computed here (p-values with the same Mann-Whitney test the
rule uses), so a test fails when a threshold or a step of the rule is changed, not only when the code breaks.
"""

from __future__ import annotations

import random
import statistics

import pytest

from service.db import Store
from service.orchestration.sweeps import load_sweep
from service.regressions.power import UnderpoweredSweep, check_repeats, required_repeats
from service.regressions.rules import CellSample, latency_rule, pooled, relative_latency
from service.regressions.stats import mann_whitney_p, min_samples_for
from service.regressions.thresholds import Thresholds
from tests.service.factories import chain, make_result, run_with

TH = Thresholds()


def _jitter(center: float, n: int, rel: float, seed: int) -> tuple[float, ...]:
    rng = random.Random(seed)
    return tuple(center * (1 + rng.uniform(-rel, rel)) for _ in range(n))


def _sample(ms: tuple[float, ...], fp32: tuple[float, ...] = (), env: str = "e") -> CellSample:
    return CellSample(status="pass", latency_samples=ms, fp32_latency_samples=fp32, env_fingerprint=env)


def test_a_weak_shift_beyond_the_ratio_is_not_significant_enough() -> None:
    # 12 vs 12 samples, new median x1.15 but heavily overlapping: p well above 0.002, below 0.2
    base = (1.0, 1.02, 0.98, 1.05, 0.95, 1.3, 0.7, 1.1, 0.9, 1.2, 0.8, 1.0)
    new = tuple(x * 1.15 for x in (1.0, 0.7, 1.3, 0.75, 1.25, 1.02, 0.98, 0.8, 1.2, 1.05, 0.95, 1.0))
    ratio = statistics.median(new) / statistics.median(base)
    p = mann_whitney_p(new, base, "greater")
    assert ratio > TH.latency_ratio and TH.latency_p < p < 0.2
    assert latency_rule(_sample(base), _sample(new), TH, "m", "fp16") == []
    # the same shift, without the overlap, fires
    tight = tuple(x * 1.15 for x in _jitter(1.0, 12, 0.01, 1))
    (f,) = latency_rule(_sample(_jitter(1.0, 12, 0.01, 0)), _sample(tight), TH, "m", "fp16")
    assert (f.kind, f.category, f.p_value < TH.latency_p) == ("latency", "regression", True)


def test_microsecond_changes_are_below_the_absolute_floor() -> None:
    # 6.6 us -> 9.8 us, perfectly separated (p tiny, ratio 1.48): timer-scale noise, never a regression
    base, new = _jitter(0.0066, 20, 0.01, 0), _jitter(0.0098, 20, 0.01, 1)
    assert mann_whitney_p(new, base, "greater") < 1e-6
    assert statistics.median(new) - statistics.median(base) < TH.latency_floor_ms
    assert latency_rule(_sample(base), _sample(new), TH, "m", "fp16") == []
    assert latency_rule(_sample(new), _sample(base), TH, "m", "fp16") == []


def test_a_20_percent_slowdown_of_a_1ms_model_is_flagged_every_time() -> None:
    fired = 0
    for seed in range(50):
        fp32_a, fp32_b = _jitter(1.6, 20, 0.08, 100 + seed), _jitter(1.6, 20, 0.08, 200 + seed)
        base = tuple(x * r for x, r in zip(_jitter(1.0, 20, 0.08, seed), fp32_a, strict=True))
        new = tuple(1.2 * x * r for x, r in zip(_jitter(1.0, 20, 0.08, 300 + seed), fp32_b, strict=True))
        base_ms = tuple(x / 1.6 for x in base)
        new_ms = tuple(x / 1.6 for x in new)
        got = latency_rule(_sample(base_ms, fp32_a), _sample(new_ms, fp32_b), TH, "m", "fp16")
        fired += [f.category for f in got] == ["regression"]
    assert fired == 50


def test_machine_drift_that_slows_both_models_is_not_a_regression() -> None:
    # the whole job ran 30 % slower (the fp32 model too): raw milliseconds would flag it, ratios do not
    base_ms, base_fp32 = _jitter(2.0, 20, 0.01, 0), _jitter(3.0, 20, 0.01, 1)
    new_ms = tuple(1.3 * x for x in _jitter(2.0, 20, 0.01, 2))
    new_fp32 = tuple(1.3 * x for x in _jitter(3.0, 20, 0.01, 3))
    assert latency_rule(_sample(base_ms), _sample(new_ms), TH, "m", "fp16") != []  # raw: fooled
    assert latency_rule(_sample(base_ms, base_fp32), _sample(new_ms, new_fp32), TH, "m", "fp16") == []
    # ... while the converted model alone getting 30 % slower is one
    (f,) = latency_rule(_sample(base_ms, base_fp32), _sample(new_ms, base_fp32), TH, "m", "fp16")
    assert f.category == "regression" and f.baseline_value == pytest.approx(statistics.median(base_ms))
    assert relative_latency(_sample((1.0, 2.0), (2.0, 4.0))) == (0.5, 0.5)
    assert relative_latency(_sample((1.0, 2.0), (2.0,))) == ()


def test_different_environments_are_never_compared() -> None:
    base, new = _jitter(1.0, 20, 0.01, 0), _jitter(2.0, 20, 0.01, 1)
    assert latency_rule(_sample(base, env="a"), _sample(new, env="b"), TH, "m", "fp16") == []
    assert latency_rule(_sample(base, env="a"), _sample(new, env="a"), TH, "m", "fp16") != []


def test_pooling_appends_same_environment_samples_only() -> None:
    a = _sample((1.0,) * 3, (2.0,) * 3, env="x")
    same, other = _sample((1.1,) * 2, (2.0,) * 2, env="x"), _sample((9.0,) * 2, (2.0,) * 2, env="y")
    got = pooled(a, [same, other])
    assert got.latency_samples == (1.0, 1.0, 1.0, 1.1, 1.1) and len(got.fp32_latency_samples) == 5
    unpaired = pooled(a, [_sample((1.1,) * 2, (), env="x")])
    assert len(unpaired.latency_samples) == 5 and unpaired.fp32_latency_samples == ()
    # conversion-time samples pool the same way (a slow conversion has few samples per job)
    conv = [CellSample(status="pass", convert_samples=(2.0,), env_fingerprint=e) for e in ("x", "x", "y")]
    got = pooled(CellSample(status="pass", convert_samples=(1.9, 2.1), env_fingerprint="x"), conv)
    assert got.convert_samples == (1.9, 2.1, 2.0, 2.0)


def test_min_samples_for_the_significance_level() -> None:
    # exact one-sided minimum p of n vs n samples is 1/C(2n, n): 1/252 = 0.004 at 5, 1/924 = 0.0011 at 6
    assert min_samples_for(0.002) == 6
    assert min_samples_for(0.005) == 5
    assert min_samples_for(0.05) == 4 and min_samples_for(0.051) == 3  # 1/C(6, 3) = 0.05 exactly
    assert required_repeats(TH) == 6
    # the bound is the test's own: five samples all above five give exactly 1/252, six above six 1/924
    separated5 = mann_whitney_p([2.0, 2.1, 2.2, 2.3, 2.4], [1.0, 1.1, 1.2, 1.3, 1.4], "greater")
    separated6 = mann_whitney_p([2.0, 2.1, 2.2, 2.3, 2.4, 2.5], [1.0, 1.1, 1.2, 1.3, 1.4, 1.5], "greater")
    assert separated5 == pytest.approx(1 / 252) and separated6 == pytest.approx(1 / 924)


def test_underpowered_sweeps_are_refused_with_the_minimum_named() -> None:
    cell = ("conv_net", "fp16", "default", "cpu")
    with pytest.raises(UnderpoweredSweep, match=r"repeats = 5 for conv_net/fp16/default/cpu .*at least 6"):
        check_repeats("smoke", [(cell, 5)], TH)
    check_repeats("smoke", [(cell, 6)], TH)
    with pytest.raises(UnderpoweredSweep, match="at least 11"):
        check_repeats("s", [(cell, 10)], Thresholds.from_mapping({"latency_min_samples": 11}))


@pytest.mark.parametrize("name", ["smoke", "full"])
def test_shipped_sweeps_can_show_latency_regressions(name: str) -> None:
    from service.orchestration.scheduler import zoo_catalog

    config = load_sweep(sweep=name)
    cells = config.expand(zoo_catalog(config.zoo_path()))
    check_repeats(name, [(c.cell, c.repeats) for c in cells], TH)


def test_latency_compares_across_revisions_in_one_environment(store: Store) -> None:
    shas = chain(store, 3)
    run_with(store, shas[0], [make_result(latency_ms=2.0, env="same")])
    quiet = run_with(store, shas[1], [make_result(latency_ms=2.01, env="same", seed=1)])
    assert store.regressions(run_id=quiet) == []
    slow = run_with(store, shas[2], [make_result(latency_ms=2.5, env="same", seed=2)])
    (reg,) = store.regressions(run_id=slow)
    assert (reg.kind, reg.category, reg.baseline_sha) == ("latency", "regression", shas[1])


def test_baseline_samples_are_pooled_over_its_recent_runs(store: Store) -> None:
    shas = chain(store, 2)
    # three runs of the baseline revision; with 6 samples each, one run alone is exactly at the power limit
    for seed in range(3):
        run_with(store, shas[0], [make_result(latency_ms=2.0, env="e", seed=seed, samples=6)])
    new = run_with(store, shas[1], [make_result(latency_ms=2.4, env="e", seed=9, samples=6)])
    (reg,) = store.regressions(run_id=new)
    assert "n=18/6" in reg.detail
    # pooling off: only the newest baseline result is used
    off = Thresholds.from_mapping({"latency_pool": 1})
    from service.orchestration.judge import detect_run

    (reg1,) = detect_run(store, new, off)
    assert "n=6/6" in reg1.detail


def test_a_pooled_baseline_spread_bounds_what_counts_as_a_change() -> None:
    # five baseline jobs whose medians swing 0.90-1.15 between runs (machine conditions), each tight within
    fp32 = _jitter(2.0, 20, 0.005, 99)
    runs = [_sample(tuple(m * 2.0 * x for x in _jitter(1.0, 20, 0.005, i)), fp32) for i, m in
            enumerate((1.0, 0.90, 0.95, 1.05, 1.15))]
    base = pooled(runs[0], runs[1:])
    assert len(base.run_medians) == len(base.run_medians_ms) == 5
    assert max(base.run_medians) == pytest.approx(1.15, rel=0.01)
    # a new job at 1.12: beyond the pooled median x1.10, with tight samples (p tiny), but inside the baseline's
    # own spread: not a regression
    new = _sample(tuple(1.12 * 2.0 * x for x in _jitter(1.0, 20, 0.005, 50)), fp32)
    assert statistics.median(relative_latency(new)) / statistics.median(relative_latency(base)) > TH.latency_ratio
    assert latency_rule(base, new, TH, "m", "fp16") == []
    # the same job against one baseline result (no spread known) fires, and a real 25 % slowdown fires anyway
    assert [f.category for f in latency_rule(runs[0], new, TH, "m", "fp16")] == ["regression"]
    slow = _sample(tuple(1.25 * 2.0 * x for x in _jitter(1.0, 20, 0.005, 51)), fp32)
    assert [f.category for f in latency_rule(base, slow, TH, "m", "fp16")] == ["regression"]
    # and the other way: a new job faster than every baseline job, by more than the ratio, is an improvement
    fast = _sample(tuple(0.8 * 2.0 * x for x in _jitter(1.0, 20, 0.005, 52)), fp32)
    assert [f.category for f in latency_rule(base, fast, TH, "m", "fp16")] == ["improvement"]
