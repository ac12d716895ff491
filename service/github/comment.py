"""The pull-request report as GitHub-flavoured Markdown: the PR comment and the check run's output.

Pure functions of a :class:`~service.github.pr_report.PullRequestReport` (the table's rows:
:mod:`service.github.report_table`).  Guarantees:

* every text that comes from outside (model and policy names, commit subjects, shas) goes through
  :func:`escape`, so it renders as itself: no table cell is split by a ``|``, no HTML or hidden
  marker is injected by a ``<``, nobody is mentioned by an ``@``, no link or emphasis appears;
* the comment starts with :data:`~service.github.client.COMMENT_MARKER` (how it is found again);
* the headline never says "no change" while a cell was not compared, was flaky or failed as at its baseline
  (no silent pass): those cells are named in the headline or a footnote;
* the findings are one table; a text over GitHub's limit (the comment, the check run's text) loses whole
  rows from the table's end, never the headline, the counts, the table head, the footnotes or how to
  acknowledge, and says how many rows it left out with a link to the run page; every tag opened is closed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from service.github.client import COMMENT_MARKER, MAX_CHECK_TEXT, MAX_COMMENT, CheckRun, PullRequestComment
from service.github.live_checks import check_name
from service.github.pr_report import PullRequestReport
from service.github.report_table import TABLE_HEAD, change_text, escape, number, table_row

__all__ = ["CHECK_NAME", "change_text", "check_run", "comment", "escape", "headline", "number", "render_comment",
           "render_pending", "summary_line"]

CHECK_NAME = check_name("smoke")  # the default sweep's check run ("ampci smoke"; the status is "ampci/smoke")
#: summary-line label of each bucket; categories without one are shown by name
LABELS = {"regression": ("❌", "regression", "regressions"), "improvement": ("⚡", "improvement", "improvements"),
          "flaky": ("〰️", "flaky", "flaky"), "suspected": ("🔎", "suspected", "suspected"),
          "unchanged": ("✅", "unchanged", "unchanged"), "new": ("🆕", "new", "new"),
          "not_measured": ("⚠️", "not measured", "not measured"),
          "known_failure": ("➖", "cell failing as at the baseline", "cells failing as at the baseline")}
SUMMARY_ORDER = ("regression", "improvement", "flaky", "unchanged", "new", "not_measured")
#: The longest commit subject the head line shows (characters before escaping).
SUBJECT_CHARS = 120
ACKNOWLEDGE = ("To acknowledge a finding: `ampci ack ID` (add `--false-positive` when it is noise), or the "
               "**Acknowledge** button on its page (click the ID). Acknowledged findings stay listed as such.")
_CONCLUSION = {"success": "success", "failure": "failure", "error": "failure", "pending": "neutral"}


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _who(report: PullRequestReport) -> str:
    return f"Merging #{report.pr}" if report.pr is not None else f"Commit {report.head_sha[:7]}"


def _quiet(report: PullRequestReport) -> str:
    """What a passing headline must add: flaky cells and cells failing as at the baseline (``; 2 flaky, 1 cell
    fails as at the baseline``): shown as failing cells, never as passes."""
    c = report.counts
    parts = [f"{c['flaky']} flaky"] if c.get("flaky") else []
    if c.get("known_failure"):
        parts.append(f"{_plural(c['known_failure'], 'cell fails', 'cells fail')} as at the baseline")
    return "; " + ", ".join(parts) if parts else ""


def headline(report: PullRequestReport) -> str:
    """One line verdict, e.g. ``Merging #7 regresses 2 cells`` or ``Merging #7: no change in 46 cells`` (only
    when every cell was compared and none was flaky or a known failure: those are said instead).  Never a
    pass when the run's verdict (``report.state``, :func:`service.regressions.verdict.decide_run`) is
    ``error`` or ``failure``: its own phrases are said then."""
    c = report.counts
    who = _who(report)
    bad = []
    if c.get("regression"):
        bad.append(f"regresses {_plural(c['regression'], 'cell', 'cells')}")
    if c.get("not_measured"):
        bad.append(f"{c['not_measured']} of {_plural(report.cells, 'cell', 'cells')} could not be measured")
    if report.run_status == "failed":
        bad.append("the run failed")
    elif report.run_status == "cancelled":
        bad.append("the run was cancelled")
    if not bad and report.state in ("error", "failure"):  # the verdict failed the run for a reason said nowhere
        bad.extend(report.verdict_parts or (f"the gate says {report.state}",))  # above (a job ended in error)
    if bad:
        verdict = (f"❌ {who} " + "; ".join(bad) if c.get("regression") else f"⚠️ {who}: " + "; ".join(bad))
    elif report.cells and c.get("new") == report.cells:
        verdict = f"🆕 {who}: no baseline results to compare {_plural(report.cells, 'cell', 'cells')} with"
    elif report.cells == 0:
        verdict = f"⚠️ {who}: no cells ran; nothing was compared"
    else:
        compared = _plural(report.cells - report.not_compared, "cell", "cells")
        quiet = _quiet(report)
        if c.get("improvement"):
            verdict = f"⚡ {who}: no regression in {compared}, improves {_plural(c['improvement'], 'cell', 'cells')}"
        elif quiet:
            verdict = f"✅ {who}: no regression in {compared}"
        else:
            verdict = f"✅ {who}: no change in {compared}"
        verdict += quiet
    return verdict + (f" — {report.since}" if report.since else "")  # beside the verdict, never instead


def summary_line(report: PullRequestReport) -> str:
    """The counts of every bucket that has cells, e.g. ``❌ 2 regressions · ✅ 44 unchanged · ⚠️ 1 not measured``
    (``no cells`` when none has)."""
    order = list(SUMMARY_ORDER)
    order[3:3] = [b for b in report.counts if b not in SUMMARY_ORDER and b != "known_failure"]  # added later
    order.append("known_failure")
    parts = []
    for b in order:
        icon, one, many = LABELS.get(b, ("•", b.replace("_", " "), b.replace("_", " ")))
        n = report.counts.get(b, 0)
        if n:
            parts.append(f"{icon} {n} {one if n == 1 else many}")
    return " · ".join(parts) or "no cells"


def _sha(sha: str | None) -> str:
    return f"`{escape(sha[:12])}`" if sha else ""


def _footnotes(report: PullRequestReport) -> list[str]:
    notes: list[str] = []
    others = ", ".join(_sha(r) for r in report.baseline_revisions if r != report.baseline_sha)
    if report.fallback and report.baseline_sha:
        notes.append(f"Baseline fallback: the PR base's tip {_sha(report.baseline_sha)} had no results for some "
                     f"cells; they were compared with {others} instead.")
    elif report.fallback:
        notes.append(f"Baseline: the run named no base revision; its cells were compared with {others}.")
    c = report.counts
    if c.get("new"):
        notes.append(f"{_plural(c['new'], 'cell has', 'cells have')} no baseline result (first run of the cell): "
                     "not compared.")
    if report.not_measured:
        shown = ", ".join(f"{escape('/'.join(cell))} ({escape(why)})" for cell, why in report.not_measured[:10])
        more = f" and {len(report.not_measured) - 10} more" if len(report.not_measured) > 10 else ""
        notes.append(f"{_plural(len(report.not_measured), 'cell was', 'cells were')} not measured: {shown}{more}.")
    if report.best_effort:
        notes.append(f"⚠ The pass ran best-effort in {_plural(report.best_effort, 'cell', 'cells')}: without network, "
                     "mount and PID isolation (its worker could not make the sandbox; see AMPCI_SANDBOX).")
    return notes


def _head_line(report: PullRequestReport) -> str:
    subject = " ".join(report.head_subject.split())
    if len(subject) > SUBJECT_CHARS:
        subject = subject[:SUBJECT_CHARS - 1] + "…"
    subject = f" {escape(subject)}" if subject else ""
    base = f"baseline {_sha(report.baseline_sha)}" if report.baseline_sha else "no baseline revision"
    return (f"Head {_sha(report.head_sha)}{subject} · {base} · "
            f"[run {report.run_id}]({report.run_url}) ({escape(report.run_status)})")


def _left_out(report: PullRequestReport, shown: int) -> str:
    total = len(report.rows)
    return (f"**{total - shown} of {_plural(total, 'finding', 'findings')} left out here** (GitHub's size limit): "
            f"every finding is on the page of [run {report.run_id}]({report.run_url}).")


def _fit(report: PullRequestReport, head: Sequence[str], tail: Sequence[str], limit: int,
         size: Callable[[str], int] = len) -> str:
    """``head``, the findings table and ``tail`` (each a block separated by a blank line) in at most ``limit``
    characters (as ``size`` measures: UTF-8 bytes for a check run): whole rows are left out from the table's end (and a line says how many, linking the run page)
    until it fits; ``head`` and ``tail`` are always whole."""
    rows = [table_row(r) for r in report.rows]

    def text(shown: int) -> str:
        blocks = [list(head)]
        if rows:
            blocks.append([*TABLE_HEAD, *rows[:shown]])
            if shown < len(rows):
                blocks.append([_left_out(report, shown)])
        if tail:
            blocks.append(list(tail))
        return "\n\n".join("\n".join(b) for b in blocks if b) + "\n"

    lo, hi = 0, len(rows)
    if size(text(hi)) <= limit:
        return text(hi)
    while lo < hi:  # the most rows that fit (the length grows with the rows shown)
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if size(text(mid)) <= limit else (lo, mid - 1)
    return text(lo)


def _comment_parts(report: PullRequestReport) -> tuple[list[str], list[str]]:
    head = [f"### {headline(report)}", "", _head_line(report), "", summary_line(report)]
    tail = [ACKNOWLEDGE] if report.rows else []
    notes = _footnotes(report)
    if notes:
        tail += ["", *[f"<sub>{i}. {n}</sub>  " for i, n in enumerate(notes, 1)]]
    return head, tail


def render_comment(report: PullRequestReport, limit: int = MAX_COMMENT) -> str:
    """The whole PR comment in at most ``limit`` characters (GitHub's limit by default): the hidden marker,
    headline, head line, counts, the findings table (rows cut as :func:`_fit` says), how to acknowledge and the
    footnotes."""
    head, tail = _comment_parts(report)
    return _fit(report, [COMMENT_MARKER, *head], tail, limit)


def render_pending(pr: int, head_sha: str, run_id: int, run_url: str, previous: PullRequestReport | None) -> str:
    """The PR comment while a new head's run is queued or running: which head is being checked, and the
    previous head's report folded below (never shown as the new head's; cut like a report to fit)."""
    lines = [COMMENT_MARKER, f"### ⏳ Merging #{pr}: checking `{escape(head_sha[:12])}`", "",
             f"[Run {run_id}]({run_url}) is checking this head; this comment is rewritten when it finishes."]
    if previous is None:
        return "\n".join(lines) + "\n"
    fold = ["", "<details>", f"<summary>Report of the previous head {escape(previous.head_sha[:12])} "
            f"(run {previous.run_id})</summary>", ""]
    room = MAX_COMMENT - len("\n".join([*lines, *fold, "", "</details>"])) - 2
    head, tail = _comment_parts(previous)
    old = _fit(previous, head, tail, room).strip()
    return "\n".join([*lines, *fold, old, "", "</details>"]) + "\n"


def comment(report: PullRequestReport) -> PullRequestComment | None:
    """The PR comment for ``report`` (None when the run belongs to no pull request)."""
    if report.pr is None or not report.repo:
        return None
    return PullRequestComment(repo=report.repo, pr=report.pr, body=render_comment(report), sha=report.head_sha)


def _utf8(text: str) -> int:
    return len(text.encode())


def check_text(report: PullRequestReport, limit: int = MAX_CHECK_TEXT) -> str:
    """The check run's text: the findings table (cut at a row boundary with a notice, like the comment) and how
    to acknowledge, in at most ``limit`` bytes of UTF-8 (GitHub counts bytes); empty when the run has no
    finding."""
    if not report.rows:
        return ""
    return _fit(report, [], [ACKNOWLEDGE], limit, _utf8).strip()


def check_run(report: PullRequestReport, name: str = CHECK_NAME) -> CheckRun | None:
    """The check run for ``report``: its title is the headline, its summary the head line, counts and
    footnotes, its text the findings table (None when the run reports to no repository)."""
    if not report.repo:
        return None
    summary = "\n".join([_head_line(report), "", summary_line(report), "",
                         *[f"{i}. {n}" for i, n in enumerate(_footnotes(report), 1)]]).strip()
    return CheckRun(repo=report.repo, sha=report.head_sha, name=name,
                    conclusion=_CONCLUSION.get(report.state, "neutral"), title=headline(report),
                    summary=summary, text=check_text(report), details_url=report.run_url)
