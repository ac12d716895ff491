"""Whether a sweep's latency measurements can show a regression at all, checked before a run exists.

A cell timed ``repeats`` times is compared with a baseline timed as often (at least); below
:func:`service.regressions.stats.min_samples_for` samples per side the latency rule's significance test can
never fire, so such a sweep would report "no latency regression" whatever happened.  It is refused instead.
"""

from __future__ import annotations

from collections.abc import Iterable

from service.errors import UserError
from service.regressions.stats import min_samples_for
from service.regressions.thresholds import Thresholds


class UnderpoweredSweep(UserError):
    """A sweep whose latency repeats cannot reach the configured significance (a user error: exit 2)."""


def required_repeats(th: Thresholds) -> int:
    """The fewest timed runs per job with which the latency rule can fire under ``th``."""
    return max(th.latency_min_samples, min_samples_for(th.latency_p))


def check_repeats(sweep: str, cells: Iterable[tuple[tuple[str, str, str, str], int]], th: Thresholds) -> None:
    """Raise :class:`UnderpoweredSweep` naming the first cell (model/dtype/policy/target) whose ``repeats``
    is below :func:`required_repeats`; ``cells`` holds (cell, repeats) pairs."""
    need = required_repeats(th)
    low = [(cell, n) for cell, n in cells if n < need]
    if low:
        cell, n = low[0]
        more = f" and {len(low) - 1} more cell(s)" if len(low) > 1 else ""
        raise UnderpoweredSweep(
            f"sweep {sweep}: repeats = {n} for {'/'.join(cell)}{more} cannot show a latency regression "
            f"(Mann-Whitney p < {th.latency_p:g} needs at least {need} timed runs per side); "
            f"set repeats >= {need}")
