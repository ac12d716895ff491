"""The PR report's Markdown, as pure functions of a report: escaping, folding, footnotes, the headline
never saying "no change" of cells that were not compared, and buckets that add up to the run."""

from __future__ import annotations

import re
from typing import Any

import pytest

from service.github.client import COMMENT_MARKER, MAX_COMMENT
from service.github.comment import (
    check_run,
    check_text,
    comment,
    escape,
    headline,
    render_comment,
    render_pending,
    summary_line,
)
from service.github.pr_report import BUCKETS, PullRequestReport, ReportRow, bucket_cells, row_order
from service.regressions.gate import GateDecision
from service.regressions.rules import CATEGORIES

BASE, OTHER, HEAD = "b" * 40, "c" * 40, "a" * 40


def _row(i: int, model: str = "mlp", category: str = "regression", state: str = "open", **kw: Any) -> ReportRow:
    cell = (model, "fp16", "default", "cpu")
    base: dict[str, Any] = dict(id=i, cell=cell, kind="accuracy", metric="max_abs", category=category,
                                severity="major", state=state, baseline_value=0.0069, value=0.0194, delta=0.0125,
                                ratio=None, finding_url=f"https://ci.example.com/regressions/{i}")
    return ReportRow(**{**base, **kw})


def _report(rows: tuple[ReportRow, ...] = (), **kw: Any) -> PullRequestReport:
    counts = {b: 0 for b in BUCKETS}
    counts.update(kw.pop("counts", {"unchanged": 4}))
    base: dict[str, Any] = dict(repo="acme/amp-pass", pr=7, run_id=3, run_url="https://ci.example.com/runs/3",
                                run_status="complete", head_sha=HEAD, head_subject="PR #7: cast", baseline_sha=BASE,
                                baseline_revisions=(BASE,), cells=sum(counts.values()), counts=counts, rows=rows)
    base.update(kw)
    return PullRequestReport(**base)


@pytest.mark.parametrize("text", ["a|b", "x_y*z", "[link](http://evil)", "<!-- ampci:pr-report -->",
                                  "@octocat", "`code`", "# head", "line\nbreak", "a&b", "<img src=x>", "~~s~~"])
def test_escaped_text_renders_as_itself(text: str):
    out = escape(text)
    assert "\n" not in out and not re.search(r"(?<!\\)\|", out) and "<" not in out and "@" not in out
    assert COMMENT_MARKER not in out and "](" not in out.replace("\\]\\(", "")
    unescaped = re.sub(r"\\(.)", r"\1", out).replace("&lt;", "<").replace("&gt;", ">").replace("&#64;", "@")
    assert unescaped.replace("&amp;", "&") == " ".join(text.split())


def test_a_model_name_with_markdown_keeps_the_table_shape():
    body = render_comment(_report((_row(1, model="a|b_*c*"),), counts={"regression": 1, "unchanged": 3}))
    [line] = [x for x in body.splitlines() if x.startswith("| [1]")]
    assert len(re.split(r"(?<!\\)\|", line)) == 12 and "a\\|b\\_\\*c\\*" in line
    assert body.count(COMMENT_MARKER) == 1 and body.startswith(COMMENT_MARKER)


def _shown(body: str) -> list[str]:
    return [x for x in body.splitlines() if x.startswith("| [")]


def test_long_tables_stay_one_table_of_short_rows():
    """200 findings, more than one per cell: every row in one table, each row well under GitHub's limit / 200
    (its only link is the finding's page), nothing left out."""
    rows = tuple(_row(i, model=f"model_{i % 100:03d}") for i in range(1, 201))
    body = render_comment(_report(rows, counts={"regression": 100}))
    assert len(_shown(body)) == 200 and "left out" not in body and "<details>" not in body
    assert max(len(r) for r in _shown(body)) < 200 and body.count("| ID | Model |") == 1
    assert "history?" not in body


