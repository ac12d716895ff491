"""The PR comment and check-run text against golden files (``AMPCI_UPDATE_GOLDEN=1`` rewrites them), each golden
justified apart from the code that wrote it: rendered by a GitHub-flavoured Markdown renderer (markdown-it-py,
CommonMark with GFM tables and strikethrough, raw HTML allowed as GitHub allows ``<details>`` and ``<sub>``),
its HTML must have exactly one findings table whose every row has all ten cells, every ``<details>`` closed,
the footnotes and the acknowledge line, and as many rows shown plus rows said to be left out as the run has
findings."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from service.github.client import COMMENT_MARKER, MAX_CHECK_TEXT
from service.github.comment import check_run, render_comment, render_pending
from service.github.pr_report import PullRequestReport
from tests.service.github import pr_report_scenarios as scenarios

GOLDEN = Path(__file__).resolve().parents[2] / "golden"
#: (golden name, report, the comment's size limit): the cut one is the 200 findings at a limit a reviewer
#: can read through (the cut at GitHub's own limit is tested in test_pr_comment.py)
CASES: list[tuple[str, Callable[[], PullRequestReport], int | None]] = [
    ("mixed", scenarios.mixed, None), ("clean", scenarios.clean, None), ("all_failed", scenarios.all_failed, None),
    ("200_findings", scenarios.two_hundred, None), ("cut", scenarios.two_hundred, 12_000),
    ("multibyte_cut", scenarios.multibyte, 12_000)]


def gfm(markdown: str) -> str:
    """``markdown`` as GitHub would show it (close enough for structure: tables, strikethrough, raw HTML)."""
    return MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"]).render(markdown)


class Page(HTMLParser):
    """The parts of rendered HTML the checks read: tables and their body rows' cells, ``<details>`` nesting,
    ``<sub>`` notes, the link targets and the whole text."""

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tables = 0
        self.head_cells: list[str] = []
        self.rows: list[list[str]] = []
        self.row_links: list[str] = []
        self.open_details = 0
        self.unbalanced = False
        self.subs: list[str] = []
        self.text: list[str] = []
        self._where: list[str] = []
        self._cell: list[str] | None = None
        self._sub: list[str] | None = None
        self.feed(html)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._where.append(tag)
        if tag == "table":
            self.tables += 1
        elif tag == "tr" and "tbody" in self._where:
            self.rows.append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "details":
            self.open_details += 1
        elif tag == "sub":
            self._sub = []
        elif tag == "a" and self.rows and "tbody" in self._where and len(self.rows[-1]) == 0:
            self.row_links.append(dict(attrs).get("href") or "")

    def handle_endtag(self, tag: str) -> None:
        if tag in self._where:
            while self._where.pop() != tag:
                pass
        if tag in ("td", "th") and self._cell is not None:
            text = "".join(self._cell).strip()
            (self.rows[-1] if tag == "td" else self.head_cells).append(text)
            self._cell = None
        elif tag == "details":
            self.open_details -= 1
            self.unbalanced |= self.open_details < 0
        elif tag == "sub" and self._sub is not None:
            self.subs.append("".join(self._sub))
            self._sub = None

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        for part in (self._cell, self._sub):
            if part is not None:
                part.append(data)

    @property
    def all_text(self) -> str:
        """The visible text, whitespace collapsed."""
        return " ".join("".join(self.text).split())


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / f"{name}.md"
    if os.environ.get("AMPCI_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert path.exists(), f"missing golden file {path}; run with AMPCI_UPDATE_GOLDEN=1"
    assert text == path.read_text()


def check_table(page: Page, report: PullRequestReport) -> None:
    """One table (none without findings); every row has ten cells, links its finding and keeps the table's order;
    rows shown plus rows left out are the run's findings."""
    total = len(report.rows)
    assert page.tables == (1 if total else 0)
    if not total:
        return
    assert page.head_cells[:2] == ["ID", "Model"] and len(page.head_cells) == 10
    assert all(len(r) == 10 and r[0] == str(report.rows[i].id) for i, r in enumerate(page.rows)), "a split row"
    assert page.row_links == [r.finding_url for r in report.rows[:len(page.rows)]]
    left = re.search(r"(\d+) of (\d+) findings? left out here", page.all_text)
    left_out = int(left.group(1)) if left else 0
    assert len(page.rows) + left_out == total and (left is None or int(left.group(2)) == total)
    if left:
        assert f"run {report.run_id}" in page.all_text.split("left out here")[1]
    for shown, row in zip(page.rows, report.rows, strict=False):
        assert shown[1] == row.cell[0] and "~~" not in " ".join(shown) and "\\" not in " ".join(shown)


