"""Nothing GitHub answers can stall the reporter (issue 33, point 7), against the loopback stand-in
(tests/service/github/github_standin.py) serving two repositories at once: ``acme/amp-pass`` misbehaves, ``acme/other``
is healthy.  Every test is bounded in time (a watchdog join) and the big answers in memory."""

from __future__ import annotations

import logging
import math
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pytest_httpserver import HTTPServer

from service.github.client import (
    CheckRun,
    CommitStatus,
    GitHubStatusClient,
    RateLimitedError,
    TransientStatusError,
)
from service.github.outbox import MemoryOutbox, RedisOutbox
from service.github.reporter import StatusReporter
from service.github_auth.transport import MAX_RETRY_DELAY, MIN_RETRY_DELAY
from tests.service.api.helpers import REPO, sha
from tests.service.github.github_standin import GitHubStandIn, app_client, app_standin, gzip_bomb

OTHER = "acme/other"
CAP = 1 << 20


@pytest.fixture
def server() -> Iterator[HTTPServer]:
    """A threaded loopback server: one hostile answer must not hold up the other repository's."""
    httpserver = HTTPServer(threaded=True)
    httpserver.start()
    yield httpserver
    httpserver.clear()
    httpserver.stop()


def _world(server: HTTPServer, mode: str, **client: Any) -> tuple[GitHubStandIn, GitHubStatusClient]:
    gh = app_standin(server, repos=(REPO, OTHER))
    gh.hostile[REPO.lower()] = mode
    client.setdefault("attempts", 1)
    client.setdefault("sleep", lambda s: None)
    return gh, app_client(server, max_answer_bytes=CAP, **client)


