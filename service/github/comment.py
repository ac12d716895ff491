"""The pull-request report as GitHub-flavoured Markdown: the PR comment and the check run's output.

Pure functions of a :class:`~service.github.pr_report.PullRequestReport`.  Guarantees:

* every text that comes from outside (model and policy names, commit subjects, shas) goes through
  :func:`escape`, so it renders as itself: no table cell is split by a ``|``, no HTML or hidden
  marker is injected by a ``<``, nobody is mentioned by an ``@``, no link or emphasis appears;
* the comment starts with :data:`~service.github.client.COMMENT_MARKER` (how it is found again);
* the headline never says "no change" while a cell was not compared (no silent pass): cells that
  could not be measured or had nothing to compare with are named in the headline or a footnote;
* past :data:`FOLD_AFTER` rows the rest of the table is folded in a ``<details>`` block.
"""

from __future__ import annotations

import math
import re

from service.github.client import COMMENT_MARKER, MAX_COMMENT, CheckRun, PullRequestComment
from service.github.pr_report import LIVE_STATES, PullRequestReport, ReportRow

FOLD_AFTER = 20
CHECK_NAME = "ampci/smoke"
#: summary-line label of each bucket; categories without one are shown by name
LABELS = {"regression": ("❌", "regression", "regressions"), "improvement": ("⚡", "improvement", "improvements"),
          "flaky": ("〰️", "flaky", "flaky"), "suspected": ("🔎", "suspected", "suspected"),
          "unchanged": ("✅", "unchanged", "unchanged"), "new": ("🆕", "new", "new"),
          "not_measured": ("⚠️", "not measured", "not measured"),
          "known_failure": ("➖", "known failure", "known failures")}
SUMMARY_ORDER = ("regression", "improvement", "flaky", "unchanged", "new", "not_measured")
_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|~=:])")
_CONCLUSION = {"success": "success", "failure": "failure", "error": "failure", "pending": "neutral"}


def escape(text: object) -> str:
    """``text`` as literal Markdown inline text (one line; safe in a table cell)."""
    s = _SPECIAL.sub(r"\\\1", " ".join(str(text).split()))
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("@", "&#64;")


def _num(x: float | None) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    if x == 0:
        return "0"
    return f"{x:.3g}" if abs(x) >= 1000 or abs(x) < 0.001 else f"{x:.4g}"


def change_text(row: ReportRow) -> str:
    """The change of a finding: a percentage when the rule had a ratio, else the signed difference."""
    if row.ratio is not None and math.isfinite(row.ratio) and row.ratio > 0:
        return f"{(row.ratio - 1) * 100:+.1f}%"
    if row.delta is not None and math.isfinite(row.delta):
        return ("+" if row.delta > 0 else "") + _num(row.delta)
    return "–"


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _who(report: PullRequestReport) -> str:
    return f"Merging #{report.pr}" if report.pr is not None else f"Commit {report.head_sha[:7]}"


def headline(report: PullRequestReport) -> str:
    """One line verdict, e.g. ``Merging #7 regresses 2 cells`` or ``Merging #7: no change in 46 cells``."""
    c = report.counts
    who = _who(report)
    bad = []
    if c.get("regression"):
        bad.append(f"regresses {_plural(c['regression'], 'cell', 'cells')}")
    if c.get("not_measured"):
        bad.append(f"{c['not_measured']} of {_plural(report.cells, 'cell', 'cells')} could not be measured")
    if report.run_status in ("failed", "cancelled"):
        bad.append(f"the run {report.run_status}")
    if bad:
        icon = "❌" if c.get("regression") else "⚠️"
        verdict = f"{icon} {who} " + "; ".join(bad) if c.get("regression") else f"{icon} {who}: " + "; ".join(bad)
    elif report.cells and c.get("new") == report.cells:
        verdict = f"🆕 {who}: no baseline results to compare {_plural(report.cells, 'cell', 'cells')} with"
    elif report.cells == 0:
        verdict = f"⚠️ {who}: no cells ran; nothing was compared"
    else:
        compared = report.cells - report.not_compared
        if c.get("improvement"):
            verdict = (f"⚡ {who}: no regression in {_plural(compared, 'cell', 'cells')}, improves "
                       f"{_plural(c['improvement'], 'cell', 'cells')}")
        else:
            verdict = f"✅ {who}: no change in {_plural(compared, 'cell', 'cells')}"
    return verdict


def summary_line(report: PullRequestReport) -> str:
    """The counts of every bucket, e.g. ``❌ 2 regressions · ⚡ 1 improvement · … · ⚠️ 0 not measured``."""
    order = list(SUMMARY_ORDER)
    order[3:3] = [b for b in report.counts if b not in SUMMARY_ORDER and b != "known_failure"]  # added later
    if report.counts.get("known_failure"):
        order.append("known_failure")
    parts = []
    for b in order:
        icon, one, many = LABELS.get(b, ("•", b, b))
        n = report.counts.get(b, 0)
        parts.append(f"{icon} {n} {one if n == 1 else many}")
    return " · ".join(parts)


def _state(row: ReportRow) -> str:
    if row.state == "acknowledged":
        return "acknowledged ✔"
    if row.state not in LIVE_STATES:
        return row.state.replace("_", " ")
    return row.state