def test_a_huge_table_is_cut_at_a_row_keeping_everything_else():
    rows = tuple(_row(i, model="m" * 200) for i in range(1, 600))
    report = _report(rows, counts={"regression": 599, "new": 1, "not_measured": 1}, baseline_revisions=(BASE, OTHER),
                     not_measured=((("conv", "bf16", "default", "cpu"), "bad_spec"),))
    body = render_comment(report)
    shown = _shown(body)
    assert len(body) <= MAX_COMMENT and body.startswith(COMMENT_MARKER) and "### ❌ Merging #7 regresses 599" in body
    assert f"**{599 - len(shown)} of 599 findings left out here**" in body and 0 < len(shown) < 599
    assert "[run 3](https://ci.example.com/runs/3)" in body.split("left out here")[1].splitlines()[0]
    assert shown[-1].endswith("| open |") and body.count("| ID | Model |") == 1
    for kept in ("❌ 599 regressions", "ampci ack ID", "Baseline fallback", "1 cell has no baseline result",
                 "conv/bf16/default/cpu (bad\\_spec)"):
        assert kept in body, kept
    # a comment that just fits is not cut; one row more than fits leaves out exactly one
    whole = render_comment(_report(rows[:50], counts={"regression": 50}))
    assert render_comment(_report(rows[:50], counts={"regression": 50}), limit=len(whole)) == whole
    cut = render_comment(_report(rows[:50], counts={"regression": 50}), limit=len(whole) - 1)
    assert len(_shown(cut)) < 50 and f"**{50 - len(_shown(cut))} of 50 findings left out here**" in cut


def test_the_check_run_text_is_cut_at_a_row_with_a_notice():
    rows = tuple(_row(i, model="m" * 200) for i in range(1, 600))
    text = check_text(_report(rows, counts={"regression": 599}))
    lines = text.splitlines()
    shown = [x for x in lines if x.startswith("| [")]
    assert len(text) <= 65535 and all(x.endswith("| open |") for x in shown)
    assert f"**{599 - len(shown)} of 599 findings left out here**" in text and text.endswith("stay listed as such.")
    assert check_text(_report()) == ""


def test_a_pending_comment_folds_a_huge_previous_report_and_closes_the_fold():
    rows = tuple(_row(i, model="m" * 200) for i in range(1, 600))
    body = render_pending(7, "d" * 40, 4, "https://ci.example.com/runs/4", _report(rows, counts={"regression": 599}))
    assert len(body) <= MAX_COMMENT and body.count(COMMENT_MARKER) == 1
    assert body.count("<details>") == body.count("</details>") == 1 and body.rstrip().endswith("</details>")
    assert "left out here" in body and "ampci ack ID" in body


def test_a_conversion_regression_row_says_what_happened():
    from service.regressions.rules import CellSample, conversion_rule
    from service.regressions.thresholds import Thresholds

    [f] = conversion_rule(CellSample("pass"), CellSample("convert_error"), Thresholds(), "mlp", "fp16")
    row = _row(1, kind=f.kind, metric=f.metric, severity=f.severity, baseline_value=None, value=None, delta=None,
               detail=f.detail)
    [line] = _shown(render_comment(_report((row,), counts={"regression": 1})))
    assert "| conversion | converted at baseline \\(pass\\), now convert\\_error | – | **critical** | open |" in line
    assert "– → –" not in line


def test_critical_sorts_before_major_and_minor():
    rows = [_row(1, severity="minor"), _row(2, severity="major"), _row(3, severity="critical"),
            _row(4, severity="info", category="improvement"), _row(5, severity="critical", state="false_positive")]
    assert [r.id for r in sorted(rows, key=row_order)] == [3, 2, 1, 4, 5]


