"""Commit-status reporting: ``pending`` when a run is queued, the outcome when it finishes.

:class:`StatusReporter` writes every status to a durable :class:`~service.github.outbox.StatusOutbox`
first and posts it from there, so a GitHub outage or a crash between the two never loses a report:
transient failures are retried with exponential backoff (up to ``max_attempts`` posts), permanent
ones (bad token, unknown sha) are dropped to the outbox's dead list with the reason.  The run itself
lives in the database and is never touched by reporting.

Posting happens on a background thread (:meth:`start`) or by an explicit :meth:`drain`; the webhook
handler only enqueues, so it answers fast.  Final statuses: :meth:`queued` also puts the run id on
the outbox's watch list, and the background thread (:meth:`check_watched`, every ``watch_interval``
seconds) queues the outcome of each watched run once it reaches a final state, so no hook into the
workers is needed; a run-finished hook may call :meth:`finished` directly as well (idempotent: the
newer status for a commit supersedes the older).  :meth:`recover` re-watches unfinished webhook runs
after a restart.

Pull requests also get the report people read (``reports`` holds ``comment`` and/or ``check``, from
``AMPCI_GITHUB_REPORT``): when a run of a PR finishes, one comment per pull request
(:mod:`service.github.comment`) is queued in the same outbox, superseding an unsent older one and
edited in place on GitHub; a check run likewise.  :meth:`refresh` re-queues them after a finding
was acknowledged.  Only the newest run of a pull request writes its comment, so a slow run of an
older head never overwrites the report of the newer one.  Building or posting a report never
affects the run.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from service.github.client import (
    CommitStatus,
    GitHubStatusClient,
    PermanentStatusError,
    PullRequestComment,
    Report,
    TransientStatusError,
    backoff_delay,
)
from service.github.outbox import MemoryOutbox, OutboxItem, RedisOutbox, StatusOutbox
from service.settings import Settings

log = logging.getLogger(__name__)


def log_failure(what: str, exc: BaseException, count: int | None = None) -> None:
    """Log a reporting failure: a database or Redis outage (:func:`service.github.intake.is_infrastructure`)
    is one WARNING line (the error's type and first line, URLs redacted, with the running ``count``);
    anything else is a bug and keeps its traceback (ERROR)."""
    from service.github.intake import is_infrastructure
    from service.settings import redact_url

    if not is_infrastructure(exc):
        log.error("%s", what, exc_info=exc)
        return
    text = str(exc).strip().splitlines()
    first = redact_url(f"{type(exc).__name__}: {text[0] if text else ''}")[:300]
    log.warning("%s: dependency unavailable%s: %s", what, f" ({count} so far)" if count is not None else "", first)

CONTEXT = "ampci/smoke"
FINAL_RUN_STATES = frozenset({"complete", "partial", "failed", "cancelled"})


def final_state(summary: Any, verdict: Any = None) -> str:
    """Commit status state for a finished run's :class:`~service.db.records.RunSummary`.

    ``error``: the run failed or was cancelled, or a job errored/crashed (infrastructure, not the
    pass); ``failure``: at least one open or acknowledged regression; ``success`` otherwise.  With the
    run's ``verdict`` (:class:`service.regressions.verdict.RunVerdict`) a cell that could not measure
    fails too (``error`` or ``failure``: :attr:`RunVerdict.state`): never ``success``.
    """
    if summary.status in ("failed", "cancelled"):
        return "error"
    if any(summary.job_status.get(s, 0) for s in ("error", "crashed")):
        return "error"
    if verdict is not None and verdict.state in ("error", "failure"):
        return str(verdict.state)
    if sum(summary.regressions.values()):
        return "failure"
    return "success"


def status_text(store: Any, run_id: int, summary: Any) -> tuple[str, str]:
    """``(state, description)`` of the final commit status of run ``run_id``: the run's verdict
    (:func:`service.orchestration.judge.run_verdict`: cells that could not measure first, with their count,
    then regressions, known failures and cells not compared), then its counts as room allows."""
    if store is None:
        return final_state(summary), summary.describe()
    from service.orchestration.judge import run_verdict

    verdict = run_verdict(store, run_id)
    return final_state(summary, verdict), verdict.description(summary.describe())


def github_target(run: Any) -> tuple[str, str] | None:
    """(repo, sha) a run reports to: runs created from a webhook carry ``meta["github"]["repo"]``."""
    gh = (getattr(run, "meta", None) or {}).get("github")
    if not isinstance(gh, dict) or not isinstance(gh.get("repo"), str):
        return None
    return gh["repo"], run.revision_sha


class StatusReporter:
    """Queues and posts commit statuses for runs that came from GitHub.

    Guarantees: :meth:`queued` and :meth:`finished` only write to the outbox (no network) and never
    raise for GitHub problems; a status for a run is posted at least once unless GitHub answers with
    a permanent error or ``max_attempts`` posts failed; a newer status for the same commit supersedes
    an unsent older one.  Without a GitHub token the reporter is disabled and does nothing.
    """

    def __init__(self, outbox: StatusOutbox, client: GitHubStatusClient | None, *, public_url: str,
                 context: str = CONTEXT, max_attempts: int = 12, backoff_base: float = 2.0,
                 backoff_cap: float = 600.0, lease: float = 60.0, poll_interval: float = 1.0,
                 store: Any = None, watch_interval: float = 5.0,
                 reports: frozenset[str] = frozenset({"status"})) -> None:
        self.outbox = outbox
        self.client = client
        self.public_url = public_url.rstrip("/")
        self.context = context
        self.max_attempts = max_attempts
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self.lease = lease
        self.poll_interval = poll_interval
        self.store = store
        self.watch_interval = watch_interval
        self.reports = frozenset(reports)
        self._last_watch = 0.0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.outage_count = 0  # reporting failures caused by a database/Redis outage (one WARNING line each)

    @classmethod
    def from_settings(cls, settings: Settings, **kwargs: object) -> StatusReporter:
        """A reporter whose outbox is Redis when a ``redis://`` broker is configured, else in memory."""
        outbox: StatusOutbox
        if settings.broker_url.startswith(("redis://", "rediss://", "unix://")):
            outbox = RedisOutbox(settings.broker_url)
        else:
            outbox = MemoryOutbox()
        from service.github.auth import auth_from_settings

        auth = auth_from_settings(settings)  # ConfigError at start for half an App or a bad key
        client = GitHubStatusClient(settings.github_api_url, auth=auth) if auth is not None else None
        kwargs.setdefault("reports", settings.github_report_set())
        return cls(outbox, client, public_url=settings.public_url, **kwargs)  # type: ignore[arg-type]

    def _failed(self, what: str, exc: BaseException) -> None:
        from service.github.intake import is_infrastructure

        if is_infrastructure(exc):
            self.outage_count += 1
        log_failure(what, exc, self.outage_count if is_infrastructure(exc) else None)

    @property
    def enabled(self) -> bool:
        return self.client is not None

    def run_url(self, run_id: int) -> str:
        """The run's page, linked from the commit status."""
        return f"{self.public_url}/runs/{int(run_id)}"

    def note_installation(self, repo: str, installation: Any) -> None:
        """The GitHub App installation a webhook of ``repo`` named (``installation.id``; kept with the
        run's github meta): reports to ``repo`` use its token without looking the installation up."""
        if self.client is not None and type(installation) is int and installation > 0:
            self.client.remember_installation(repo, installation)

    def _note_run(self, run: Any) -> None:
        gh = (getattr(run, "meta", None) or {}).get("github")
        if isinstance(gh, dict) and isinstance(gh.get("repo"), str):
            self.note_installation(gh["repo"], gh.get("installation"))

    def queued(self, run_id: int, repo: str, sha: str, description: str = "queued",
               installation: int | None = None) -> None:
        """Queue a ``pending`` status for ``repo``@``sha`` and watch the run until it finishes; for a
        pull request, say on its comment that the new head is being checked (:meth:`report_pending`)."""
        if not self.enabled:
            return
        self.note_installation(repo, installation)
        if "status" in self.reports:
            self._put(CommitStatus(repo=repo, sha=sha, state="pending", description=description,
                                   target_url=self.run_url(run_id), context=self.context))
        try:
            self.outbox.watch(run_id)
        except Exception as exc:  # noqa: BLE001 - recover() finds unwatched runs again at start
            self._failed(f"could not watch run {run_id}", exc)
        if "comment" in self.reports and self.store is not None:
            self.report_pending(self.store, run_id)

    def awaiting(self, run_id: int, repo: str, sha: str, installation: int | None = None) -> None:
        """Queue the ``pending`` status of a pull request run awaiting a maintainer's approval
        (:data:`service.github.approval.AWAITING_DESCRIPTION`); its approval calls :meth:`queued`."""
        from service.github.approval import AWAITING_DESCRIPTION

        self.note_installation(repo, installation)
        if self.enabled and "status" in self.reports:
            self._put(CommitStatus(repo=repo, sha=sha, state="pending", description=AWAITING_DESCRIPTION,
                                   target_url=self.run_url(run_id), context=self.context))

    def refused(self, repo: str, sha: str) -> None:
        """Queue the ``error`` status of an untrusted pull request that is never run
        (``AMPCI_FORK_POLICY=never``: :data:`service.github.approval.REFUSED_DESCRIPTION`; no run, no link)."""
        from service.github.approval import REFUSED_DESCRIPTION

        if self.enabled and "status" in self.reports:
            self._put(CommitStatus(repo=repo, sha=sha, state="error", description=REFUSED_DESCRIPTION,
                                   context=self.context))

    def report_pending(self, store: Any, run_id: int) -> bool:
        """Rewrite the PR comment when a new head's run is queued: "checking HEAD (run N)", with the
        previous head's report folded below it, so a reviewer never reads an old table as the new
        head's.  False (nothing queued) for a run of no pull request or not its newest; never raises."""
        from service.github import comment as md
        from service.github.pr_report import build_report

        try:
            run = store.get_run(run_id)
            self._note_run(run)
            key = self._pr_of(run)
            if key is None or not self._is_newest_of_pr(store, run):
                return False
            previous = self._newest_pr_run(store, run, final_only=True)
            report = build_report(store, previous.id, self.public_url, final_state) if previous is not None else None
            body = md.render_pending(key[1], run.revision_sha, run.id, self.run_url(run.id), report)
            self._put(PullRequestComment(repo=run.meta["github"]["repo"], pr=key[1], body=body, sha=run.revision_sha))
            return True
        except Exception as exc:  # noqa: BLE001 - reporting never affects the run
            self._failed(f"could not queue the pending pull-request report of run {run_id}", exc)
            return False

    def finished(self, run: Any, summary: Any, store: Any = None) -> bool:
        """Queue the final status of a finished ``run`` (a RunInfo) from its ``summary`` (a RunSummary).

        The run-finished hook of the scheduler may call this directly; :meth:`check_watched` calls it
        for watched runs.  False when the run reports nowhere (not created from a webhook).
        """
        target = github_target(run)
        if not self.enabled or target is None:
            return False
        self._note_run(run)
        repo, sha = target
        if "status" in self.reports:
            state, description = status_text(store if store is not None else self.store, run.id, summary)
            self._put(CommitStatus(repo=repo, sha=sha, state=state, description=description,
                                   target_url=self.run_url(run.id), context=self.context))
        self.report_pull_request(run, store if store is not None else self.store)
        return True

    def report_pull_request(self, run: Any, store: Any) -> bool:
        """Queue the PR comment and/or check run of a finished ``run`` (per ``reports``); False when
        nothing was queued (not configured, no store, not the newest run of its pull request)."""
        if not self.enabled or store is None or not (self.reports & {"comment", "check"}):
            return False
        from service.github import comment as md
        from service.github.pr_report import build_report

        try:
            if not self._is_newest_of_pr(store, run):
                return False
            report = build_report(store, run.id, self.public_url, final_state)
            items = [md.comment(report) if "comment" in self.reports else None,
                     md.check_run(report, self.context) if "check" in self.reports else None]
        except Exception as exc:  # noqa: BLE001 - a report that cannot be built never affects the run
            self._failed(f"could not build the pull-request report of run {run.id}", exc)
            return False
        queued = False
        for item in items:
            if item is not None:
                self._put(item)
                queued = True
        return queued

    def refresh(self, store: Any, run_id: int) -> bool:
        """Re-queue the PR report after a finding of run ``run_id`` changed state (acknowledged):
        the report of the newest finished run of the same pull request.  Never raises."""
        if not self.enabled or not (self.reports & {"comment", "check"}):
            return False
        try:
            run = store.get_run(run_id)
            newest = self._newest_pr_run(store, run, final_only=True)
            if newest is None or newest.status not in FINAL_RUN_STATES:
                return False
            return self.report_pull_request(newest, store)
        except Exception as exc:  # noqa: BLE001 - triage must succeed even when reporting cannot
            self._failed(f"could not refresh the pull-request report of run {run_id}", exc)
            return False

    @staticmethod
    def _pr_of(run: Any) -> tuple[str, int] | None:
        gh = (getattr(run, "meta", None) or {}).get("github")
        if not isinstance(gh, dict) or not isinstance(gh.get("pr"), int) or not isinstance(gh.get("repo"), str):
            return None
        return gh["repo"].lower(), gh["pr"]

    def _newest_pr_run(self, store: Any, run: Any, final_only: bool = False, limit: int = 500) -> Any:
        """The newest run (by id) of ``run``'s pull request, or ``run`` itself when it belongs to none."""
        key = self._pr_of(run)
        if key is None:
            return run
        best = None
        for other in store.list_runs(limit=limit, trigger="pull_request"):
            if self._pr_of(other) != key or (final_only and other.status not in FINAL_RUN_STATES):
                continue
            if best is None or other.id > best.id:
                best = other
        return best

    def _is_newest_of_pr(self, store: Any, run: Any) -> bool:
        newest = self._newest_pr_run(store, run)
        return newest is None or newest.id <= run.id

    def check_watched(self, store: Any) -> int:
        """Queue final statuses for watched runs that have finished; return how many."""
        from service.errors import NotFoundError

        done = 0
        for run_id in self.outbox.watched():
            try:
                run = store.get_run(run_id)
            except NotFoundError:
                self.outbox.unwatch(run_id)
                continue
            if run.status not in FINAL_RUN_STATES:
                continue
            self.finished(run, store.run_summary(run_id), store)
            self.outbox.unwatch(run_id)
            done += 1
        return done

    def recover(self, store: Any, limit: int = 500) -> int:
        """Watch again the unfinished webhook runs among the newest ``limit`` (after a restart)."""
        if not self.enabled:
            return 0
        n = 0
        for trigger in ("push", "pull_request"):
            for run in store.list_runs(limit=limit, trigger=trigger):
                if run.status not in FINAL_RUN_STATES and github_target(run) is not None:
                    self.outbox.watch(run.id)
                    n += 1
        return n

    def _put(self, status: Report) -> None:
        try:
            self.outbox.put(status)
        except Exception as exc:  # noqa: BLE001 - reporting must never break the caller (the run is stored)
            self._failed(f"could not queue commit status for {status.key}", exc)
            return
        self._wake.set()

    def drain(self, limit: int = 50) -> int:
        """Post every due status once; return how many landed.  Safe to call from many processes."""
        if self.client is None:
            return 0
        posted = 0
        for item in self.outbox.claim(time.time(), limit, self.lease):
            if self._post(item):
                posted += 1
        return posted

    def _post(self, item: OutboxItem) -> bool:
        assert self.client is not None
        try:
            self.client.deliver(item.status)
        except PermanentStatusError as exc:
            log.error("commit status %s dropped: %s", item.status.key, exc)
            self.outbox.drop(item, str(exc))
            return False
        except TransientStatusError as exc:
            if item.attempts + 1 >= self.max_attempts:
                log.error("commit status %s dropped after %d attempts: %s", item.status.key,
                          item.attempts + 1, exc)
                self.outbox.drop(item, f"gave up after {item.attempts + 1} attempts: {exc}")
                return False
            delay = exc.retry_after if exc.retry_after is not None else backoff_delay(
                item.attempts, self.backoff_base, self.backoff_cap)
            log.warning("commit status %s failed (attempt %d), retry in %.1fs: %s", item.status.key,
                        item.attempts + 1, delay, exc)
            self.outbox.complete(item, ok=False, next_due=time.time() + delay)
            return False
        self.outbox.complete(item, ok=True, next_due=0.0)
        return True

    def start(self) -> None:
        """Start the background poster thread (idempotent)."""
        if self._thread is not None or self.client is None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="ampci-status-reporter", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the background thread; unsent statuses stay in the outbox."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def close(self) -> None:
        """Stop and release the HTTP client."""
        self.stop()
        if self.client is not None:
            self.client.close()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                if self.store is not None and time.monotonic() - self._last_watch >= self.watch_interval:
                    self._last_watch = time.monotonic()
                    self.check_watched(self.store)
                while self.drain() and not self._stop.is_set():
                    pass
            except Exception as exc:  # noqa: BLE001 - the poster must survive Redis/DB hiccups
                self._failed("commit status poster iteration failed", exc)
            self._wake.wait(self.poll_interval)
            self._wake.clear()
