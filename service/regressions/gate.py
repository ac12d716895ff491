"""The cells' gate of one run: pure, so every rule is a row of a table test.  It is an input of the run's
verdict, which alone decides the run's state, exit code and headline
(:func:`service.regressions.verdict.decide_run`: a failed or cancelled run, or a job that ended in error, fails
it too).

Guarantees of :func:`decide` (no silent pass):

* exit 1 when the run has any open/acknowledged regression against its baseline;
* exit 1 when a cell **could not measure** (its status is one of :data:`UNMEASURED_STATUSES`:
  ``bad_spec``, ``crash``, ``timeout``, ``convert_error``, an accuracy failure, …, or its job ended
  without a result), whether or not it has a baseline result — unless its baseline result failed the
  same way (same status; a failure whose message names the run's own revision, such as "commit … is not
  in the pass repository", is about that revision and never the same): then it is a **known
  failure**, listed as such and not failing the gate;
* an ampci failure (a result :data:`~workers.result.NOT_OF_THE_PASS`: ``error``, ``unmeasured``, ``crashed``)
  is never a known failure, whatever its baseline was (it is not a result of the pass);
* **nothing unmeasured is green**: exit 1 when the run has cells and none of them was measured (no cell
  converted: every status is outside :data:`~workers.result.CONVERSION_OK_STATUSES`), whatever its baseline
  did: "nothing measured: none of the 6 cells converted";
* exit 0 otherwise: a run whose measured cells are fine while other cells fail as they did at the baseline
  passes (a pull request is not blocked by cells its base already breaks), but those cells stay listed as
  failing cells (``known_failures``; "2 cells fail to convert, as at the baseline" in every view), never as
  passes.  Every reason that failed the gate is a line in ``reasons``, in cell order;
* a cell with no baseline result is **not compared** (``not_compared``): never counted as "no
  regressions" by the texts built on the decision (:mod:`service.regressions.verdict`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from workers.result import CONVERSION_OK_STATUSES, NOT_OF_THE_PASS, UNMEASURED

Cell = tuple[str, str, str, str]

#: The status given to a cell whose job ended ``error`` without a result (no worker answer at all).
JOB_ERROR = "job_error"
#: Statuses of a cell that could not measure: the gate fails on them unless the baseline failed the same
#: way.  ``bad_model`` and ``reference_error`` are not listed: the model file or its fp32 reference is
#: broken, not the pass, and the cell says so on the run page.
UNMEASURED_STATUSES = frozenset({"convert_error", "timeout", "crash", "crashed", "fail_accuracy", "diverged",
                                 "bad_spec", JOB_ERROR, *NOT_OF_THE_PASS})
#: Statuses of a cell that is not a result of the pass (ampci's failures, cells not run): never a known failure.
NEVER_KNOWN = frozenset({JOB_ERROR, *NOT_OF_THE_PASS})
#: The reason of a run in which no cell was measured (see the module docstring).
NOTHING_MEASURED = "nothing measured: none of the {n} cells converted"
#: Former name of :data:`UNMEASURED_STATUSES` (they once failed only a cell without a baseline).
NEW_CELL_FAILURES = UNMEASURED_STATUSES


def not_measured_line(target: str, n: int) -> str:
    """The one line said of a run's ``n`` cells of ``target`` that could not run where they were sent, e.g. ``84
    cuda cells not measured: no CUDA device where they ran``."""
    return (f"{n} {target} cell{'' if n == 1 else 's'} not measured: no {target.partition('-')[0].upper()} device "
            "where they ran")


@dataclass(frozen=True)
class CellOutcome:
    """What the gate needs of one cell of a run: its cell, status and message, the status of its baseline
    result (None: the cell has no baseline result, or it is not known) and the run's revision."""

    cell: Cell
    status: str
    message: str = ""
    baseline_status: str | None = None
    revision: str = ""  # the run's revision (a failure naming it is about this revision: never known)


@dataclass(frozen=True)
class GateDecision:
    """Exit code of the gate (0 pass, 1 fail), why it failed (empty when it passed), and the cells behind it:
    ``unmeasured`` (could not measure, failing the gate), ``known_failures`` (failed as their baseline did),
    ``not_compared`` (no baseline result), and how many cells were ``measured`` (converted)."""

    exit_code: int
    reasons: tuple[str, ...] = ()
    new_cell_failures: tuple[Cell, ...] = ()
    unmeasured: tuple[tuple[Cell, str], ...] = ()
    known_failures: tuple[tuple[Cell, str], ...] = ()
    not_compared: tuple[Cell, ...] = ()
    compared: int = 0
    regressions: int = 0
    measured: int = 0  # cells whose conversion succeeded (so something of them was measured)

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form."""
        return {"exit_code": self.exit_code, "reasons": list(self.reasons),
                "new_cell_failures": [list(c) for c in self.new_cell_failures],
                "unmeasured": [{"cell": list(c), "status": s} for c, s in self.unmeasured],
                "known_failures": [{"cell": list(c), "status": s} for c, s in self.known_failures],
                "not_compared": [list(c) for c in self.not_compared], "compared": self.compared,
                "regressions": self.regressions, "measured": self.measured}


def decide(outcomes: Sequence[CellOutcome], with_baseline: Iterable[Cell], regressions: int) -> GateDecision:
    """The gate's decision (see the module docstring); ``with_baseline``: the cells that have a baseline
    result to compare with."""
    based = set(with_baseline)
    reasons: list[str] = []
    if regressions:
        reasons.append(f"{regressions} regression(s) against the baseline")
    new_failed: list[Cell] = []
    unmeasured: list[tuple[Cell, str]] = []
    known: list[tuple[Cell, str]] = []
    not_compared: list[Cell] = []
    skipped: dict[str, int] = {}
    for o in sorted(outcomes, key=lambda o: o.cell):
        has_base = o.cell in based
        if not has_base:
            not_compared.append(o.cell)
        if o.status not in UNMEASURED_STATUSES:
            continue
        own = bool(o.revision) and o.revision.lower() in o.message.lower()
        if has_base and o.baseline_status == o.status and not own and o.status not in NEVER_KNOWN:
            known.append((o.cell, o.status))
            continue
        unmeasured.append((o.cell, o.status))
        if not has_base:
            new_failed.append(o.cell)
        if o.status == UNMEASURED:  # said once per target below, not once per cell (84 cuda cells: one line)
            skipped[o.cell[3]] = skipped.get(o.cell[3], 0) + 1
            continue
        why = f": {o.message.splitlines()[0][:120]}" if o.message.strip() else ""
        if has_base:
            was = o.baseline_status or "unknown"
            reasons.append(f"cell could not measure: {'/'.join(o.cell)} {o.status} (baseline: {was}){why}")
        else:
            reasons.append(f"new cell fails: {'/'.join(o.cell)} {o.status} (no baseline result){why}")
    for target, n in sorted(skipped.items()):
        reasons.append(not_measured_line(target, n))
    measured = sum(o.status in CONVERSION_OK_STATUSES for o in outcomes)
    if outcomes and not measured and not reasons:  # (said alone: the other reasons already fail the gate)
        reasons.append(NOTHING_MEASURED.format(n=len(outcomes)))
    return GateDecision(1 if reasons else 0, tuple(reasons), tuple(new_failed), tuple(unmeasured), tuple(known),
                        tuple(not_compared), len(based & {o.cell for o in outcomes}), regressions, measured)