def test_timing_findings_show_their_evidence_and_a_dismissal_its_reason():
    from service.regressions.paired import paired_verdict
    from service.regressions.thresholds import Thresholds

    slow = paired_verdict("latency", [1.0, 1.02, 0.99, 1.01, 1.0, 0.98, 1.03, 1.0, 1.01],
                          [1.31, 1.35, 1.3, 1.33, 1.29, 1.32, 1.36, 1.3, 1.34], Thresholds(), "ms")
    same = paired_verdict("latency", [1.0, 1.02, 0.99, 1.01, 1.0, 0.98, 1.03, 1.0, 1.01],
                          [1.01, 1.0, 1.0, 1.02, 0.99, 0.99, 1.02, 1.01, 1.0], Thresholds(), "ms")
    assert slow.confirmed and not same.confirmed
    timing = dict(kind="latency", metric="latency_p50_ms", baseline_value=1.0, value=1.31, delta=0.31, ratio=1.31)
    confirmed = _row(1, note=slow.detail, **timing)
    dismissed = _row(2, state="dismissed", note=same.detail, **timing)
    capped = _row(3, state="suspected", state_by="ampci-confirm-cap", note="not confirmed: confirmation cap", **timing)
    fp = _row(4, state="false_positive", note="runner died | mid-run")
    body = render_comment(_report((confirmed, dismissed, capped, fp), counts={"regression": 1, "unchanged": 3}))
    one, two, three, four = _shown(body)
    assert "| p50 latency \\(ms\\) |" in one and "1 → 1.31 | +31.0% |" in one
    assert one.endswith("| open; confirmed by 9 pairs: ×1.32, +0.32 ms, p=0.002 |"), one
    assert "~~" in two and two.endswith("| dismissed by 9 pairs: ×1.01 (limit ×1.1), +0.01 ms (floor 0.05), "
                                        "p=0.38 (limit 0.01) |"), two
    assert three.endswith("| not confirmed\\: confirmation cap |"), three
    assert four.endswith("| false positive: runner died \\| mid\\-run |"), four


@pytest.mark.parametrize(("value", "text"), [(None, "–"), (float("nan"), "–"), (0.0, "0"), (0.0069, "0.0069"),
                                             (6.9e-05, "6.9e-05"), (12.34567, "12.35"), (999.94, "999.9"),
                                             (1234.5678, "1234.6"), (1230.0, "1230"), (-2500.25, "-2500.2"),
                                             (12_345_678.9, "12345679")])
def test_numbers_read_plainly(value: float | None, text: str):
    from service.github.comment import number

    assert number(value) == text


def test_every_metric_a_rule_reports_has_a_label():
    from service.github.report_table import METRIC_LABELS
    from service.regressions.rules import DRIFT_METRICS

    assert set(DRIFT_METRICS) | {"status"} <= set(METRIC_LABELS)
    assert all("_" not in label for label in METRIC_LABELS.values())


def test_footnotes_for_fallback_new_and_unmeasured_cells():
    body = render_comment(_report(baseline_revisions=(BASE, OTHER), counts={"unchanged": 2, "new": 1,
                                                                         "not_measured": 1},
                                  not_measured=((("conv", "bf16", "default", "cpu"), "bad_spec"),)))
    assert f"compared with `{OTHER[:12]}` instead" in body and BASE[:12] in body
    assert "1 cell has no baseline result" in body and "conv/bf16/default/cpu (bad\\_spec)" in body
    assert "fallback" not in render_comment(_report()).lower()
    # a run that named no base revision: said so, never "the PR base's tip none"
    nameless = render_comment(_report(baseline_sha=None, baseline_revisions=(OTHER,)))
    assert f"Baseline: the run named no base revision; its cells were compared with `{OTHER[:12]}`." in nameless
    assert "none" not in nameless and "· no baseline revision ·" in nameless


def test_a_best_effort_sandbox_is_said_in_the_comment_and_the_check_run():
    body = render_comment(_report(best_effort=2))
    assert "The pass ran best-effort in 2 cells" in body
    assert "best-effort" not in render_comment(_report())
    run = check_run(_report(best_effort=1))
    assert run is not None and "best-effort in 1 cell" in run.summary


@pytest.mark.parametrize(("counts", "status", "want"), [
    ({"regression": 2, "unchanged": 46}, "complete", "❌ Merging #7 regresses 2 cells"),
    ({"unchanged": 46}, "complete", "✅ Merging #7: no change in 46 cells"),
    ({"unchanged": 40, "new": 6}, "complete", "✅ Merging #7: no change in 40 cells"),
    ({"new": 6}, "complete", "🆕 Merging #7: no baseline results to compare 6 cells with"),
    ({"unchanged": 5, "not_measured": 1}, "complete", "⚠️ Merging #7: 1 of 6 cells could not be measured"),
    ({"regression": 1, "not_measured": 1}, "complete", "❌ Merging #7 regresses 1 cell; 1 of 2 cells could not"),
    ({"unchanged": 2}, "cancelled", "⚠️ Merging #7: the run was cancelled"),
    ({"unchanged": 2}, "failed", "⚠️ Merging #7: the run failed"),
    ({"unchanged": 44, "flaky": 2}, "complete", "✅ Merging #7: no regression in 46 cells; 2 flaky"),
    ({"unchanged": 45, "known_failure": 1}, "complete",
     "✅ Merging #7: no regression in 46 cells; 1 cell fails as at the baseline"),
    ({"improvement": 1, "flaky": 1, "known_failure": 2}, "complete",
     "⚡ Merging #7: no regression in 4 cells, improves 1 cell; 1 flaky, 2 cells fail as at the baseline"),
    ({"improvement": 1, "unchanged": 3}, "complete", "⚡ Merging #7: no regression in 4 cells, improves 1 cell"),
    ({}, "complete", "⚠️ Merging #7: no cells ran"),
])
def test_headline(counts: dict[str, int], status: str, want: str):
    assert headline(_report(counts=counts, run_status=status)).startswith(want)