def _table(rows: tuple[ReportRow, ...] | list[ReportRow]) -> list[str]:
    out = ["| ID | Model | dtype | Policy | Target | Kind · metric | Baseline → head | Change | Severity | State |",
           "|---:|---|---|---|---|---|---|---:|---|---|"]
    for r in rows:
        live = r.state in LIVE_STATES
        model = f"[{escape(r.cell[0])}]({r.history_url})"
        cat = "" if r.category == "regression" else f" ({escape(r.category)})"
        cells = [f"[{r.id}]({r.finding_url})", model, escape(r.cell[1]), escape(r.cell[2]), escape(r.cell[3]),
                 f"{escape(r.kind)} · {escape(r.metric)}{cat}",
                 f"{_num(r.baseline_value)} → {_num(r.value)}", change_text(r), escape(r.severity),
                 escape(_state(r))]
        if not live:
            cells[1:9] = [f"~~{c}~~" for c in cells[1:9]]
        out.append("| " + " | ".join(cells) + " |")
    return out


def _footnotes(report: PullRequestReport) -> list[str]:
    notes: list[str] = []
    others = [r for r in report.baseline_revisions if r != report.baseline_sha]
    if report.fallback:
        base = f"`{report.baseline_sha[:12]}`" if report.baseline_sha else "none"
        notes.append(f"Baseline fallback: the PR base's tip {base} had no results for some cells; they were "
                     f"compared with {', '.join(f'`{escape(r[:12])}`' for r in others)} instead.")
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
    subject = f" {escape(report.head_subject)}" if report.head_subject else ""
    base = f"`{escape(report.baseline_sha[:12])}`" if report.baseline_sha else "none"
    return (f"Head `{escape(report.head_sha[:12])}`{subject} · baseline {base} · "
            f"[run {report.run_id}]({report.run_url}) ({escape(report.run_status)})")


def findings_markdown(report: PullRequestReport) -> list[str]:
    """The findings table (folded past :data:`FOLD_AFTER` rows) and how to acknowledge."""
    if not report.rows:
        return []
    rows = list(report.rows)
    lines = ["", *_table(rows[:FOLD_AFTER])]
    if len(rows) > FOLD_AFTER:
        lines += ["", "<details>", f"<summary>{len(rows) - FOLD_AFTER} more findings</summary>", "",
                  *_table(rows[FOLD_AFTER:]), "", "</details>"]
    lines += ["", "To acknowledge a finding: `ampci ack ID` (add `--false-positive` when it is noise), or the "
                  "**Acknowledge** button on its page (click the ID). Acknowledged findings stay listed as such."]
    return lines


def render_comment(report: PullRequestReport) -> str:
    """The whole PR comment (starts with the hidden marker; at most GitHub's size limit)."""
    notes = _footnotes(report)
    lines = [COMMENT_MARKER, f"### {headline(report)}", "", _head_line(report), "", summary_line(report),
             *findings_markdown(report)]
    if notes:
        lines += ["", *[f"<sub>{i}. {n}</sub>  " for i, n in enumerate(notes, 1)]]
    body = "\n".join(lines) + "\n"
    if len(body) > MAX_COMMENT:
        cut = "\n\n… the table is cut here: see the run page for the rest.\n"
        body = body[:MAX_COMMENT - len(cut)].rsplit("\n", 1)[0] + cut
    return body


def render_pending(pr: int, head_sha: str, run_id: int, run_url: str, previous: PullRequestReport | None) -> str:
    """The PR comment while a new head's run is queued or running: which head is being checked, and the
    previous head's report folded below (never shown as the new head's)."""
    lines = [COMMENT_MARKER, f"### ⏳ Merging #{pr}: checking `{escape(head_sha[:12])}`", "",
             f"[Run {run_id}]({run_url}) is checking this head; this comment is rewritten when it finishes."]
    if previous is not None:
        old = render_comment(previous).replace(COMMENT_MARKER, "", 1).strip()
        lines += ["", "<details>", f"<summary>Report of the previous head {escape(previous.head_sha[:12])} "
                  f"(run {previous.run_id})</summary>", "", old, "", "</details>"]
    body = "\n".join(lines) + "\n"
    return body if len(body) <= MAX_COMMENT else "\n".join(lines[:4]) + "\n"


def comment(report: PullRequestReport) -> PullRequestComment | None:
    """The PR comment for ``report`` (None when the run belongs to no pull request)."""
    if report.pr is None or not report.repo:
        return None
    return PullRequestComment(repo=report.repo, pr=report.pr, body=render_comment(report), sha=report.head_sha)


def check_run(report: PullRequestReport, name: str = CHECK_NAME) -> CheckRun | None:
    """The check run for ``report``: its title is the headline, its summary the counts and footnotes,
    its text the findings table (None when the run reports to no repository)."""
    if not report.repo:
        return None
    summary = "\n".join([_head_line(report), "", summary_line(report), "",
                         *[f"{i}. {n}" for i, n in enumerate(_footnotes(report), 1)]])
    return CheckRun(repo=report.repo, sha=report.head_sha, name=name,
                    conclusion=_CONCLUSION.get(report.state, "neutral"), title=headline(report),
                    summary=summary, text="\n".join(findings_markdown(report)).strip(), details_url=report.run_url)
