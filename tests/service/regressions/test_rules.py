"""Table-driven scenarios for the pure regression rules, statistics and thresholds."""

from __future__ import annotations

import math
import random

import pytest

from service.errors import ConfigError
from service.regressions.detect import flaky_reason
from service.regressions.rules import CellSample, compare_cells, returned_to_baseline
from service.regressions.stats import count_flips, mann_whitney_p, prediction_p, shift_violations
from service.regressions.thresholds import ErrorThreshold, Thresholds

TH = Thresholds()


def lat(ms: float, n: int = 20, seed: int = 0, jitter: float = 0.01) -> tuple[float, ...]:
    rng = random.Random(seed)
    return tuple(ms * (1 + rng.uniform(-jitter, jitter)) for _ in range(n))


def S(status: str = "pass", **kw: object) -> CellSample:  # noqa: N802 - a tiny table constructor
    base: dict[str, object] = dict(max_abs=1e-3, cosine=0.9999, low_precision_fraction=0.9, casts_inserted=4,
                                   latency_samples=lat(2.0), env_fingerprint="e")
    base.update(kw)
    return CellSample(status=status, **base)  # type: ignore[arg-type]


# (name, baseline, new, dtype, expected [(kind, category, severity)])
SCENARIOS = [
    ("identical", S(), S(), "fp16", []),
    ("convert error", S(), S("convert_error", max_abs=None, latency_samples=()), "fp16",
     [("conversion", "regression", "critical")]),
    ("timeout is a pass fault", S("fail_accuracy"), S("timeout", latency_samples=()), "fp16",
     [("conversion", "regression", "critical")]),
    ("bad model is not blamed", S(), S("bad_model", max_abs=None, latency_samples=()), "fp16", []),
    ("reference error is not blamed", S(), S("reference_error", latency_samples=()), "fp16", []),
    ("conversion fixed", S("crash", latency_samples=()), S(), "fp16", [("conversion", "improvement", "info")]),
    ("pass -> fail_accuracy", S(), S("fail_accuracy", max_abs=1.5e-3), "fp16", [("accuracy", "regression", "major")]),
    ("error x10 above floor", S(), S(max_abs=1e-2), "fp16", [("accuracy", "regression", "minor")]),
    ("error x10 below floor", S(max_abs=1e-5), S(max_abs=1e-4), "fp16", []),
    ("error x1.5 under ratio", S(), S(max_abs=1.5e-3), "fp16", []),
    ("bf16 floor is larger", S(max_abs=1e-3), S(max_abs=8e-3), "bf16", []),
    ("bf16 beyond floor", S(max_abs=1e-3), S(max_abs=5e-2), "bf16", [("accuracy", "regression", "minor")]),
    ("error became inf", S(), S(max_abs=math.inf), "fp16", [("accuracy", "regression", "minor")]),
    ("accuracy fixed", S("fail_accuracy", max_abs=5e-2), S(max_abs=1e-3), "fp16",
     [("accuracy", "improvement", "info")]),
    ("diverges now", S(diverged=False, final_error=1e-4), S("diverged", diverged=True, final_error=10.0), "fp16",
     [("convergence", "regression", "major")]),
    ("final error grew", S(diverged=False, final_error=1e-3), S(diverged=False, final_error=1e-2), "fp16",
     [("convergence", "regression", "minor")]),
    ("final error small growth", S(diverged=False, final_error=1e-3), S(diverged=False, final_error=1.5e-3),
     "fp16", []),
    ("convergence fixed", S("diverged", diverged=True, final_error=5.0), S(diverged=False, final_error=1e-4),
     "fp16", [("convergence", "improvement", "info")]),
    ("no convergence data", S(), S(diverged=True), "fp16", []),
    ("coverage fraction drop", S(), S(low_precision_fraction=0.8), "fp16", [("coverage", "regression", "minor")]),
    ("coverage tiny drop", S(), S(low_precision_fraction=0.89), "fp16", []),
    ("casts grew", S(casts_inserted=10), S(casts_inserted=14), "fp16", [("coverage", "regression", "minor")]),
    ("casts +1 below abs", S(casts_inserted=4), S(casts_inserted=5), "fp16", []),
    ("coverage improved", S(low_precision_fraction=0.5), S(low_precision_fraction=0.9), "fp16",
     [("coverage", "improvement", "info")]),
    ("latency +30% significant", S(), S(latency_samples=lat(2.6, seed=1)), "fp16",
     [("latency", "regression", "minor")]),
    ("latency x2 major", S(), S(latency_samples=lat(4.0, seed=1)), "fp16", [("latency", "regression", "major")]),
    ("latency +5% under ratio", S(), S(latency_samples=lat(2.1, seed=1)), "fp16", []),
    ("latency other environment", S(), S(latency_samples=lat(4.0, seed=1), env_fingerprint="other"), "fp16", []),
    ("latency too few samples", S(latency_samples=lat(2.0, 3)), S(latency_samples=lat(4.0, 3, 1)), "fp16", []),
    ("latency +20% but noisy", S(latency_samples=lat(2.0, 6, jitter=0.6)),
     S(latency_samples=lat(2.4, 6, seed=3, jitter=0.6)), "fp16", []),
    ("latency faster", S(), S(latency_samples=lat(1.0, seed=1)), "fp16", [("latency", "improvement", "info")]),
    ("several kinds at once", S(diverged=False, final_error=1e-4),
     S("fail_accuracy", max_abs=1.0, diverged=True, final_error=3.0, low_precision_fraction=0.5,
       latency_samples=lat(3.0, seed=2)), "fp16",
     [("accuracy", "regression", "major"), ("convergence", "regression", "major"),
      ("coverage", "regression", "minor"), ("latency", "regression", "minor")]),
]


