"""The findings table of the pull-request report: one Markdown table row per finding.

Pure functions of a :class:`~service.github.pr_report.ReportRow`.  Guarantees:

* every text that comes from outside (model and policy names, a rule's detail, a triage note) goes through
  :func:`escape`, so it renders as itself and never splits a table cell;
* a row is one line of bounded length (outside text is cut to a fixed number of characters) whose only link
  is the finding's page (which links the cell's history), so a 200-finding run fits one comment;
* a row without values (a conversion regression: a status flip) shows the rule's detail instead of dashes;
* a timing finding decided by interleaved pairs shows the evidence (pairs, median ratio, difference, p) and,
  when not confirmed, the limits it missed; any other state with a note shows the note (why it was dismissed,
  marked a false positive or acknowledged);
* metrics are shown by their label (:data:`METRIC_LABELS`), numbers without exponents from 0.001 up.
"""

from __future__ import annotations

import math
import re

from service.github.pr_report import LIVE_STATES, ReportRow
from service.regressions.rules import CAPPED_BY, CAPPED_LABEL

#: The label a reader sees for each finding metric (``regressions.metric``); an id missing here is shown as
#: itself (tests check every metric a rule can report has a label).
METRIC_LABELS = {
    "status": "status", "max_abs": "max abs error", "final_error": "final-step error",
    "compute_low": "low-precision compute nodes", "low_precision_fraction": "low-precision fraction",
    "casts_inserted": "casts inserted", "latency_p50_ms": "p50 latency (ms)", "convert_s": "conversion time (s)",
    "pass_iterations": "pass iterations",
}
TABLE_HEAD = ("| ID | Model | dtype | Policy | Target | Finding | Baseline → head | Change | Severity | State |",
              "|---:|---|---|---|---|---|---|---:|---|---|")
#: How much of an outside text (a rule's detail, a state's note) a row shows.
TEXT_CHARS = 160
_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|~=:])")
#: The figures :mod:`service.regressions.paired` writes into a finding's note (its ``detail``).
_PAIRED = re.compile(
    r"^(?P<verdict>[a-z ]+?) by (?P<n>\d+) interleaved pairs[^:]*: median ratio x(?P<ratio>[0-9.eE+-]+) "
    r"\(limit x(?P<rlim>[0-9.eE+-]+)\), median difference (?P<diff>[0-9.eE+-]+) (?P<unit>[a-zµ]+) "
    r"\(floor (?P<floor>[0-9.eE+-]+)\), Wilcoxon p=(?P<p>[0-9.eE+-]+) \(limit (?P<plim>[0-9.eE+-]+)\)$")


def escape(text: object) -> str:
    """``text`` as literal Markdown inline text (one line; safe in a table cell)."""
    s = _SPECIAL.sub(r"\\\1", " ".join(str(text).split()))
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("@", "&#64;")


def clipped(text: str, chars: int = TEXT_CHARS) -> str:
    """``text`` on one line, cut to ``chars`` characters (an ellipsis says so), then escaped."""
    one = " ".join(text.split())
    return escape(one if len(one) <= chars else one[:chars - 1] + "…")


def number(x: float | None) -> str:
    """A value for a reader: ``–`` when unknown, plain digits from 0.001 up (``1234.5``, never ``1.23e+03``),
    four significant digits below 1000, an exponent only below 0.001."""
    if x is None or not math.isfinite(x):
        return "–"
    if x == 0:
        return "0"
    if abs(x) >= 1000:
        return f"{x:.0f}" if abs(x) >= 100_000 or x == int(x) else f"{x:.1f}"
    return f"{x:.3g}" if abs(x) < 0.001 else f"{x:.4g}"


def metric_label(metric: str) -> str:
    """The reader's name of a finding metric (the id itself when it has no label)."""
    return METRIC_LABELS.get(metric, metric)


def change_text(row: ReportRow) -> str:
    """The change of a finding: a percentage when the rule had a ratio, else the signed difference."""
    if row.ratio is not None and math.isfinite(row.ratio) and row.ratio > 0:
        return f"{(row.ratio - 1) * 100:+.1f}%"
    if row.delta is not None and math.isfinite(row.delta):
        return ("+" if row.delta > 0 else "") + number(row.delta)
    return "–"


def paired_evidence(note: str) -> str | None:
    """The interleaved-pairs figures of a timing confirmation note, short (``confirmed by 9 pairs: ×1.31,
    +0.412 ms, p=0.002``); a verdict that did not confirm adds the limit each figure had to pass (why it was
    dismissed).  None for any other note."""
    m = _PAIRED.match(" ".join(note.split()))
    if m is None:
        return None
    g = {k: float(v) for k, v in m.groupdict().items() if k not in ("verdict", "unit", "n")}
    parts = [f"×{g['ratio']:.3g}", f"{g['diff']:+.3g} {m['unit']}", f"p={g['p']:.2g}"]
    if "dismissed" in m["verdict"] or "not confirmed" in m["verdict"]:
        parts = [f"{parts[0]} (limit ×{g['rlim']:.3g})", f"{parts[1]} (floor {g['floor']:g})",
                 f"{parts[2]} (limit {g['plim']:g})"]
    return f"{m['verdict']} by {m['n']} pairs: " + ", ".join(parts)


def state_text(row: ReportRow) -> str:
    """The State cell: the finding's state, and why when something says why (see the module docstring)."""
    if row.state == "suspected" and row.state_by == CAPPED_BY:
        word = CAPPED_LABEL
    else:
        word = "acknowledged ✔" if row.state == "acknowledged" else row.state.replace("_", " ")
    if not row.note:
        return escape(word)
    evidence = paired_evidence(row.note)
    if evidence is None:  # a note that starts by saying the state ("not confirmed: …") stands alone
        said = row.note.startswith(word.split(" (")[0])
        return clipped(row.note, 100) if said else f"{escape(word)}: {clipped(row.note, 100)}"
    return evidence if evidence.startswith(word) else f"{escape(word)}; {evidence}"


def _finding(row: ReportRow) -> str:
    kind, label = row.kind.replace("_", " "), metric_label(row.metric)
    what = kind if row.metric == "status" else label if kind in label else f"{kind} · {label}"
    text = escape(what) + ("" if row.category == "regression" else f" ({escape(row.category)})")
    if row.kind == "drift" and row.detail.startswith("drifted "):  # "drifted x4.5 over 8 commits, since REV"
        text += f": {clipped(row.detail.split(' (', 1)[0].split(';', 1)[0], 80)}"
    return text


def _values(row: ReportRow) -> str:
    if (row.baseline_value is None or row.value is None) and row.detail:
        return clipped(row.detail)
    return f"{number(row.baseline_value)} → {number(row.value)}"


def table_row(row: ReportRow) -> str:
    """The table line of one finding (cells in :data:`TABLE_HEAD`'s order; a finding that no longer counts
    is struck through, its State kept plain so its reason reads)."""
    severity = escape(row.severity)
    cells = [escape(row.cell[0]), escape(row.cell[1]), escape(row.cell[2]), escape(row.cell[3]), _finding(row),
             _values(row), change_text(row), f"**{severity}**" if row.severity == "critical" else severity]
    if row.state not in LIVE_STATES:
        cells = [f"~~{c}~~" for c in cells]
    return "| " + " | ".join([f"[{row.id}]({row.finding_url})", *cells, state_text(row)]) + " |"
