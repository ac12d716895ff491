"""What a run found, one line per kind of finding, for the end of the ``ampci sweep`` printout (issue 39): a
reader learns the run's regressions, confirmed improvements, flaky cells, the earlier regressions it resolved,
and every suspicion that ended without failing the gate (dismissed, and why; not confirmed, and which cap)
without opening another command.  Pure, over plain findings.

:data:`LINES` is the order, always the same; every line is printed, ``none`` when it has no finding.  Each
stored state of each category lands on exactly one line (:func:`line_of`), so a suspicion never vanishes from
the printout: ``tests/service/regressions/test_finding_lines.py`` enumerates the categories and the states.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from service.regressions.findings import CAPPED_BY, EXPLAINED
from service.vocabulary import CellColumns

#: The lines, in the order printed.
LINES = ("regressions", "confirmed improvements", "flaky", "resolved", "dismissed", "not confirmed")
#: Up to this many findings on a line are named with their cells; more are counted only.
FEW = 3
#: States a person or ampci gave a finding that keep it out of the gate and out of the improvements: shown as
#: dismissed, with why (the confirmation's note, the coverage loss, "false positive").
NOT_COUNTED = frozenset({"dismissed", "false_positive", EXPLAINED})


class ListedFinding(CellColumns, Protocol):
    """What a line reads of a finding (a :class:`~service.db.records.RegressionInfo`): its cell's columns and
    these."""

    @property
    def kind(self) -> str: ...
    @property
    def category(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def state_by(self) -> str | None: ...
    @property
    def state_note(self) -> str | None: ...


def line_of(category: str, state: str) -> str:
    """The line of :data:`LINES` a finding of ``category`` in ``state`` is printed on: live (open or
    acknowledged) by its category (``regression``, ``improvement``, ``flaky``); ``resolved`` and
    ``suspected_resolved`` (a recovery being confirmed) on ``resolved``; dismissed, explained or marked a false
    positive on ``dismissed``; ``suspected`` (left out by a confirmation cap, or not confirmed yet) on ``not
    confirmed``.  ValueError for a state it does not know (a new state must be placed here)."""
    if state in ("open", "acknowledged"):
        return {"regression": "regressions", "improvement": "confirmed improvements", "flaky": "flaky"}[category]
    if state in ("resolved", "suspected_resolved"):
        return "resolved"
    if state in NOT_COUNTED:
        return "dismissed"
    if state == "suspected":
        return "not confirmed"
    raise ValueError(f"no line for a {category} finding in state {state!r}")


def _why(f: ListedFinding) -> str:
    if f.state == "false_positive":
        return "marked a false positive" + (f" ({f.state_note})" if f.state_note else "")
    if f.state == "suspected" and f.state_by != CAPPED_BY:
        return f.state_note or "awaiting its confirmation run"
    return f.state_note or f.state.replace("_", " ")


def _name(f: ListedFinding, line: str) -> str:
    cell = f"{f.model}/{f.dtype}/{f.policy}/{f.target} {f.kind}"
    if line != "resolved" and f.state in ("resolved", "suspected_resolved"):
        return f"{cell}, resolved since"
    if line == "resolved":
        return cell + (" (recovery being confirmed)" if f.state == "suspected_resolved" else "")
    if line in ("dismissed", "not confirmed"):
        return f"{cell} ({f.category}: {_why(f)})"
    return cell


def finding_lines(own: Sequence[ListedFinding], resolved: Sequence[ListedFinding], few: int = FEW) -> list[str]:
    """One line per entry of :data:`LINES`, in that order: the run's ``own`` findings by :func:`line_of` (one a
    later run resolved stays on its category's line, "resolved since" beside it), and on ``resolved`` the
    earlier regressions this run ``resolved`` (their own findings, in state ``resolved`` or
    ``suspected_resolved``).  A line names its findings' cells (and, dismissed or not confirmed, why) when
    they are ``few`` or fewer, else counts them, e.g. ``regressions: 2 (conv_net/fp16/default/cpu
    conversion_time; …)``, ``flaky: none``."""
    by_line: dict[str, list[ListedFinding]] = {line: [] for line in LINES}
    for f in own:
        line = line_of(f.category, f.state)
        # a run's own finding is resolved only by a later run: it stays what the run found, resolution beside it
        by_line[line_of(f.category, "open") if line == "resolved" else line].append(f)
    by_line["resolved"].extend(resolved)
    out = []
    for line in LINES:
        got = sorted(by_line[line], key=lambda f: (f.model, f.dtype, f.policy, f.target, f.kind, f.category))
        if not got:
            out.append(f"{line}: none")
        elif len(got) <= few:
            out.append(f"{line}: {len(got)} ({'; '.join(_name(f, line) for f in got)})")
        else:
            out.append(f"{line}: {len(got)}")
    return out
