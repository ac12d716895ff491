"""The PR report's Markdown, as pure functions of a report: escaping, folding, footnotes, the headline
never saying "no change" of cells that were not compared, and buckets that add up to the run."""

from __future__ import annotations

import re
from typing import Any

import pytest

from service.github.client import COMMENT_MARKER, MAX_COMMENT
from service.github.comment import (
    FOLD_AFTER,
    check_run,
    comment,
    escape,
    headline,
    render_comment,
    summary_line,
)
from service.github.pr_report import BUCKETS, PullRequestReport, ReportRow, bucket_cells, history_url
from service.regressions.gate import GateDecision
from service.regressions.rules import CATEGORIES

BASE, OTHER, HEAD = "b" * 40, "c" * 40, "a" * 40


def _row(i: int, model: str = "mlp", category: str = "regression", state: str = "open") -> ReportRow:
    cell = (model, "fp16", "default", "cpu")
    return ReportRow(id=i, cell=cell, kind="accuracy", metric="max_abs", category=category, severity="major",
                     state=state, baseline_value=0.0069, value=0.0194, delta=0.0125, ratio=None,
                     history_url=history_url("https://ci.example.com", cell),
                     finding_url=f"https://ci.example.com/regressions/{i}")


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


def test_long_tables_fold_past_twenty_rows():
    rows = tuple(_row(i) for i in range(1, 31))
    body = render_comment(_report(rows, counts={"regression": 30}))
    visible, folded = body.split("<details>")
    assert visible.count("\n| [") == FOLD_AFTER and folded.count("\n| [") == 30 - FOLD_AFTER
    assert "<summary>10 more findings</summary>" in folded and "</details>" in folded
    assert "<details>" not in render_comment(_report(rows[:FOLD_AFTER], counts={"regression": 20}))


def test_a_huge_table_is_cut_to_githubs_limit():
    rows = tuple(_row(i, model="m" * 200) for i in range(1, 600))
    assert len(render_comment(_report(rows, counts={"regression": 599}))) <= MAX_COMMENT


def test_footnotes_for_fallback_new_and_unmeasured_cells():
    body = render_comment(_report(baseline_revisions=(BASE, OTHER), counts={"unchanged": 2, "new": 1,
                                                                         "not_measured": 1},
                                  not_measured=((("conv", "bf16", "default", "cpu"), "bad_spec"),)))
    assert f"compared with `{OTHER[:12]}` instead" in body and BASE[:12] in body
    assert "1 cell has no baseline result" in body and "conv/bf16/default/cpu (bad\\_spec)" in body
    assert "fallback" not in render_comment(_report()).lower()


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
    ({"unchanged": 2}, "cancelled", "⚠️ Merging #7: the run cancelled"),
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
