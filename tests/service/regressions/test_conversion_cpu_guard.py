"""The conversion-time rule's CPU guard (:func:`service.regressions.rules.conversion_time_rule`).

A wall-time change the conversion process's own CPU time shares (the pass computes more) stands, whatever the
reference workload did; a wall-only change (CPU flat: waiting, which a busy machine adds too) stands only when
it is still beyond the rule's margin after the reference workload's own slowdown is divided out; without such
a reference it is dropped.  The figures are those
of a ~0.25 s conversion; "burn" is the injected +0.5 s of arithmetic, "sleep" +0.5 s of sleeping.
"""

from __future__ import annotations

from service.regressions.rules import CellSample, conversion_time_rule, pooled
from service.regressions.thresholds import Thresholds

TH = Thresholds()
JITTER = (0.0, 0.004, -0.003, 0.002, -0.001)


def cell(wall: float | list[float], cpu: float | list[float] | None, ref: float | list[float] | None = 0.02
         ) -> CellSample:
    def series(x: float | list[float]) -> tuple[float, ...]:
        return tuple(x) if isinstance(x, list) else tuple(x * (1 + j) for j in JITTER)

    return CellSample(status="pass", env_fingerprint="env", convert_samples=series(wall),
                      convert_cpu=series(cpu) if cpu is not None else (),
                      convert_reference=series(ref) if ref is not None else ())


def flagged(base: CellSample, new: CellSample) -> list[str]:
    return [f.category for f in conversion_time_rule(base, new, TH, "m", "fp16")]


BASE = cell(0.25, 0.20)


def test_a_slowdown_that_burns_cpu_is_flagged_and_the_detail_shows_both_times() -> None:
    (f,) = conversion_time_rule(BASE, cell(0.75, 0.70), TH, "m", "fp16")
    assert f.category == "regression" and "CPU 0.2 s -> 0.7 s" in f.detail and "wall only" not in f.detail
    # and a pass that got faster by computing less is an improvement
    assert flagged(cell(0.75, 0.70), BASE) == ["improvement"]


def test_cpu_time_keeps_a_real_slowdown_that_a_noisy_reference_would_hide() -> None:
    """The reference slowed x3.5 in the median and swung x3.5 between samples during the new job (a busy machine):
    divided by it, the samples overlap and the wall-time rule alone drops the +0.5 s; the CPU time moved."""
    ref = [0.02, 0.07, 0.02, 0.07, 0.07]
    assert flagged(cell(0.25, None), cell(0.75, None, ref)) == []  # wall time only: hidden
    assert flagged(BASE, cell(0.75, 0.70, ref)) == ["regression"]  # CPU-backed: kept


def test_a_sleep_in_the_pass_is_flagged_but_waiting_the_reference_shares_is_not() -> None:
    (f,) = conversion_time_rule(BASE, cell(0.75, 0.20), TH, "m", "fp16")  # the pass sleeps 0.5 s
    assert f.category == "regression" and "(wall only)" in f.detail and "beyond the reference" in f.detail
    # the same wall time, CPU flat, and the reference as slow: the machine, not the pass
    assert flagged(BASE, cell(0.75, 0.20, ref=0.06)) == []
    # CPU flat and no reference to tell the pass's waiting from the machine's: nothing
    assert flagged(cell(0.25, 0.20, ref=None), cell(0.75, 0.20, ref=None)) == []


def test_a_wall_only_change_must_exceed_the_margin_beyond_the_reference_drift() -> None:
    """x1.28 in wall time while the reference's median moved x1.09 (below the drift check's x1.095): only
    x1.17 beyond the machine, inside the x1.20 margin.  Wall-only: dropped; CPU-backed or no CPU figures: kept."""
    base = cell(0.50, 0.40)
    assert flagged(base, cell(0.64, 0.40, ref=0.0218)) == []
    assert flagged(base, cell(0.64, 0.54, ref=0.0218)) == ["regression"]
    assert flagged(cell(0.50, None), cell(0.64, None, ref=0.0218)) == ["regression"]  # the rule without CPU time


def test_cpu_figures_are_pooled_only_when_every_pooled_result_carries_them() -> None:
    other = cell(0.26, 0.21)
    assert len(pooled(BASE, [other]).convert_cpu) == 10
    assert pooled(BASE, [cell(0.26, None)]).convert_cpu == ()


#: Issue 39's silent cell: conv_net/fp16 converting in ~0.043 s went to ~0.249 s (the pass sleeping 0.2 s per
#: conversion, CPU flat) while its ~5 ms reference workload, timed after each conversion, read x1.8 slower.
SHORT_BASE = cell(0.043, 0.037, ref=0.0040)


def test_a_sleep_in_a_short_conversion_is_not_divided_by_a_noisy_reference() -> None:
    """x5.8 in wall time, x1.8 in the reference: the machine explains at most 0.043 s x 1.8 = 0.077 s of the
    0.249 s, so 0.17 s is the pass's own (beyond the 0.1 s floor).  Dividing the sleep by the drift as well
    (0.043 s x (5.8 / 1.8 - 1) = 0.095 s) dropped it, silently."""
    (f,) = conversion_time_rule(SHORT_BASE, cell(0.249, 0.037, ref=0.0072), TH, "conv_net", "fp16")
    assert f.category == "regression" and "(wall only)" in f.detail and "x3.2" in f.detail, f.detail
    # the machine alone (wall time stretched as much as the reference): still nothing
    assert flagged(SHORT_BASE, cell(0.043 * 1.8, 0.037, ref=0.0072)) == []


def test_a_sleep_is_not_hidden_by_the_per_sample_swing_of_the_reference() -> None:
    """The reference's median x1.3 slower, its samples swinging x8 within the job (0.0317 s beside 0.0074 s were
    seen in one job): the per-sample ratios overlap, the medians do not; a wall-only x5.8 stands."""
    base = cell(0.043, 0.037, ref=[0.0040, 0.0041, 0.0039, 0.0040, 0.0042])
    new = cell(0.249, 0.037, ref=[0.0052, 0.0317, 0.0051, 0.0317, 0.0053])
    assert flagged(base, new) == ["regression"]
