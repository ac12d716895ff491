"""Report sizes as GitHub counts them (issue 41, point 2): check-run ``output.summary``/``text`` at most 65,535
bytes of UTF-8 whatever the characters, cut on a character and a line, keeping a closing note that links the
run page; the comment at most 65,536 characters.  The loopback GitHub refuses anything larger with 422, so
landing there is the check apart from the code that cut.  And the report comment is found by marker *and*
author, so ampci never overwrites an ordinary comment of its own."""

from __future__ import annotations

import pytest
from pytest_httpserver import HTTPServer

from service.github.client import COMMENT_MARKER, MAX_CHECK_TEXT, MAX_COMMENT, CheckRun, PullRequestComment
from service.github.comment import comment, render_pending
from service.github.report_items import cut_note, fit_bytes
from tests.service.api.helpers import REPO, sha
from tests.service.github import pr_report_scenarios as scenarios
from tests.service.github.github_standin import app_client, app_standin

RUN_PAGE = "https://ci.example.com/runs/118"
#: one table row per character width (1 to 4 bytes of UTF-8)
ROW = {1: "| model_a | fp16 | 0.0069 → 0.0194 | open |",
       2: "| modèle_é | fp16 | 0.0069 → 0.0194 | ouvert |",
       3: "| 模型_变换器 | fp16 | 0.0069 → 0.0194 | 打开 |",
       4: "| 🧪🧪_𝔪𝔬𝔡𝔢𝔩 | fp16 | 0.0069 → 0.0194 | 🔓 |"}


def _table(width: int, chars: int) -> str:
    """A table of rows of ``ROW[width]`` about ``chars`` characters long, closed by the acknowledge line."""
    rows = [ROW[width]] * (chars // (len(ROW[width]) + 1))
    return "\n".join(rows) + "\nTo acknowledge a finding: `ampci ack ID`."


@pytest.mark.parametrize("width", sorted(ROW))
def test_check_run_output_fits_githubs_bytes_and_keeps_its_closing_note(httpserver: HTTPServer, width: int):
    """The audit's case: a 57,220-character table of non-ASCII rows is over 65,535 bytes (so a cut by characters
    keeps it whole and GitHub refuses it); cut by bytes it fits, ends on a whole row and closes with the note
    linking the run page.  The loopback GitHub, which counts bytes, accepts it."""
    text = _table(width, 57_220)
    check = CheckRun(REPO, sha(f"bytes-{width}"), "ampci smoke", "failure", "❌ regressions", text, text=text,
                     details_url=RUN_PAGE, external_id="118")
    output = check.body()["output"]
    assert isinstance(output, dict)
    for field in ("summary", "text"):
        sent = output[field]
        assert len(sent.encode()) <= MAX_CHECK_TEXT
        if len(text.encode()) <= MAX_CHECK_TEXT:  # ASCII: nothing to cut
            assert sent == text
            continue
        assert sent.endswith(cut_note(RUN_PAGE)) and f"]({RUN_PAGE})" in sent
        kept = sent[:-len(cut_note(RUN_PAGE))].splitlines()
        assert kept and all(line == ROW[width] for line in kept)
        assert len(sent.encode()) > MAX_CHECK_TEXT - 2 * len(ROW[width].encode())  # only the row that did not fit
    gh = app_standin(httpserver)
    client = app_client(httpserver)
    client.upsert_check_run(check)
    [landed] = gh.checks
    assert landed["output"] == output


def test_a_cut_never_splits_a_character_and_always_fits():
    text = "a€𝄞é模\n" * 40
    note = cut_note(RUN_PAGE)
    for limit in range(len(note.encode()) - 3, len(text.encode()) + 3):
        cut = fit_bytes(text, limit, note)
        assert len(cut.encode()) <= limit
        if len(text.encode()) <= limit:
            assert cut == text
        else:
            assert text.startswith(cut[:-len(note)].rstrip()) or not cut.endswith(note)
            assert cut.encode().decode() == cut  # whole characters (a Python str cannot hold half of one)
    assert fit_bytes("🧪" * 10, 6, "") == "🧪"


def test_the_comment_stays_within_githubs_characters_whatever_the_characters(httpserver: HTTPServer):
    """GitHub counts the comment in characters (65,536): the multibyte report of 2,000 findings is cut to that
    by characters (not needlessly to bytes), and the loopback GitHub, which refuses more, accepts it."""
    report = scenarios.multibyte()
    made = comment(report)
    assert made is not None and len(made.body) <= MAX_COMMENT < len(made.body.encode())
    assert len(made.body) > MAX_COMMENT - 1000 and "left out here" in made.body
    pending = render_pending(42, scenarios.HEAD, 119, RUN_PAGE, report)
    assert len(pending) <= MAX_COMMENT and pending.rstrip().endswith("</details>")
    gh = app_standin(httpserver)
    client = app_client(httpserver)
    client.upsert_comment(PullRequestComment(REPO, 7, made.body))
    [posted] = gh.pr_comments()
    assert posted["body"] == made.body


def test_the_report_comment_is_found_by_marker_and_author(httpserver: HTTPServer):
    """ampci's identity may write other comments on a pull request (a fork's approval prompt, a note): the
    report edits only its own comment that carries the marker, never an ordinary comment of ampci's, nor a
    comment of someone else's that quotes the marker."""
    gh = app_standin(httpserver)
    client = app_client(httpserver)
    me = client.identity(REPO)
    gh.comments[1] = {"id": 1, "issue": 7, "body": "A maintainer must approve this fork's run.", "user": {"login": me}}
    gh.comments[2] = {"id": 2, "issue": 7, "body": f"quoting: {COMMENT_MARKER}", "user": {"login": "reviewer"}}
    made = client.upsert_comment(PullRequestComment(REPO, 7, "### ✅ clean"))
    assert made not in (1, 2)
    assert client.upsert_comment(PullRequestComment(REPO, 7, "### ❌ regressed")) == made
    bodies = {c["id"]: c["body"] for c in gh.pr_comments()}
    assert bodies[1] == "A maintainer must approve this fork's run." and bodies[2] == f"quoting: {COMMENT_MARKER}"
    assert bodies[made] == f"{COMMENT_MARKER}\n### ❌ regressed" and len(bodies) == 3
