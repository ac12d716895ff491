"""The stages of a live check run (GitHub App only): what the reporter queues as a run goes.

* ``queued`` when the run is created, ``in_progress`` when its first job starts, both with
  ``details_url`` the run page, so a required check never sits at "Expected" while ampci works;
* ``completed`` with the gate's conclusion (:func:`conclusion`) when it finishes, or
  ``action_required`` while a fork's run awaits a maintainer's approval;
* ``completed`` all the same when ampci could not build the run's report (:func:`unreported`): a bug of
  ampci's never leaves a check run in progress.

Every stage of one ampci run carries the run id as ``external_id`` and the name
:func:`check_name` (``ampci <sweep>``: never the commit status context ``ampci/<sweep>``, so a pull
request does not list ampci twice under one name).
"""

from __future__ import annotations

from service.github.report_items import CheckRun
from service.github.rerequest import CHECK_NAME_PREFIX


def status_context(sweep: str) -> str:
    """The commit status context of ``sweep``'s runs: ``ampci/smoke``, ``ampci/full``, … (one per sweep, so a
    branch rule may require each; the smoke sweep's is the single context ampci used before)."""
    return f"ampci/{sweep}"


def check_name(sweep: str) -> str:
    """The check run name of ``sweep``'s runs: ``ampci smoke`` (the status context is ``ampci/smoke``)."""
    return f"{CHECK_NAME_PREFIX}{sweep}"


def conclusion(state: str, run_status: str, compared: int | None = None) -> str:
    """The check run conclusion of a finished run.

    ``state`` is the commit status state :func:`service.regressions.verdict.decide_run` decided (the
    gate's verdict: ``success``, ``failure`` or ``error``), ``run_status`` the run's status and
    ``compared`` how many cells had a baseline to compare with (None: unknown).  A cancelled run is
    ``cancelled`` (not a failure of the change); ``failure`` and ``error`` are ``failure``; a
    ``success`` that compared nothing is ``neutral`` ("not compared" is never "passed")."""
    if run_status == "cancelled":
        return "cancelled"
    if state in ("failure", "error"):
        return "failure"
    if state != "success":
        raise ValueError(f"not a final commit status state: {state!r}")
    return "neutral" if compared == 0 else "success"


def stage(repo: str, sha: str, sweep: str, run_id: int, run_url: str, status: str) -> CheckRun:
    """The ``queued`` or ``in_progress`` check run of run ``run_id``."""
    title = "Queued" if status == "queued" else "Running"
    summary = (f"ampci run {int(run_id)} is queued: its {sweep} sweep starts when a worker is free."
               if status == "queued" else f"ampci run {int(run_id)} is measuring the {sweep} sweep.")
    return CheckRun(repo=repo, sha=sha, name=check_name(sweep), conclusion=None, title=title,
                    summary=f"{summary} Follow it on [its page]({run_url}).", details_url=run_url, status=status,
                    external_id=str(int(run_id)))


def awaiting_approval(repo: str, sha: str, sweep: str, run_id: int, run_url: str, why: str) -> CheckRun:
    """The ``action_required`` check run of a fork's run awaiting a maintainer's approval."""
    return CheckRun(repo=repo, sha=sha, name=check_name(sweep), conclusion="action_required",
                    title="Awaiting a maintainer's approval", summary=why, details_url=run_url,
                    external_id=str(int(run_id)))


def unreported(repo: str, sha: str, sweep: str, run_id: int, run_url: str, verdict_state: str | None,
               run_status: str, why: str) -> CheckRun:
    """The completed check run of a finished run whose report could not be built (``why``: one line of the
    error): the conclusion from the verdict's state when it was decided (:func:`conclusion`), else ``neutral``
    (``cancelled`` for a cancelled run); the summary says so and links the run page."""
    if verdict_state in ("success", "failure", "error"):
        concluded = conclusion(verdict_state, run_status)
    else:
        concluded = "cancelled" if run_status == "cancelled" else "neutral"
    line = " ".join(why.split())[:300]
    return CheckRun(repo=repo, sha=sha, name=check_name(sweep), conclusion=concluded, title="Report not built",
                    summary=f"ampci could not build its report: {line}; see [the run page]({run_url}).",
                    details_url=run_url, status="completed", external_id=str(int(run_id)))
