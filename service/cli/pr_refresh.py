"""After a finding is triaged from the command line (``ampci ack``), the pull request's report is queued again."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from service.db.store import Store


def refresh_pr_report(store: Store, run_id: int) -> None:
    """Queue the pull request's report again after a triage (GitHub configured): into the shared Redis
    outbox the server posts from, or, without a broker, posted from here once.  Never fails the ack."""
    from service.github.outbox import MemoryOutbox
    from service.github.reporter import StatusReporter
    from service.settings import Settings

    try:
        settings = Settings.from_env()
        if not settings.github_token:
            return
        reporter = StatusReporter.from_settings(settings)
        try:
            if reporter.refresh(store, run_id) and isinstance(reporter.outbox, MemoryOutbox):
                reporter.drain()
        finally:
            reporter.close()
    except Exception as exc:  # noqa: BLE001 - the finding is acknowledged; the report follows later
        import sys

        print(f"note: the pull-request report was not updated: {exc}".splitlines()[0], file=sys.stderr)
