"""How a list of runs shows each run's recorded verdict, in a few words (no rules, no detection).

Split from :mod:`service.regressions.verdict` (which re-exports these names) so that ``ampci runs`` and the
dashboard's run list read a stored verdict without importing the finding kinds and their rules (issue 42:
the query commands stay light).  Pure: it reads a run's recorded brief and decides nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from service.regressions.stored import StoredRun

#: Run statuses of a run that has not been judged yet.
UNJUDGED_RUN_STATES = frozenset({"awaiting_approval", "queued", "running"})
#: The word a list of runs shows for each verdict state (and ``unjudged`` for a finished run without one).
LIST_WORDS = {"success": "passes", "failure": "fails", "error": "error", "pending": "pending",
              "unjudged": "not judged"}


def plural(n: int, word: str) -> str:
    """``1 cell``, ``2 cells``."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def since_text(resolved: int, total: int, by: Sequence[int]) -> str:
    """``resolved`` of a run's ``total`` regressions that later runs ``by`` resolved, said beside its verdict:
    ``resolved since by run 7``, ``2 of 6 regressions resolved since by runs 7, 9``; empty when none was."""
    if not resolved:
        return ""
    what = "" if resolved >= total else f"{resolved} of {plural(total, 'regression')} "
    runs = ", ".join(str(i) for i in by)
    return f"{what}resolved since" + (f" by run{'s' if len(by) > 1 else ''} {runs}" if runs else "")


def list_verdict(run: StoredRun, resolved: tuple[int, tuple[int, ...]] | None = None) -> tuple[str, str]:
    """``(state, counts)`` a list of runs shows for ``run`` (a RunInfo): the state of its recorded verdict
    (:meth:`RunVerdict.brief <service.regressions.verdict.RunVerdict.brief>`; ``pending`` while the run is
    unfinished, ``unjudged`` for a finished run that has none: older than the record, or cancelled by hand) and
    its counts, most important first, e.g. ``2 regressions, 1 could not measure, 3 not compared``, and what
    later runs ``resolved`` (how many of its regressions, by which runs:
    :func:`service.db.verdicts.resolved_since`) beside it: ``6 regressions — resolved since by run 7``.  Reads
    the record; decides nothing."""
    brief = getattr(run, "verdict", None)
    if run.status in UNJUDGED_RUN_STATES:
        return "pending", run.status.replace("_", " ")
    if not isinstance(brief, dict) or brief.get("state") not in LIST_WORDS:
        return "unjudged", ""
    parts = []
    for key, one, many in (("unmeasured", "could not measure", "could not measure"),
                           ("regressions", "regression", "regressions"),
                           ("known_failures", "failing as at the baseline", "failing as at the baseline"),
                           ("not_compared", "not compared", "not compared"),
                           ("improvements", "improvement", "improvements"), ("flaky", "flaky", "flaky")):
        n = brief.get(key) or 0
        if n:
            parts.append(f"{n} {one if n == 1 else many}")
    if not parts or (brief.get("compared") and not brief.get("regressions") and not brief.get("unmeasured")):
        parts.append(f"{brief.get('compared', 0)} compared")
    since = since_text(resolved[0], int(brief.get("regressions") or 0), resolved[1]) if resolved else ""
    return str(brief["state"]), ", ".join(parts) + (f" — {since}" if since else "")
