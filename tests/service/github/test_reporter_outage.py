"""The status reporter during a database outage: one WARNING line per failure, never a traceback (issue 24
item 4's rule for the service, applied to the reporter's background thread and its triage hooks); a
failure that is not an outage (a bug) still logs its traceback."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

from service.db import Store
from service.github.client import GitHubStatusClient
from service.github.outbox import MemoryOutbox
from service.github.reporter import StatusReporter

DEAD_DB = "postgresql+psycopg://ampci:secret@127.0.0.1:1/ampci?connect_timeout=2"


def _reporter(store: Any) -> StatusReporter:
    client = GitHubStatusClient("http://127.0.0.1:1", "token", timeout=0.5, attempts=1)
    return StatusReporter(MemoryOutbox(), client, public_url="https://ci.example.com", store=store,
                          watch_interval=0.05, poll_interval=0.05, reports=frozenset({"status", "comment", "check"}))


def _reporter_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "service.github.reporter"]


def test_a_dead_database_is_one_warning_line_per_failure(caplog: pytest.LogCaptureFixture) -> None:
    store = Store.from_url(DEAD_DB)
    reporter = _reporter(store)
    try:
        reporter.outbox.watch(41)
        caplog.set_level(logging.INFO)
        reporter.start()  # its loop checks the watched run: the database is down
        deadline = time.monotonic() + 20
        while reporter.outage_count < 3:
            assert time.monotonic() < deadline, caplog.text
            time.sleep(0.05)
        reporter.stop()
        assert reporter.refresh(store, 41) is False  # triage's hook: never raises
        assert reporter.report_pending(store, 41) is False
    finally:
        reporter.close()
        store.dispose()
    records = _reporter_records(caplog)
    assert len(records) >= 5
    for r in records:
        line = r.getMessage()
        assert r.levelno == logging.WARNING and r.exc_info is None and "\n" not in line, line
        assert "dependency unavailable" in line and "DatabaseUnavailableError" in line and "secret" not in line
    assert "Traceback" not in caplog.text
    assert "could not refresh the pull-request report of run 41" in caplog.text
    assert f"({reporter.outage_count} so far)" in caplog.text


def test_a_bug_is_still_logged_with_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    class Broken:
        """A store whose read fails with a programming error, not an outage (our own stand-in)."""

        def get_run(self, run_id: int) -> Any:
            raise ValueError(f"bug reading run {run_id}")

    reporter = _reporter(Broken())
    caplog.set_level(logging.INFO)
    try:
        assert reporter.refresh(Broken(), 7) is False
    finally:
        reporter.close()
    [record] = _reporter_records(caplog)
    assert record.levelno == logging.ERROR and record.exc_info is not None and reporter.outage_count == 0