def _within(seconds: float, call: Callable[[], Any]) -> tuple[Any, float]:
    """(what ``call`` returned or raised, how long it took); fails when it runs past ``seconds``."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(call())
        except Exception as exc:  # noqa: BLE001 - handed to the test
            out.append(exc)

    started = time.monotonic()
    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"still running after {seconds}s"
    return out[0], time.monotonic() - started


def _status(repo: str = REPO, n: int = 0) -> CommitStatus:
    return CommitStatus(repo, sha(f"hostile-{repo}-{n}"), "pending", "queued")


def _check(repo: str = REPO) -> CheckRun:
    return CheckRun(repo, sha(f"hostile-check-{repo}"), "ampci smoke", "success", "title", "summary")


def test_a_trickled_answer_is_cut_at_the_deadline(server: HTTPServer):
    """One byte every 0.4 s never trips a per-read timeout; the total deadline (1.5 s) cuts it."""
    gh, client = _world(server, "trickle", timeout=1.5)
    gh.trickle_s = 0.4
    failed, took = _within(30, lambda: client.post_status(_status()))  # the trickle itself never ends
    assert isinstance(failed, TransientStatusError) and "within 1.5s" in str(failed), failed
    assert took >= 1.4  # it ran to its deadline (ending at all proves the trickle was cut)
    client.post_status(_status(OTHER))  # the pool is fine afterwards
    assert [s["repo"] for s in gh.statuses] == [OTHER]


@pytest.mark.parametrize("mode", ["huge", "gzip_bomb"])
def test_a_huge_or_bomb_answer_is_capped_in_memory(server: HTTPServer, mode: str):
    gzip_bomb()  # built before measuring
    gh, client = _world(server, mode, timeout=20.0)
    del gh.hostile[REPO.lower()]
    client.upsert_check_run(_check())  # imports, its token and connections warmed before measuring
    gh.hostile[REPO.lower()] = mode
    tracemalloc.start()
    try:
        failed, took = _within(30, lambda: client.upsert_check_run(_check()))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(failed, TransientStatusError) and f"larger than {CAP}" in str(failed), failed
    assert peak < 16 * CAP, f"peak {peak} bytes"  # the bomb inflates to 256 MiB, the body is endless


@pytest.mark.parametrize("value", ["1e9", "inf", "nan", "-5", "Wed, 21 Oct 2015 07:28:00 GMT", "1000000000"])
def test_any_retry_after_is_clamped(server: HTTPServer, value: str, redis_url: str, queue: str):
    gh, client = _world(server, f"retry_after:{value}")
    failed, _ = _within(10, lambda: client.post_status(_status()))
    assert isinstance(failed, RateLimitedError) and math.isfinite(failed.retry_after)
    assert MIN_RETRY_DELAY <= failed.retry_after <= MAX_RETRY_DELAY
    outbox = RedisOutbox(redis_url, prefix=queue)  # a non-finite due time would break Redis
    reporter = StatusReporter(outbox, client, public_url="https://ci.example.com", backoff_cap=5.0)
    reporter.queued(5, REPO, _status().sha)
    assert reporter.drain() == 0
    due = outbox._r.zrange(outbox._zset, 0, -1, withscores=True)
    assert len(due) == 1 and time.time() < due[0][1] <= time.time() + MAX_RETRY_DELAY + 1
    assert outbox.pending_count() == 1 and outbox.dead() == []


@pytest.mark.parametrize("mode", ["invalid_json", "big_id"])
def test_a_malformed_answer_is_an_attempt_with_one_line(server: HTTPServer, mode: str,
                                                       caplog: pytest.LogCaptureFixture):
    gh, client = _world(server, mode)
    reporter = StatusReporter(MemoryOutbox(), client, public_url="https://ci.example.com", max_attempts=3,
                              backoff_base=0.001, backoff_cap=0.001)
    caplog.set_level(logging.INFO)
    reporter.outbox.put(_check())
    for _ in range(50):
        reporter.drain()
        if reporter.outbox.pending_count() == 0:
            break
        time.sleep(0.01)
    [dead] = reporter.outbox.dead()
    assert dead["attempts"] == 2 and "gave up after 3 attempts: malformed answer" in dead["reason"]
    lines = [r for r in caplog.records if r.name.startswith("service.github")]
    # a completion: three attempts, then its minimal form three more (fallback.last_resort), one line each
    assert len(lines) == 6 and all(r.exc_info is None and "\n" not in r.getMessage() for r in lines)
    assert ["minimal form follows" in r.getMessage() for r in lines].count(True) == 1
    assert "left open" in lines[-1].getMessage()
    assert "Traceback" not in caplog.text


def _reporter(client: GitHubStatusClient) -> StatusReporter:
    reporter = StatusReporter(MemoryOutbox(), client, public_url="https://ci.example.com", poll_interval=0.05,
                              backoff_base=0.05, backoff_cap=0.1, max_attempts=50)
    reporter.start()
    return reporter


def _wait(until: Callable[[], bool], seconds: float) -> float:
    started = time.monotonic()
    while not until():
        assert time.monotonic() - started < seconds, f"not within {seconds}s"
        time.sleep(0.02)
    return time.monotonic() - started


#: the hostile repository's exchange deadline: long, so that a report queued behind it would show even on a
#: busy machine, where the healthy report itself may take seconds
HOSTILE_DEADLINE_S = 30.0


@pytest.mark.parametrize("mode", ["trickle", "huge", "gzip_bomb", "invalid_json", "retry_after:inf"])
def test_a_report_never_waits_behind_another_repositorys(server: HTTPServer, mode: str):
    """The hostile repository's report is queued first; the other's lands at once all the same."""
    gzip_bomb()
    gh, client = _world(server, mode, timeout=HOSTILE_DEADLINE_S)
    gh.trickle_s = 0.5
    reporter = _reporter(client)
    try:
        reporter.queued(1, REPO, _status().sha)
        _wait(lambda: gh.served.get(REPO.lower(), 0) >= 1, 30)
        reporter.queued(2, OTHER, _status(OTHER).sha)
        # had it queued behind the hostile exchange it would land only after that exchange's deadline
        took = _wait(lambda: any(s["repo"] == OTHER for s in gh.statuses), HOSTILE_DEADLINE_S * 2 / 3)
        assert took < HOSTILE_DEADLINE_S * 2 / 3, f"the healthy repository's report waited {took:.1f}s"
    finally:
        reporter.stop()
        client.close()


def test_a_rate_limit_pauses_only_its_installation(server: HTTPServer):
    """After a 429 the limited installation's reports wait in the outbox, uncalled and unslept on;
    the other repository's reports go on."""
    gh, client = _world(server, "retry_after:30")
    reporter = _reporter(client)
    try:
        for n in range(3):
            reporter.queued(n, REPO, _status(REPO, n).sha)
        _wait(lambda: gh.served.get(REPO.lower(), 0) >= 1, 10)
        for n in range(3):
            reporter.queued(10 + n, OTHER, _status(OTHER, n).sha)
        _wait(lambda: sum(s["repo"] == OTHER for s in gh.statuses) == 3, 5)
        time.sleep(0.3)
        assert gh.served[REPO.lower()] == 1  # the other two were deferred without a request
        assert reporter.outbox.pending_count() == 3 and reporter.outbox.dead() == []
    finally:
        reporter.stop()
        client.close()