@pytest.mark.parametrize(("name", "base", "new", "dtype", "expected"), SCENARIOS, ids=[s[0] for s in SCENARIOS])
def test_rule_scenarios(name: str, base: CellSample, new: CellSample, dtype: str, expected: list) -> None:
    got = [(f.kind, f.category, f.severity) for f in compare_cells(base, new, TH, "m", dtype)]
    assert got == expected


def test_findings_carry_values_delta_ratio_and_p() -> None:
    (f,) = compare_cells(S(), S(latency_samples=lat(3.0, seed=1)), TH, "m", "fp16")
    assert f.p_value is not None and f.p_value < 0.002
    assert f.ratio == pytest.approx(1.5, rel=0.03) and f.delta == pytest.approx(1.0, rel=0.05)
    (a,) = compare_cells(S(), S(max_abs=0.5), TH, "m", "fp16")
    assert (a.baseline_value, a.value, a.delta) == (1e-3, 0.5, pytest.approx(0.499))
    assert "0.001 -> 0.5" in a.detail


def test_per_model_override_beats_dtype() -> None:
    th = Thresholds.from_mapping({"model_accuracy": {"noisy": {"fp16": {"ratio": 100, "floor": 1}}}})
    assert compare_cells(S(), S(max_abs=1e-2), th, "noisy", "fp16") == []
    assert compare_cells(S(), S(max_abs=1e-2), th, "other", "fp16") != []
    th2 = Thresholds.from_mapping({"model_accuracy": {"noisy": {"*": {"ratio": 100, "floor": 1}}}})
    assert th2.accuracy_for("noisy", "bf16") == ErrorThreshold(100, 1)


@pytest.mark.parametrize("bad", [{"nope": 1}, {"latency_ratio": "fast"}, {"accuracy": {"fp16": {"ratio": 2}}}])
def test_bad_thresholds_are_config_errors(bad: dict) -> None:
    with pytest.raises(ConfigError):
        Thresholds.from_mapping(bad)


def test_thresholds_load_file(tmp_path) -> None:
    p = tmp_path / "t.yaml"
    p.write_text("latency_ratio: 1.25\nflaky_allowlist: ['tiny_*/*/*/*']\n")
    th = Thresholds.load(p)
    assert th.latency_ratio == 1.25 and th.allowlisted(("tiny_mlp", "fp16", "default", "cpu"))
    with pytest.raises(ConfigError, match="cannot read"):
        Thresholds.load(tmp_path / "missing.json")


RESOLVE = [
    ("accuracy", S(), S(max_abs=1.1e-3), True),
    ("accuracy", S(), S(max_abs=1e-1), False),
    ("accuracy", S(), S("bad_model", max_abs=None), False),   # not comparable: stays open
    ("latency", S(), S(latency_samples=lat(2.02, seed=5)), True),
    ("latency", S(), S(latency_samples=lat(2.0, seed=5), env_fingerprint="x"), False),
    ("conversion", S(), S(), True),
    ("conversion", S(), S("convert_error"), False),
    ("conversion", S(), S("reference_error"), False),
]


