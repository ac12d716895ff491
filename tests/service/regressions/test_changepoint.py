"""E-divisive means (:mod:`service.regressions.changepoint`) on synthetic series: a step, a ramp, noise only,
two steps, a step at the very end; seeded noise, so every case is deterministic."""

from __future__ import annotations

import numpy as np
import pytest

from service.regressions.changepoint import best_split, e_divisive, moved_range


def _noise(n: int, level: float, sd: float, seed: int) -> list[float]:
    return list(level + sd * np.random.default_rng(seed).standard_normal(n))


def test_a_step_is_found_at_its_index() -> None:
    series = _noise(8, 1.0, 0.02, 1) + _noise(8, 1.5, 0.02, 2)
    cps = e_divisive(series)
    assert [c.index for c in cps] == [8] and cps[0].p < 0.05
    assert moved_range(series) == (7, 8)


def test_a_ramp_is_found_inside_the_ramp() -> None:
    ramp = [1.0] * 6 + [1 + 0.1 * i for i in range(1, 9)] + [1.8] * 2
    series = list(np.array(ramp) + 0.01 * np.random.default_rng(3).standard_normal(len(ramp)))
    got = moved_range(series)
    assert got is not None and 5 <= got[0] < got[1] <= 14  # within the ramp's commits (indices 6..13)


@pytest.mark.parametrize("seed", range(5))
def test_noise_only_has_no_change_point(seed: int) -> None:
    assert e_divisive(_noise(16, 1.0, 0.05, 10 + seed)) == []


def test_two_steps_are_both_found() -> None:
    series = _noise(6, 1.0, 0.02, 4) + _noise(6, 1.5, 0.02, 5) + _noise(6, 2.2, 0.02, 6)
    assert [c.index for c in e_divisive(series)] == [6, 12]
    assert moved_range(series) == (5, 12)


def test_a_step_in_the_last_two_points_is_found() -> None:
    series = _noise(14, 1.0, 0.02, 7) + [1.5, 1.5]
    assert [c.index for c in e_divisive(series)] == [14]


def test_constant_and_short_series_have_none() -> None:
    assert e_divisive([2.0] * 10) == [] and e_divisive([1.0, 5.0, 1.0]) == []
    assert moved_range([1.0] * 10) is None


def test_the_statistic_is_the_published_one() -> None:
    """Q = nm/(n+m) * (2/(nm) sum|x-y| - mean pair distance in X - in Y), on a hand-computed case."""
    z = np.array([0.0, 1.0, 3.0, 5.0])
    d = np.abs(z[:, None] - z[None, :])
    prefix = np.zeros((5, 5))
    prefix[1:, 1:] = d.cumsum(0).cumsum(1)
    tau, q = best_split(z, 0, 4, 2, prefix)
    # between: |0-3|+|0-5|+|1-3|+|1-5| = 14; within X: 1; within Y: 2
    assert tau == 2 and q == pytest.approx(2 * 2 / 4 * (2 / 4 * 14 - 1 - 2))


def test_deterministic_and_validated() -> None:
    series = _noise(8, 1.0, 0.05, 8) + _noise(8, 1.2, 0.05, 9)
    assert e_divisive(series) == e_divisive(series)
    with pytest.raises(ValueError):
        e_divisive(series, min_size=1)
    with pytest.raises(ValueError):
        e_divisive(series, alpha=2.0)
