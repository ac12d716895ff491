"""How much confirmation one run may cause: a cap of cells per run and a budget of cells per pull request.

The code of a pull request decides how many timing findings are *suspected* (a change that slows every
conversion by 0.3 s made all 6 cells of a smoke run suspected, and a confirmation run of 20.5 job-seconds,
more than the run's own 11.4), and every synchronize starts another run.  So the confirmation of a run
(:mod:`service.regressions.confirm`) times at most ``max_cells`` cells (``AMPCI_CONFIRM_MAX_CELLS``), and
the runs of one pull request (repository and number, across all its runs) at most ``max_per_pr`` cells in
all (``AMPCI_CONFIRM_MAX_PER_PR``, counted in :mod:`service.db.budgets`).  Runs of other triggers (push,
nightly, manual, bisect) have the per-run cap only.

:func:`select` is pure: which cells are confirmed and why each other one is not.  Order: new suspected
slowdowns before suspected recoveries (a slowdown left unconfirmed is what a gate could miss; a recovery left
unconfirmed only stays a regression), recoveries before suspected improvements (an improvement left
unconfirmed is only not shown as a gain), then the largest suspected effect first (the largest ratio among the
cell's findings), then the cell itself, so the choice is deterministic.

Rule for a cell left out (the caller applies it): its suspected slowdown stays ``suspected`` for good, with
``state_by`` :data:`~service.regressions.rules.CAPPED_BY` and a note ("not confirmed: confirmation cap of 8
cells per run reached"); it does not fail the gate (unconfirmed timing is what confirmation exists to keep
out of verdicts) and every verdict counts it as :data:`~service.regressions.rules.CAPPED_LABEL`, never as
a pass.  A suspected recovery left out goes back to the state it had (it is not resolved); a suspected improvement left
out stays ``suspected`` like a slowdown, and no surface counts it as a gain.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from service.regressions.stored import StoredRun
from service.vocabulary import CellColumns

if TYPE_CHECKING:
    from service.settings import Settings

Cell = tuple[str, str, str, str]

#: Defaults of ``AMPCI_CONFIRM_MAX_CELLS`` / ``AMPCI_CONFIRM_MAX_PER_PR`` (held equal to the Settings
#: defaults by tests/service/orchestration/test_confirm_caps.py).
DEFAULT_MAX_CELLS = 8
DEFAULT_MAX_PER_PR = 16


class SuspectedCell(CellColumns, Protocol):
    """What :func:`select` reads of a suspected finding (a stored finding): its cell, state and ratio (and its
    ``category`` where it has one: a finding without it counts as a regression)."""

    @property
    def state(self) -> str: ...
    @property
    def ratio(self) -> float | None: ...


@dataclass(frozen=True)
class ConfirmCaps:
    """Cells one run's confirmation may time (>= 1) and cells all confirmations of one pull request may
    time (>= 0; 0: pull-request runs confirm nothing)."""

    max_cells: int = DEFAULT_MAX_CELLS
    max_per_pr: int = DEFAULT_MAX_PER_PR

    def __post_init__(self) -> None:
        if self.max_cells < 1 or self.max_per_pr < 0:
            raise ValueError(f"confirmation caps need max_cells >= 1 and max_per_pr >= 0, got {self}")

    @classmethod
    def from_settings(cls, settings: Settings) -> ConfirmCaps:
        """``AMPCI_CONFIRM_MAX_CELLS`` and ``AMPCI_CONFIRM_MAX_PER_PR`` of ``settings``."""
        return cls(settings.confirm_max_cells, settings.confirm_max_per_pr)


def pull_request(run: StoredRun) -> tuple[str, int] | None:
    """``(owner/name in lower case, number)`` of a ``pull_request`` run that names both in
    ``run.meta["github"]`` (webhook runs do); None for every other run (no pull-request budget)."""
    if getattr(run, "trigger", None) != "pull_request":
        return None
    github = (getattr(run, "meta", None) or {}).get("github") or {}
    repo, number = github.get("repo"), github.get("pr")
    if not isinstance(repo, str) or not repo.strip() or isinstance(number, bool) or not isinstance(number, int):
        return None
    return repo.strip().lower(), number


@dataclass(frozen=True)
class Selection:
    """``chosen``: the cells to confirm, in priority order; ``capped``: each other cell and why it is not
    (a phrase: "confirmation cap of 8 cells per run reached")."""

    chosen: tuple[Cell, ...]
    capped: dict[Cell, str] = field(default_factory=dict)


def effect(finding: SuspectedCell) -> float:
    """The size of a suspected finding: how far its ratio lies from 1 (either way), 0 when unknown."""
    ratio = getattr(finding, "ratio", None)
    if ratio is None or not math.isfinite(ratio) or ratio <= 0:
        return 0.0
    return abs(math.log(ratio))


def select(findings: Sequence[SuspectedCell], caps: ConfirmCaps, budget_left: int | None = None,
           pr_label: str = "") -> Selection:
    """Which cells of ``findings`` (the suspected findings of one run: ``model``, ``dtype``, ``policy``,
    ``target``, ``state``, ``ratio``) are confirmed: at most ``caps.max_cells``, and at most ``budget_left``
    when the run spends a pull request's budget (``pr_label``: ``owner/name#N``, for the reason), in the
    order of the module docstring."""
    by_cell: dict[Cell, list[SuspectedCell]] = {}
    for f in findings:
        by_cell.setdefault((f.model, f.dtype, f.policy, f.target), []).append(f)

    def key(cell: Cell) -> tuple[int, float, Cell]:
        found = by_cell[cell]
        if any(getattr(f, "category", "regression") == "regression" and f.state != "suspected_resolved"
               for f in found):
            rank = 0  # a suspected slowdown
        else:
            rank = 1 if any(f.state == "suspected_resolved" for f in found) else 2  # a recovery, else a gain only
        return rank, -max(effect(f) for f in found), cell

    order = sorted(by_cell, key=key)
    chosen = order[:caps.max_cells]
    capped = {c: f"confirmation cap of {caps.max_cells} cells per run reached" for c in order[caps.max_cells:]}
    if budget_left is not None:
        left = max(0, budget_left)
        capped.update({c: f"confirmation budget of {caps.max_per_pr} cells for pull request {pr_label} spent"
                       for c in chosen[left:]})
        chosen = chosen[:left]
    return Selection(tuple(chosen), capped)
