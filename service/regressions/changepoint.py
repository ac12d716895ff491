"""E-divisive means: where did the level of a series move?  (Matteson & James, "A nonparametric approach for
multiple change point analysis of multivariate data", JASA 2014; the method Apache Otava, formerly MongoDB's
Hunter, runs over benchmark histories.)

For a segment ``Z[s:e]`` and a split ``tau`` with an end ``kappa`` (``s < tau < kappa <= e``), with
``X = Z[s:tau]`` (n points) and ``Y = Z[tau:kappa]`` (m points) and ``alpha`` in (0, 2), the divergence is

    E(X, Y) = 2/(nm) sum |x_i - y_j|^a  -  1/C(n,2) sum_{i<k} |x_i - x_k|^a  -  1/C(m,2) sum_{j<k} |y_j - y_k|^a

and the statistic ``Q = nm/(n+m) E(X, Y)``.  The best split of a segment maximises ``Q`` over ``tau`` and
``kappa``.  Change points are found one at a time (hierarchically): the best split over every current
segment is the candidate, and it is kept when a permutation test finds it significant (the observations
permuted *within* each current segment, the maximal statistic recomputed; ``p = (#{perm >= observed} + 1) /
(R + 1)``); the search stops at the first candidate that is not.

Pure numpy, deterministic (the permutations come from a seeded generator).  Guarantees: change points are
indices ``i`` such that ``Z[i]`` is the first value at the new level, sorted; no segment is shorter than
``min_size``; a constant series has none.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypedDict, Unpack

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class ChangePoint:
    """A significant change: the series' level moved between ``index - 1`` and ``index``; ``q`` the statistic,
    ``p`` the permutation p-value."""

    index: int
    q: float
    p: float


def _block(prefix: npt.NDArray[np.float64], a: int, b: int, c: int, d: int) -> float:
    """Sum of ``D[a:b, c:d]`` from its 2-D prefix sums."""
    return float(prefix[b, d] - prefix[a, d] - prefix[b, c] + prefix[a, c])


def _prefix(z: npt.NDArray[np.float64], alpha: float) -> npt.NDArray[np.float64]:
    dist = np.abs(z[:, None] - z[None, :]) ** alpha
    out = np.zeros((len(z) + 1, len(z) + 1))
    out[1:, 1:] = dist.cumsum(0).cumsum(1)
    return out


def best_split(z: npt.NDArray[np.float64], s: int, e: int, min_size: int, prefix: npt.NDArray[np.float64]) -> tuple[int, float]:
    """``(tau, Q)`` of the best split of ``z[s:e]`` (``tau`` -1 and Q -inf when the segment is too short)."""
    best = (-1, -np.inf)
    for tau in range(s + min_size, e - min_size + 1):
        n = tau - s
        within_x = _block(prefix, s, tau, s, tau) / 2 / (n * (n - 1) / 2)
        for kappa in range(tau + min_size, e + 1):
            m = kappa - tau
            between = _block(prefix, s, tau, tau, kappa) * 2 / (n * m)
            within_y = _block(prefix, tau, kappa, tau, kappa) / 2 / (m * (m - 1) / 2)
            q = n * m / (n + m) * (between - within_x - within_y)
            if q > best[1]:
                best = (tau, q)
    return best


def _candidate(z: npt.NDArray[np.float64], bounds: Sequence[int], min_size: int, alpha: float) -> tuple[int, float]:
    """The best split over every segment between consecutive ``bounds``."""
    prefix = _prefix(z, alpha)
    best = (-1, -np.inf)
    for s, e in zip(bounds[:-1], bounds[1:], strict=True):
        got = best_split(z, s, e, min_size, prefix)
        if got[1] > best[1]:
            best = got
    return best


class Options(TypedDict, total=False):
    """The keyword options of :func:`e_divisive` (for a caller that passes them on)."""

    p_limit: float
    permutations: int
    min_size: int
    alpha: float
    seed: int


def e_divisive(series: Sequence[float], *, p_limit: float = 0.05, permutations: int = 199, min_size: int = 2,
               alpha: float = 1.0, seed: int = 0) -> list[ChangePoint]:
    """The significant change points of ``series`` (see the module doc), sorted by index.  ``min_size`` >= 2
    (the within-segment mean needs a pair); a series shorter than ``2 * min_size`` has none."""
    if min_size < 2:
        raise ValueError(f"min_size must be at least 2, got {min_size}")
    if not 0 < alpha < 2:
        raise ValueError(f"alpha must lie in (0, 2), got {alpha}")
    z = np.asarray(series, dtype=float)
    if len(z) < 2 * min_size or not np.all(np.isfinite(z)) or np.ptp(z) == 0:
        return []
    rng = np.random.default_rng(seed)
    bounds = [0, len(z)]
    found: list[ChangePoint] = []
    while True:
        tau, q = _candidate(z, bounds, min_size, alpha)
        if tau < 0 or q <= 0:
            break
        beaten = 0
        for _ in range(permutations):
            shuffled = z.copy()
            for s, e in zip(bounds[:-1], bounds[1:], strict=True):
                shuffled[s:e] = rng.permutation(shuffled[s:e])
            if _candidate(shuffled, bounds, min_size, alpha)[1] >= q:
                beaten += 1
        p = (beaten + 1) / (permutations + 1)
        if p >= p_limit:
            break
        found.append(ChangePoint(tau, q, p))
        bounds = sorted({*bounds, tau})
    return sorted(found, key=lambda c: c.index)


def moved_range(series: Sequence[float], **kwargs: Unpack[Options]) -> tuple[int, int] | None:
    """``(first, last)`` indices bracketing where the level of ``series`` moved: ``first`` the last point at
    the old level before the first change point, ``last`` the first point at the new level after the last one
    (so a single step at ``i`` gives ``(i - 1, i)``); None when E-divisive finds no change."""
    cps = e_divisive(series, **kwargs)
    if not cps:
        return None
    return cps[0].index - 1, cps[-1].index
