"""Numbers as people read them: compact formatting, axis labels that tell values apart, and a small terminal
plot (golden-file tested).  The CLI's tables are :mod:`service.cli.tables`.

Everything here is a pure function of numbers; nothing touches the database.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def fmt(x: float | int | bool | None, digits: int = 4) -> str:
    """Compact number formatting ('-' for unknown, 'inf' for infinities)."""
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return str(x)
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return f"{x:.{digits}g}"


def distinct_digits(values: Sequence[float], digits: int = 4, most: int = 15) -> int:
    """The fewest significant digits (at least ``digits``) that print every two different ``values``
    differently, so axis labels never read ``1 / 1 / 1`` for 0.9999991, 0.9999995 and 0.9999999."""
    finite = sorted({v for v in values if math.isfinite(v)})
    d = digits
    while d < most and len({f"{v:.{d}g}" for v in finite}) < len(finite):
        d += 1
    return d


def plot(values: Sequence[float | None], height: int = 8, width: int = 60, label: str = "") -> str:
    """A terminal line plot of ``values`` (oldest left); None/non-finite points are gaps ('x' marks them).

    The y axis is labelled with the max, the middle and the min, with as many digits as it takes to
    tell them apart; when there are more values than ``width`` columns, each column shows the last
    value of its bucket.
    """
    vals = list(values)
    if not vals:
        return f"{label}: no data" if label else "no data"
    if len(vals) > width:
        step = len(vals) / width
        vals = [vals[min(len(vals) - 1, int((i + 1) * step) - 1)] for i in range(width)]
    finite = [v for v in vals if v is not None and math.isfinite(v)]
    if not finite:
        return f"{label}: no finite values" if label else "no finite values"
    lo, hi = min(finite), max(finite)
    span = hi - lo or 1.0
    grid = [[" "] * len(vals) for _ in range(height)]
    for x, v in enumerate(vals):
        if v is None or not math.isfinite(v):
            grid[height - 1][x] = "x"
            continue
        y = round((v - lo) / span * (height - 1))
        grid[height - 1 - y][x] = "*"
    mid_row = (height - 1) // 2
    mid = hi - mid_row / max(1, height - 1) * (hi - lo)  # the value of the middle row
    digits = distinct_digits([lo, mid, hi])
    top, middle, bottom = (fmt(v, digits) for v in (hi, mid, lo))
    pad = max(len(top), len(middle), len(bottom))
    lines = [label] if label else []
    for i, row in enumerate(grid):
        axis = top if i == 0 else bottom if i == height - 1 else middle if i == mid_row and hi > lo else ""
        lines.append(f"{axis:>{pad}} |{''.join(row).rstrip()}")
    lines.append(" " * pad + " +" + "-" * len(vals))
    return "\n".join(lines)
