"""The CI gate's decision for one finished run: pure, so every rule is a row of a table test.

Guarantees of :func:`decide`:

* exit 1 when the run has any open/acknowledged regression against its baseline;
* exit 1 when a cell that has **no baseline result** (a new cell, or a baseline that matches
  nothing) ended in a failing status (:data:`NEW_CELL_FAILURES`): a first run that fails is never
  "no regressions";
* exit 0 otherwise.  Every reason that failed the gate is a line in ``reasons``, in cell order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

Cell = tuple[str, str, str, str]

#: Statuses that fail the gate for a cell with nothing to compare with.  ``bad_model`` and
#: ``reference_error`` are not listed: the model file or its fp32 reference is broken, not the pass.
NEW_CELL_FAILURES = frozenset({"convert_error", "timeout", "crash", "crashed", "fail_accuracy", "diverged",
                               "bad_spec"})


@dataclass(frozen=True)
class CellOutcome:
    """What the gate needs of one result: its cell, status and message."""

    cell: Cell
    status: str
    message: str = ""


@dataclass(frozen=True)
class GateDecision:
    """Exit code of the gate (0 pass, 1 fail) and why it failed (empty when it passed)."""

    exit_code: int
    reasons: tuple[str, ...] = ()
    new_cell_failures: tuple[Cell, ...] = ()

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form."""
        return {"exit_code": self.exit_code, "reasons": list(self.reasons),
                "new_cell_failures": [list(c) for c in self.new_cell_failures]}


def decide(outcomes: Sequence[CellOutcome], with_baseline: Iterable[Cell], regressions: int) -> GateDecision:
    """The gate's decision (see the module docstring)."""
    based = set(with_baseline)
    reasons: list[str] = []
    if regressions:
        reasons.append(f"{regressions} regression(s) against the baseline")
    failed: list[Cell] = []
    for o in sorted(outcomes, key=lambda o: o.cell):
        if o.cell in based or o.status not in NEW_CELL_FAILURES:
            continue
        failed.append(o.cell)
        why = f": {o.message.splitlines()[0][:120]}" if o.message.strip() else ""
        reasons.append(f"new cell fails: {'/'.join(o.cell)} {o.status} (no baseline result){why}")
    return GateDecision(1 if reasons else 0, tuple(reasons), tuple(failed))