@pytest.mark.parametrize(("kind", "base", "new", "expected"), RESOLVE)
def test_returned_to_baseline(kind: str, base: CellSample, new: CellSample, expected: bool) -> None:
    assert returned_to_baseline(kind, base, new, TH, "m", "fp16") is expected


def test_mann_whitney_direction_and_constant_samples() -> None:
    assert mann_whitney_p(lat(3.0, seed=1), lat(2.0), "greater") < 1e-6
    assert mann_whitney_p(lat(3.0, seed=1), lat(2.0), "less") > 0.99
    assert mann_whitney_p([1.0] * 5, [1.0] * 5, "greater") == 1.0


def test_prediction_p() -> None:
    ref = [10.0, 10.2, 9.9, 10.1, 10.0]
    assert prediction_p(ref, 10.05, 1) > 0.3
    assert prediction_p(ref, 13.0, 1) < 0.001
    assert prediction_p([5.0, 5.0], 6.0, 1) == 0.0 and prediction_p([5.0, 5.0], 4.0, 1) == 1.0
    with pytest.raises(ValueError):
        prediction_p([1.0], 2.0, 1)


FLAT = [10.0, 10.1, 9.9, 10.05, 9.95, 10.0, 10.1, 9.9, 10.0, 10.02]
SHIFT = [
    ("flat", FLAT, 0),
    ("one high night is not enough", FLAT + [10.0, 13.0], 0),
    ("two consecutive high nights", FLAT + [13.0, 13.1], 2),
    ("high then back", FLAT + [13.0, 10.0], 0),
    ("significant but under floor", FLAT + [10.6, 10.6], 0),
    ("too short", [10.0, 13.0, 13.0], 0),
]


@pytest.mark.parametrize(("name", "series", "hits"), SHIFT, ids=[s[0] for s in SHIFT])
def test_shift_violations(name: str, series: list[float], hits: int) -> None:
    assert len(shift_violations(series, window=10, p=0.001, floor=0.10, count=2)) == hits


def test_shift_down_is_detected_with_direction() -> None:
    assert len(shift_violations(FLAT + [7.0, 7.1], 10, 0.001, 0.10, 2, direction=-1)) == 2
    assert shift_violations(FLAT + [7.0, 7.1], 10, 0.001, 0.10, 2, direction=1) == []


FLAKY = [
    ("stable", ["pass"] * 10, None),
    ("one real regression", ["pass"] * 8 + ["fail_accuracy"] * 2, None),
    ("three flips", ["pass", "fail_accuracy", "pass", "pass", "fail_accuracy"], "3 pass/fail flips"),
    ("old flips fall out of the window", ["pass", "fail_accuracy"] * 3 + ["pass"] * 10, None),
]


@pytest.mark.parametrize(("name", "statuses", "reason"), FLAKY, ids=[s[0] for s in FLAKY])
def test_flaky(name: str, statuses: list[str], reason: str | None) -> None:
    got = flaky_reason(("m", "fp16", "default", "cpu"), statuses, TH)
    assert (got is None) if reason is None else (reason in got)


def test_flaky_allowlist_and_flip_count() -> None:
    th = Thresholds(flaky_allowlist=("m/*/default/*",))
    assert flaky_reason(("m", "bf16", "default", "cpu"), ["pass"], th) == "flaky (allowlisted)"
    assert count_flips([True, False, True, True]) == 2 and count_flips([]) == 0


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("alternative", ["greater", "less"])
def test_mann_whitney_matches_scipy(seed: int, alternative: str) -> None:
    from scipy.stats import mannwhitneyu

    rng = random.Random(seed)
    n1, n2 = rng.choice([(20, 20), (12, 30), (5, 5), (3, 9)])
    a = [round(rng.gauss(1.0 + seed * 0.05, 0.1), 2) for _ in range(n1)]  # rounding makes ties
    b = [round(rng.gauss(1.0, 0.1), 2) for _ in range(n2)]
    ours = mann_whitney_p(a, b, alternative)
    method = "asymptotic" if max(n1, n2) > 8 or len(set(a + b)) < n1 + n2 else "exact"
    ref = mannwhitneyu(a, b, alternative=alternative, method=method).pvalue
    assert ours == pytest.approx(ref, rel=1e-9, abs=1e-12)