def test_summary_line_counts_every_bucket_and_acknowledged_findings_show_as_such():
    report = _report((_row(1, state="acknowledged"), _row(2, state="false_positive")),
                     counts={"regression": 1, "improvement": 2, "flaky": 3, "unchanged": 4, "new": 5, "not_measured": 6})
    assert summary_line(report) == ("❌ 1 regression · ⚡ 2 improvements · 〰️ 3 flaky · ✅ 4 unchanged · 🆕 5 new · "
                                    "⚠️ 6 not measured")
    body = render_comment(report)
    ack, fp = [x for x in body.splitlines() if x.startswith("| [")]
    assert ack.endswith("| acknowledged ✔ |") and fp.endswith("| false positive |") and "~~" in fp and "~~" not in ack
    # empty buckets are not listed
    assert summary_line(_report(counts={"regression": 1, "unchanged": 3, "known_failure": 2})) == (
        "❌ 1 regression · ✅ 3 unchanged · ➖ 2 cells failing as at the baseline")
    assert summary_line(_report(counts={})) == "no cells"


def test_check_run_carries_the_same_summary_and_a_conclusion():
    check = check_run(_report((_row(1),), counts={"regression": 1, "unchanged": 3}, state="failure"))
    assert check is not None and check.conclusion == "failure" and check.title.startswith("❌ Merging #7")
    assert "❌ 1 regression" in check.summary and "| [1]" in check.text
    body = check.body()
    assert body["head_sha"] == HEAD and body["status"] == "completed" and body["details_url"].endswith("/runs/3")
    assert check_run(_report(state="success")).conclusion == "success"  # type: ignore[union-attr]
    assert check_run(_report(state="error")).conclusion == "failure"  # type: ignore[union-attr]
    assert comment(_report(pr=None)) is None and check_run(_report(pr=None)) is not None


class _F:
    def __init__(self, cell: tuple[str, str, str, str], category: str, state: str = "open") -> None:
        self.cell, self.category, self.state = cell, category, state


def test_every_cell_is_in_exactly_one_bucket():
    cells = [(m, "fp16", "default", "cpu") for m in "abcdefg"]
    a, b, c, d, e, f, g = cells
    decision = GateDecision(1, unmeasured=((d, "bad_spec"), (a, "convert_error")), known_failures=((e, "timeout"),),
                            not_compared=(f, d))
    findings = [_F(a, "regression"), _F(a, "improvement"), _F(b, "improvement"), _F(c, "regression", "false_positive"),
                _F(g, "flaky", "acknowledged")]
    got = bucket_cells(cells, {a, b, c, d, e, f}, decision, findings)
    assert got == {a: "regression", b: "improvement", c: "unchanged", d: "not_measured", e: "known_failure",
                   f: "new", g: "flaky"}
    assert set(got.values()) <= set(BUCKETS) and all(cat in BUCKETS for cat in CATEGORIES if cat != "dismissed")


def test_an_unknown_report_kind_fails_at_start():
    from service.errors import ConfigError
    from service.github.reporter import StatusReporter
    from service.settings import Settings

    assert Settings().github_report_set() == frozenset({"status", "comment"})
    assert Settings.from_env({"AMPCI_GITHUB_REPORT": " Check , status"}).github_report_set() == {"check", "status"}
    with pytest.raises(ConfigError, match="AMPCI_GITHUB_REPORT: unknown report 'comments'"):
        StatusReporter.from_settings(Settings(github_report="status,comments", github_token="t"))