@pytest.mark.parametrize(("name", "make", "limit"), CASES, ids=[c[0] for c in CASES])
def test_comment_golden_renders_as_github_would(name: str, make: Callable[[], PullRequestReport],
                                                limit: int | None):
    report = make()
    body = render_comment(report) if limit is None else render_comment(report, limit=limit)
    check_golden(f"pr_comment_{name}", body)
    assert len(body) <= (limit or 65536) and body.startswith(COMMENT_MARKER + "\n")
    html = gfm(body)
    page = Page(html)
    assert html.startswith(COMMENT_MARKER) and html.count("<h3>") == 1
    check_table(page, report)
    assert page.open_details == 0 and not page.unbalanced
    text = page.all_text
    assert ("To acknowledge a finding: ampci ack ID" in text) == bool(report.rows)
    notes = [s for s in page.subs if re.match(r"\d+\. ", s)]
    if report.fallback:
        assert notes[0].startswith("1. Baseline fallback: the PR base's tip ")
    if report.not_measured:
        cells = ", ".join(f"{'/'.join(c)} ({why})" for c, why in report.not_measured)
        assert any(f"not measured: {cells}." in n for n in notes), notes
    if report.counts.get("new"):
        assert any("no baseline result" in n for n in notes)
    assert [int(n.split(".")[0]) for n in notes] == list(range(1, len(notes) + 1))
    assert "e+" not in text and "latency_p50_ms" not in text and "– → –" not in text
    counts = body.splitlines()[5]  # marker, headline, blank, head line, blank, the counts
    assert counts.split(" · ")[0].split()[0] in "❌⚡〰️✅🆕⚠️➖" and not re.search(r"(^|· )\S+ 0 ", counts), counts


def test_the_check_run_golden_renders_as_github_would():
    """Title, summary and text as GitHub's checks page shows them (the title as its heading)."""
    report = scenarios.mixed()
    run = check_run(report)
    assert run is not None and run.conclusion == "failure"
    shown = f"## {run.title}\n\n{run.summary}\n\n{run.text}\n"
    check_golden("pr_check_mixed", shown)
    page = Page(gfm(shown))
    check_table(page, report)
    assert "To acknowledge a finding" in page.all_text and "Baseline fallback" in page.all_text


def test_the_multibyte_check_run_golden_fits_githubs_bytes():
    """The worst case for sizes: 2,000 findings named in 3- and 4-byte characters.  Justified apart from the code
    that cut it: every output field is within GitHub's 65,535 bytes of UTF-8 (what GitHub counts) and the text
    fills them (a cut by characters would stop far later, a needlessly early cut far earlier), the table is whole
    rows plus the line saying how many were left out with the run page's link, and the acknowledge line closes
    it."""
    report = scenarios.multibyte()
    run = check_run(report)
    assert run is not None
    output = run.body()["output"]
    assert isinstance(output, dict) and output["text"] == run.text and output["summary"] == run.summary
    sizes = {k: len(v.encode()) for k, v in output.items()}
    assert max(sizes.values()) <= MAX_CHECK_TEXT and sizes["text"] > MAX_CHECK_TEXT - 1000, sizes
    assert len(run.text) < MAX_CHECK_TEXT - 2000  # rows left out well under the limit in characters: bytes cut it
    shown = f"## {run.title}\n\n{run.summary}\n\n{run.text}\n"
    check_golden("pr_check_multibyte", shown)
    page = Page(gfm(shown))
    check_table(page, report)
    assert 0 < len(page.rows) < len(report.rows) and "left out here" in page.all_text
    assert run.text.splitlines()[-1].startswith("To acknowledge a finding")


def test_a_pending_comment_folds_the_cut_previous_report_whole():
    report = scenarios.two_hundred()
    body = render_pending(42, "5" * 40, 119, f"{scenarios.PUBLIC}/runs/119", report)
    page = Page(gfm(body))
    assert page.open_details == 0 and not page.unbalanced and body.count("<details>") == 1
    check_table(page, report)
