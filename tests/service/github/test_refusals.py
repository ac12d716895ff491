"""GitHub's refusals are answered (issue 41, point 1), against the loopback stand-in that enforces GitHub's
documented rate-limit rules (a request sent while limited is refused again and counted as ``early``) and its
validation (422): a secondary rate limit without ``Retry-After`` is waited out, a primary one until its reset,
an undocumented 4xx is retried a bounded number of times with GitHub's answer in one log line, and a final
report GitHub refused with 422 still lands in a shortened form."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
from pytest_httpserver import HTTPServer

from service.github.client import COMMENT_MARKER, CheckRun, CommitStatus, PullRequestComment
from service.github.fallback import CHECK_MINIMAL, CHECK_UNDELIVERED, REFUSED, shortened, status_minimal
from service.github.outbox import MemoryOutbox, RedisOutbox, StatusOutbox
from service.github.refusals import (
    KNOWN_REFUSALS,
    SECONDARY_WAIT,
    UNEXPECTED_ATTEMPTS,
    PermanentStatusError,
    RateLimitedError,
    TransientStatusError,
    UnexpectedStatusError,
    classify,
    redact,
)
from service.github.reporter import StatusReporter
from tests.service.api.helpers import REPO, sha
from tests.service.github.github_standin import SECONDARY_MESSAGE, GitHubStandIn, app_client, app_standin
from tests.waiting import wait_until

PR = 7
PUBLIC = "https://ci.example.com"
WINDOW = 1.5  # the stand-in's secondary-limit window and the client's least wait, shortened from GitHub's minute


@pytest.fixture(params=["memory", "redis"])
def outbox(request: pytest.FixtureRequest, redis_url: str, queue: str) -> StatusOutbox:
    return MemoryOutbox() if request.param == "memory" else RedisOutbox(redis_url, prefix=queue)


def _world(server: HTTPServer, outbox: StatusOutbox, **standin: Any) -> tuple[GitHubStandIn, StatusReporter]:
    gh = app_standin(server, **standin)
    gh.secondary_window = WINDOW
    client = app_client(server, attempts=2, backoff_base=0.01, rate_limit_wait=WINDOW)
    reporter = StatusReporter(outbox, client, public_url=PUBLIC, backoff_base=0.01, backoff_cap=0.05)
    return gh, reporter


@pytest.fixture
def world(httpserver: HTTPServer, outbox: StatusOutbox) -> Iterator[tuple[GitHubStandIn, StatusReporter]]:
    gh, reporter = _world(httpserver, outbox)
    yield gh, reporter
    reporter.close()


def _settle(reporter: StatusReporter) -> None:
    """Drain until the outbox is empty (rate-limited items wait for their pause; nothing sleeps on GitHub)."""
    wait_until(lambda: reporter.drain() >= 0 and reporter.outbox.pending_count() == 0, "the outbox empty",
               every=0.05, detail=reporter.outbox.dead)


# -- classification ---------------------------------------------------------------------------------

def test_rate_limits_are_classed_as_github_documents():
    now = time.time()
    plain: dict[str, str] = {}
    secondary = classify(403, {"x-ratelimit-remaining": "4000"}, SECONDARY_MESSAGE, "PATCH u", REPO)
    assert isinstance(secondary, RateLimitedError) and secondary.retry_after == SECONDARY_WAIT == 60.0
    assert classify(429, plain, SECONDARY_MESSAGE, "PATCH u", REPO, wait=7.0).retry_after == 7.0  # type: ignore[attr-defined]
    with_reset = classify(403, {"x-ratelimit-reset": str(int(now) + 300)}, SECONDARY_MESSAGE, "PATCH u", REPO)
    assert isinstance(with_reset, RateLimitedError) and 290 <= with_reset.retry_after <= 300
    told = classify(403, {"retry-after": "30"}, SECONDARY_MESSAGE, "PATCH u", REPO)
    assert isinstance(told, RateLimitedError) and told.retry_after == 30
    primary = classify(403, {"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(int(now) + 900)},
                       "API rate limit exceeded", "GET u", REPO)
    assert isinstance(primary, RateLimitedError) and 890 <= primary.retry_after <= 900
    assert isinstance(classify(429, plain, "slow down", "GET u", REPO), RateLimitedError)
    assert type(classify(403, plain, "Resource not accessible by integration", "GET u", REPO)) is PermanentStatusError
    for status in KNOWN_REFUSALS:
        refused = classify(status, plain, "no", "POST u", REPO)
        assert type(refused) is PermanentStatusError and refused.status == status
    for status in (402, 409, 418, 451):
        odd = classify(status, plain, "odd", "POST u", REPO)
        assert isinstance(odd, UnexpectedStatusError) and odd.status == status
    assert type(classify(502, plain, "bad gateway", "POST u", REPO)) is TransientStatusError


def test_githubs_answer_is_one_redacted_line():
    answer = "conflict\nfor ghs_abcdefghijklmnop and Bearer eyJhbGciOiJSUzI1NiJ9.x at https://u:secret@h/x " + "y" * 500
    line = str(classify(409, {}, answer, "POST https://api.example.com/x", REPO))
    assert "\n" not in line and "ghs_abcdefghijklmnop" not in line and "eyJhbGciOiJSUzI1NiJ9" not in line
    assert "secret" not in line and "ghs_***" in line and len(line) < 300
    assert redact("a\n\tb  c") == "a b c"


# -- the rate limits, waited out ----------------------------------------------------------------------

def test_the_final_comment_is_written_after_a_secondary_rate_limit(world: tuple[GitHubStandIn, StatusReporter]):
    """The "checking" comment is replaced by the final report although GitHub first answered its edit with a
    secondary rate limit (403, no Retry-After): nothing is sent before the wait, and the report lands."""
    gh, reporter = world
    head = sha("secondary-final")
    reporter.outbox.put(PullRequestComment(REPO, PR, f"{COMMENT_MARKER}\n### ⏳ Merging #7: checking", head))
    _settle(reporter)
    gh.script["edit"] = ["secondary"]
    reporter.outbox.put(PullRequestComment(REPO, PR, f"{COMMENT_MARKER}\n### ✅ Merging #7 is clean", head))
    assert reporter.drain() == 0 and len(gh.limited_at) == 1
    _settle(reporter)
    landed = time.time()
    [comment] = gh.pr_comments()
    assert comment["body"].endswith("is clean") and "checking" not in comment["body"]
    assert gh.early == 0 and landed - gh.limited_at[0] >= WINDOW - 0.05
    assert reporter.outbox.dead() == []


@pytest.mark.parametrize("how", ["secondary_reset", "primary"])
def test_a_limit_with_a_reset_waits_until_it(world: tuple[GitHubStandIn, StatusReporter], how: str):
    gh, reporter = world
    gh.script["status"] = [how]
    reporter.outbox.put(CommitStatus(REPO, sha(f"reset-{how}"), "success", "4 cells: 4 pass", f"{PUBLIC}/runs/1"))
    _settle(reporter)
    assert gh.early == 0 and [s["state"] for s in gh.statuses] == ["success"]
    assert time.time() - gh.limited_at[0] >= 2 * WINDOW


def test_an_undocumented_4xx_is_retried_a_bounded_number_of_times(world: tuple[GitHubStandIn, StatusReporter],
                                                                  caplog: pytest.LogCaptureFixture):
    gh, reporter = world
    caplog.set_level(logging.WARNING, "service.github.reporter")
    gh.script["status"] = [409]
    reporter.outbox.put(CommitStatus(REPO, sha("odd-once"), "pending", "queued"))
    _settle(reporter)
    assert [s["description"] for s in gh.statuses] == ["queued"]
    gh.script["status"] = [418] * (UNEXPECTED_ATTEMPTS + 5)
    reporter.outbox.put(CommitStatus(REPO, sha("odd-always"), "pending", "queued"))
    _settle(reporter)
    assert len(gh.script["status"]) == 5  # UNEXPECTED_ATTEMPTS posts, each one request, then dropped
    [dead] = reporter.outbox.dead()
    assert "HTTP 418" in dead["reason"] and "scripted 418" in dead["reason"]
    lines = [r.getMessage() for r in caplog.records if r.name == "service.github.reporter" and "418" in r.getMessage()]
    assert len(lines) == UNEXPECTED_ATTEMPTS and all("\n" not in line and "scripted 418" in line for line in lines)


# -- 422: a shortened report ------------------------------------------------------------------------------

def _check(status: str, text: str = "") -> CheckRun:
    return CheckRun(REPO, sha("refused-check"), "ampci smoke", "failure" if status == "completed" else None,
                    "❌ 2,000 regressions", "Head 3f9c2e1a7b4d · baseline 9a1b7c3d5e2f · [run 118](x)\n\n❌ 2,000",
                    text=text, details_url=f"{PUBLIC}/runs/118", status=status, external_id="118")


@pytest.mark.parametrize("also_refused", [0, 1])
def test_a_check_run_whose_completion_was_refused_still_completes(world: tuple[GitHubStandIn, StatusReporter],
                                                                  also_refused: int):
    """GitHub refuses the completion (422: here a stand-in holding output to 3,000 bytes, and for
    ``also_refused`` its shortened form too): the check run still ends completed with its conclusion, linking
    the run page while it can."""
    gh, reporter = world
    reporter.outbox.put(_check("in_progress"))
    _settle(reporter)
    gh.output_limit = 3000
    gh.script["check_write"] = [422] * (2 * also_refused)  # the completion and its first shortened form
    reporter.outbox.put(_check("completed", text="| row |\n" * 2000))
    _settle(reporter)
    [check] = gh.checks
    assert check["status"] == "completed" and check["conclusion"] == "failure" and not check["output"].get("text")
    if also_refused:
        assert check["output"]["summary"] == CHECK_MINIMAL
    else:
        assert REFUSED in check["output"]["summary"] and f"({PUBLIC}/runs/118)" in check["output"]["summary"]
        assert check["output"]["summary"].startswith("Head 3f9c2e1a7b4d")
    assert reporter.outbox.dead() == []


@pytest.mark.parametrize(("refusals", "lands"), [
    ([400], True),                          # another permanent refusal: the minimal form follows once
    ([418] * UNEXPECTED_ATTEMPTS, True),    # the most attempts of an undocumented 4xx: likewise
    ([400, 400], False),                    # GitHub refuses the minimal form too: left open, one line
    ([422, 422, 422], False),               # every shortened form refused
])
def test_a_completion_is_dropped_only_after_its_minimal_form(world: tuple[GitHubStandIn, StatusReporter],
                                                             caplog: pytest.LogCaptureFixture,
                                                             refusals: list[int], lands: bool):
    gh, reporter = world
    caplog.set_level(logging.WARNING, "service.github.reporter")
    reporter.outbox.put(_check("in_progress"))
    _settle(reporter)
    gh.script["check_write"] = list(refusals)
    reporter.outbox.put(_check("completed", text="| row |\n" * 20))
    _settle(reporter)
    assert gh.script["check_write"] == []  # every scripted refusal met a write
    [check] = gh.checks
    left_open = [r.getMessage() for r in caplog.records if "left open" in r.getMessage()]
    if lands:
        assert check["status"] == "completed" and check["conclusion"] == "failure"
        assert check["output"]["summary"] == CHECK_UNDELIVERED and not check["output"].get("text")
        assert reporter.outbox.dead() == [] and left_open == []
    else:
        assert check["status"] == "in_progress"
        assert len(left_open) == 1 and str(_check("completed").key) in left_open[0] and "\n" not in left_open[0]
        assert len(reporter.outbox.dead()) == 1


def test_a_refused_status_and_comment_land_shortened(world: tuple[GitHubStandIn, StatusReporter]):
    gh, reporter = world
    gh.script["status"] = [422]
    gh.script["create"] = [422]
    reporter.outbox.put(CommitStatus(REPO, sha("refused-status"), "failure", "1 regression", f"{PUBLIC}/runs/3"))
    reporter.outbox.put(PullRequestComment(REPO, PR, f"{COMMENT_MARKER}\n### ❌ report\n" + "| r |\n" * 3000))
    _settle(reporter)
    [status] = gh.statuses
    assert status["state"] == "failure" and status["description"] == status_minimal("failure")
    assert status["target_url"] == f"{PUBLIC}/runs/3"
    [comment] = gh.pr_comments()
    assert comment["body"].startswith(f"{COMMENT_MARKER}\n### ❌ report") and REFUSED in comment["body"]
    assert len(comment["body"]) <= 8100


def test_the_shortened_forms_end():
    """Every report kind's chain of shortened forms is finite, each form differs from the one before, and
    keeps the key (so it supersedes the refused report) and what GitHub shows (status, conclusion, state)."""
    for report in (_check("completed", "x" * 70_000), _check("in_progress"),
                   CommitStatus(REPO, sha("s"), "error", "x" * 200, f"{PUBLIC}/runs/1"),
                   PullRequestComment(REPO, PR, "no marker\n" * 9000)):
        chain = [report]
        while (nxt := shortened(chain[-1])) is not None:
            assert nxt != chain[-1] and nxt.key == report.key and len(chain) < 3
            chain.append(nxt)
        assert len(chain) == 3
        for form in chain[1:]:
            if isinstance(form, CheckRun):
                assert (form.status, form.conclusion) == (report.status, report.conclusion)  # type: ignore[union-attr]
            elif isinstance(form, CommitStatus):
                assert form.state == "error"
            else:
                assert form.body.startswith(COMMENT_MARKER)


@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_a_shortened_form_never_overwrites_a_newer_report(redis_url: str, queue: str, kind: str):
    outbox: StatusOutbox = MemoryOutbox() if kind == "memory" else RedisOutbox(redis_url, prefix=queue)
    outbox.put(_check("completed"))
    [claimed] = outbox.claim(time.time(), 10, lease=60)
    short = shortened(claimed.status)
    assert short is not None and outbox.replace(claimed, short)
    [again] = outbox.claim(time.time(), 10, lease=60)
    assert again.status == short and again.attempts == 0
    outbox.put(_check("completed", text="newer"))  # superseded while in flight
    assert not outbox.replace(again, shortened(short))  # type: ignore[arg-type]
    [newer] = outbox.claim(time.time(), 10, lease=60)
    assert isinstance(newer.status, CheckRun) and newer.status.text == "newer"


def test_a_rate_limit_of_the_apps_own_calls_is_waited_out(httpserver: HTTPServer):
    """Minting the installation token meets the secondary limit: a rate limit to wait out, not a refusal."""
    gh = app_standin(httpserver)
    client = app_client(httpserver, attempts=1)
    gh.script["app"] = ["secondary"]
    try:
        client.post_status(CommitStatus(REPO, sha("app-limited"), "pending", "queued"))
    except RateLimitedError as exc:
        assert exc.retry_after == SECONDARY_WAIT and "rate limited" in str(exc)
    else:
        raise AssertionError("the rate-limited mint was not reported as such")
    finally:
        client.close()
    assert gh.statuses == []
