"""The shortened forms of a report GitHub refused with 422, so a refusal never leaves a check run queued or
in progress, a commit status pending, or a pull request with a stale comment.

:func:`shortened` gives the next, smaller form of a report; the poster
(:class:`service.github.poster.OutboxPoster`) sends it in place of the refused one (unless a newer report
superseded it meanwhile), and after the last form the report is dropped.  Every form keeps what GitHub's
readers need: a check run keeps its status and conclusion, a commit status its state and context, a comment
its marker (so the next report edits it again).

* check run: (1) the title, the summary cut to :data:`FALLBACK_SUMMARY_BYTES` and a note linking the run page,
  no text; (2) a fixed title and summary, no link (the link itself may be what GitHub refused);
* a check run's completion GitHub refused otherwise (another permanent error, or ``max_attempts`` failed posts):
  :func:`last_resort`, the minimal form (a fixed title and summary, no text, no link), tried once before the
  completion is dropped;
* commit status: (1) a fixed description with the run page link; (2) the same without the link;
* comment: (1) the start of the body, cut on a line to :data:`FALLBACK_COMMENT_CHARS`, and a note; (2) the
  marker and a fixed line.
"""

from __future__ import annotations

from dataclasses import replace

from service.github.report_items import (
    COMMENT_MARKER,
    CheckRun,
    CommitStatus,
    PullRequestComment,
    Report,
    fit_bytes,
)

FALLBACK_SUMMARY_BYTES = 4096
FALLBACK_COMMENT_CHARS = 8000
REFUSED = "GitHub refused ampci's full report (HTTP 422)"
CHECK_MINIMAL_TITLE = "ampci"
CHECK_MINIMAL = "GitHub refused ampci's report (HTTP 422): ampci's run page has it."
CHECK_UNDELIVERED = "GitHub refused ampci's report: ampci's run page has it."
COMMENT_MINIMAL = "GitHub refused ampci's report (HTTP 422): ampci's run page (the commit status's link) has it."


def status_minimal(state: str) -> str:
    """The description of a commit status's shortened form."""
    return f"ampci: {state}; the details are on the run page"


def _check(check: CheckRun) -> CheckRun | None:
    if check.summary == CHECK_MINIMAL and check.details_url is None:
        return None
    if REFUSED in check.summary and not check.text:
        return replace(check, title=CHECK_MINIMAL_TITLE, summary=CHECK_MINIMAL, details_url=None)
    where = f"[the run page]({check.details_url})" if check.details_url else "ampci's run page"
    note = f"\n\n{REFUSED}: the whole report is on {where}."
    room = FALLBACK_SUMMARY_BYTES - len(note.encode())
    return replace(check, title=check.title[:100], summary=fit_bytes(check.summary, room, "\n\n…") + note, text="")


def _status(status: CommitStatus) -> CommitStatus | None:
    if status.description == status_minimal(status.state):
        return replace(status, target_url=None) if status.target_url else None
    return replace(status, description=status_minimal(status.state))


def _comment(comment: PullRequestComment) -> PullRequestComment | None:
    minimal = f"{COMMENT_MARKER}\n{COMMENT_MINIMAL}\n"
    if comment.body == minimal:
        return None
    if REFUSED in comment.body:
        return replace(comment, body=minimal)
    start = comment.body[:FALLBACK_COMMENT_CHARS]
    if len(comment.body) > FALLBACK_COMMENT_CHARS and "\n" in start:
        start = start[:start.rindex("\n")]
    body = start if start.startswith(COMMENT_MARKER) else f"{COMMENT_MARKER}\n{start}"
    return replace(comment, body=f"{body.rstrip()}\n\n_{REFUSED}: ampci's run page has all of it._\n")


def shortened(report: Report) -> Report | None:
    """The next shorter form of ``report`` after GitHub refused it with 422 (module docstring); None when it
    is the shortest already.  Each form differs from the one before and the chain ends within two steps."""
    if isinstance(report, CheckRun):
        return _check(report)
    if isinstance(report, PullRequestComment):
        return _comment(report)
    return _status(report)


def last_resort(report: Report) -> Report | None:
    """The minimal form of a check run's completion (a conclusion set) that GitHub refused other than with 422
    or that failed ``max_attempts`` times: a fixed title and summary, no text, no link, its status and
    conclusion kept; None for another report or when ``report`` is a minimal form already (then it is dropped
    and the check run stays open)."""
    if not isinstance(report, CheckRun) or report.conclusion is None:
        return None
    if report.summary in (CHECK_MINIMAL, CHECK_UNDELIVERED) and report.details_url is None and not report.text:
        return None
    return replace(report, title=CHECK_MINIMAL_TITLE, summary=CHECK_UNDELIVERED, text="", details_url=None)
