"""Statistics behind the latency rules: Mann-Whitney U and a windowed change-point test.

Pure functions over numbers; scipy is imported lazily (only detection needs it).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def mann_whitney_p(new: Sequence[float], base: Sequence[float], alternative: str) -> float:
    """One-sided Mann-Whitney U p-value that ``new`` is ``greater``/``less`` than ``base``.

    Small samples without ties (both sizes <= 8) use scipy's exact distribution; otherwise the
    normal approximation with tie and continuity correction (scipy's ``asymptotic`` method,
    computed here directly because this runs for every slowed cell of every run).  Identical
    constant samples give p = 1 (no evidence of a shift).
    """
    if alternative not in ("greater", "less"):
        raise ValueError(f"alternative must be 'greater' or 'less', got {alternative!r}")
    n1, n2 = len(new), len(base)
    if n1 == 0 or n2 == 0 or len(set(new) | set(base)) <= 1:
        return 1.0
    ranks, ties = _ranks(list(new) + list(base))
    if max(n1, n2) <= 8 and not ties:
        from scipy.stats import mannwhitneyu

        return float(mannwhitneyu(new, base, alternative=alternative, method="exact").pvalue)
    u1 = sum(ranks[:n1]) - n1 * (n1 + 1) / 2
    u = u1 if alternative == "greater" else n1 * n2 - u1
    n = n1 + n2
    mu = n1 * n2 / 2
    sigma = math.sqrt(n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1))))
    if sigma == 0:
        return 1.0
    z = (u - mu - 0.5) / sigma
    return 0.5 * math.erfc(z / math.sqrt(2))


def _ranks(values: list[float]) -> tuple[list[float], float]:
    """Average ranks (1-based) and the tie term sum(t^3 - t)."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    ties = 0.0
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        t = j - i + 1
        ties += t**3 - t
        i = j + 1
    return ranks, ties


def prediction_p(reference: Sequence[float], x: float, direction: int) -> float:
    """One-sided p-value that ``x`` comes from the population of ``reference`` (t prediction interval).

    ``direction`` +1 tests for ``x`` above, -1 below.  With a zero-spread reference any
    difference in that direction has p = 0.  Needs at least 2 reference points.
    """
    n = len(reference)
    if n < 2:
        raise ValueError("a prediction test needs at least 2 reference points")
    mean = statistics.fmean(reference)
    sd = statistics.stdev(reference)
    diff = (x - mean) * direction
    if sd == 0:
        return 0.0 if diff > 0 else 1.0
    from scipy.stats import t

    stat = diff / (sd * math.sqrt(1 + 1 / n))
    return float(t.sf(stat, df=n - 1))


def shift_violations(series: Sequence[float], window: int, p: float, floor: float, count: int,
                     direction: int = 1) -> list[tuple[float, float]]:
    """Test each of the last ``count`` points of ``series`` against the ``window`` points before them.

    Returns ``[(p_value, ratio_to_reference_mean), ...]`` for the points that violate (p below
    ``p`` and relative change beyond ``floor`` in ``direction``), or an empty list unless **all**
    ``count`` points violate (the "consecutive violations" rule).  The reference window ends
    before the first candidate, so a sustained shift is not absorbed into its own baseline.
    """
    if len(series) < count + 2:
        return []
    ref = list(series[-count - window:-count])
    if len(ref) < 2:
        return []
    mean = statistics.fmean(ref)
    if mean <= 0:
        return []
    out = []
    for x in series[-count:]:
        ratio = x / mean
        beyond = ratio > 1 + floor if direction > 0 else ratio < 1 / (1 + floor)
        pv = prediction_p(ref, x, direction)
        if not (beyond and pv < p):
            return []
        out.append((pv, ratio))
    return out


def count_flips(passed: Sequence[bool]) -> int:
    """How many times a sequence of pass/not-pass outcomes changes value."""
    return sum(1 for a, b in zip(passed, passed[1:], strict=False) if a != b)


def min_samples_for(p: float, limit: int = 200) -> int:
    """The fewest samples per side (equal sizes) with which a one-sided Mann-Whitney U test can reach a
    p-value below ``p``: its smallest exact p is ``1 / C(2n, n)`` (every new sample beyond every baseline
    one), so with fewer samples the test can never fire, however large the change."""
    if not 0 < p < 1:
        raise ValueError(f"a significance level must lie in (0, 1), got {p!r}")
    for n in range(1, limit + 1):
        if 1 / math.comb(2 * n, n) < p:
            return n
    raise ValueError(f"no sample size up to {limit} reaches p < {p!r}")
