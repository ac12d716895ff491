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
after a restart.  Every ``sweep_interval`` seconds the thread also completes check runs GitHub still holds
open after their run ended (:meth:`complete_open_checks`: a completion dropped after all its forms).

Pull requests also get the report people read (``reports`` holds ``comment`` and/or ``check``, from
``AMPCI_GITHUB_REPORT``): when a run of a PR finishes, one comment per pull request
(:mod:`service.github.comment`) is queued in the same outbox, superseding an unsent older one and
edited in place on GitHub; a check run likewise.  :meth:`refresh` re-queues them after a finding
was acknowledged.  Only the newest run of a pull request writes its comment, so a slow run of an
older head never overwrites the report of the newer one.  Building or posting a report never
affects the run.

Check runs (``check`` in ``reports``, and only as a GitHub App: GitHub refuses them from a token) are
live (:mod:`service.github.live_checks`): ``queued`` with the pending status, ``in_progress`` when the
watch sees the run's first job start, ``completed`` when it finishes with the conclusion mapped from
the state the run's verdict decided (``_final_check``; completed all the same, saying so, when the report cannot
be built), ``action_required`` while a fork's run awaits approval.

Posting (lanes per repository, rate-limit pauses, one log line per failure) is
:class:`~service.github.poster.OutboxPoster`'s, which this class extends.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from service.github import live_checks as live
from service.github.client import (
    MAX_DESCRIPTION,
    CheckRun,
    CommitStatus,
    GitHubStatusClient,
    PullRequestComment,
    report_permissions,
)
from service.github.outbox import MemoryOutbox, RedisOutbox, StatusOutbox
from service.github.poster import OutboxPoster, log_failure
from service.settings import Settings
from service.vocabulary import FINAL_RUN_STATES

__all__ = ["CONTEXT", "FINAL_RUN_STATES", "StatusReporter", "github_target", "log_failure", "status_text"]

if TYPE_CHECKING:
    from service.db.records import RunInfo, RunSummary
    from service.db.store import Store
    from service.github.pr_report import PullRequestReport
    from service.regressions.verdict import RunVerdict

CONTEXT = live.status_context("smoke")  # the smoke sweep's context (each sweep has its own: status_context)


def status_text(store: Store | None, run_id: int, summary: RunSummary,
                verdict: RunVerdict | None = None) -> tuple[str, str]:
    """``(state, description)`` of the final commit status of run ``run_id``: the state its verdict decided
    (:func:`service.regressions.verdict.decide_run`; ``verdict`` when the caller has it, else
    :func:`~service.regressions.verdict.run_verdict`, or without a store the verdict of ``summary``'s counts
    alone), and the verdict's phrases (cells that could not measure first, with their count, then regressions,
    known failures and cells not compared), then the run's counts as room allows."""
    from service.orchestration.judge import run_verdict
    from service.regressions.verdict import decide_run, summary_facts

    if verdict is None:
        if store is None:
            return decide_run(summary_facts(summary)).state, summary.describe()
        verdict = run_verdict(store, run_id)
    return verdict.state, verdict.description(summary.describe())


def github_target(run: RunInfo) -> tuple[str, str] | None:
    """(repo, sha) a run reports to: runs created from a webhook carry ``meta["github"]["repo"]``."""
    gh = (getattr(run, "meta", None) or {}).get("github")
    if not isinstance(gh, dict) or not isinstance(gh.get("repo"), str):
        return None
    return gh["repo"], run.revision_sha


class StatusReporter(OutboxPoster):
    """Queues commit statuses, PR comments and live check runs for runs that came from GitHub; posting
    them is :class:`~service.github.poster.OutboxPoster`'s.

    Guarantees: :meth:`queued` and :meth:`finished` only write to the outbox (no network) and never
    raise for GitHub problems; a status for a run is posted at least once unless GitHub answers with
    a permanent error or ``max_attempts`` posts failed; a newer status for the same commit supersedes
    an unsent older one.  Without a GitHub token the reporter is disabled and does nothing.
    """

    def __init__(self, outbox: StatusOutbox, client: GitHubStatusClient | None, *, public_url: str,
                 context: str | None = None, max_attempts: int = 12, backoff_base: float = 2.0,
                 backoff_cap: float = 600.0, lease: float = 60.0, poll_interval: float = 1.0,
                 store: Store | None = None, watch_interval: float = 1.0, sweep_interval: float = 300.0,
                 reports: frozenset[str] = frozenset({"status"}), workers: int = 4) -> None:
        super().__init__(outbox, client, max_attempts=max_attempts, backoff_base=backoff_base,
                         backoff_cap=backoff_cap, lease=lease, poll_interval=poll_interval, workers=workers)
        self.public_url = public_url.rstrip("/")
        self.context = context
        self.store = store
        self.watch_interval = watch_interval
        self.reports = frozenset(reports)
        self._last_watch = 0.0
        self._started: set[int] = set()  # runs whose in_progress check run is queued (this process)
        self.sweep_interval = sweep_interval  # seconds between sweeps of check runs left open
        self._last_sweep = time.monotonic()
        self.ended_open: set[int] = set()  # ended runs whose check run was open at the last sweep (open_checks)
        self.sweeps: dict[int, int] = {}  # run id -> how many sweeps re-queued its completion (this process)

    @classmethod
    def from_settings(cls, settings: Settings, **kwargs: object) -> StatusReporter:
        """A reporter whose outbox is Redis when a ``redis://`` broker is configured, else in memory."""
        outbox: StatusOutbox
        if settings.broker_url.startswith(("redis://", "rediss://", "unix://")):
            outbox = RedisOutbox(settings.broker_url)
        else:
            outbox = MemoryOutbox()
        from service.github_auth.app import auth_from_settings

        auth = auth_from_settings(settings)  # ConfigError at start for half an App or a bad key
        kwargs.setdefault("reports", settings.github_report_set())
        reports = kwargs["reports"]
        if not isinstance(reports, set | frozenset):
            raise TypeError("reports: a set of report kinds")
        reports = frozenset(str(r) for r in reports)
        client = GitHubStatusClient(settings.github_api_url, auth=auth, permissions=report_permissions(reports)) \
            if auth is not None else None
        return cls(outbox, client, public_url=settings.public_url, **kwargs)  # type: ignore[arg-type]

    @property
    def enabled(self) -> bool:
        return self.client is not None

    @property
    def live_checks(self) -> bool:
        """True when check runs are reported (``check`` in ``reports``) and can be: GitHub accepts them
        only from an App (:mod:`service.github.live_checks`); with a token, none is attempted."""
        return self.client is not None and "check" in self.reports and self.client.writes_check_runs

    def status_context(self, sweep: str) -> str:
        """The commit status context of ``sweep``'s runs (:func:`~service.github.live_checks.status_context`), or
        the one ``context`` the reporter was made with."""
        return self.context if self.context is not None else live.status_context(sweep)

    def _run_context(self, run_id: int) -> str | None:
        """The status context of run ``run_id`` (its sweep from the store; smoke without one); None (after one
        log line) when the store cannot say: no pending status then, rather than one on the wrong context."""
        if self.context is not None or self.store is None:
            return self.status_context("smoke")
        try:
            return self.status_context(self.store.get_run(run_id).sweep)
        except Exception as exc:  # noqa: BLE001 - reporting never affects the run
            self._failed(f"could not read the sweep of run {run_id}", exc)
            return None

    def _put_check(self, run_id: int, repo: str, sha: str, make: Callable[[str], CheckRun]) -> None:
        """Queue the check run ``make(sweep)`` of run ``run_id`` (its sweep read from the store); never raises."""
        try:
            sweep = self.store.get_run(run_id).sweep if self.store is not None else "smoke"
            self._put(make(sweep))
        except Exception as exc:  # noqa: BLE001 - reporting never affects the run
            self._failed(f"could not queue the check run of run {run_id}", exc)

    def run_url(self, run_id: int) -> str:
        """The run's page, linked from the commit status."""
        return f"{self.public_url}/runs/{int(run_id)}"

    def note_installation(self, repo: str, installation: object) -> None:
        """The GitHub App installation a webhook of ``repo`` named (``installation.id``; kept with the
        run's github meta): reports to ``repo`` use its token without looking the installation up."""
        if self.client is not None and type(installation) is int and installation > 0:
            self.client.remember_installation(repo, installation)

    def _note_run(self, run: RunInfo) -> None:
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
        if "status" in self.reports and (context := self._run_context(run_id)) is not None:
            self._put(CommitStatus(repo=repo, sha=sha, state="pending", description=description,
                                   target_url=self.run_url(run_id), context=context))
        if self.live_checks:
            self._put_check(run_id, repo, sha, lambda sweep: live.stage(repo, sha, sweep, run_id, self.run_url(run_id),
                                                                        "queued"))
        try:
            self.outbox.watch(run_id)
        except Exception as exc:  # noqa: BLE001 - recover() finds unwatched runs again at start
            self._failed(f"could not watch run {run_id}", exc)
        if "comment" in self.reports and self.store is not None:
            self.report_pending(self.store, run_id)

    def awaiting(self, run_id: int, repo: str, sha: str, installation: int | None = None,
                 description: str | None = None) -> None:
        """Queue the ``pending`` status of a pull request run awaiting a maintainer's approval
        (``description``, default :data:`service.github.approval.AWAITING_DESCRIPTION`, cut to GitHub's
        140 characters); its approval calls :meth:`queued`."""
        from service.github.approval import AWAITING_DESCRIPTION

        text = (description or AWAITING_DESCRIPTION)[:MAX_DESCRIPTION]
        self.note_installation(repo, installation)
        if self.enabled and "status" in self.reports and (context := self._run_context(run_id)) is not None:
            self._put(CommitStatus(repo=repo, sha=sha, state="pending", description=text,
                                   target_url=self.run_url(run_id), context=context))
        if self.live_checks:
            self._put_check(run_id, repo, sha, lambda sweep: live.awaiting_approval(
                repo, sha, sweep, run_id, self.run_url(run_id), text))

    def refused(self, repo: str, sha: str, sweep: str = "smoke") -> None:
        """Queue the ``error`` status of an untrusted pull request that is never run
        (``AMPCI_FORK_POLICY=never``: :data:`service.github.approval.REFUSED_DESCRIPTION`; no run, no link),
        on the context of the ``sweep`` it would have run."""
        from service.github.approval import REFUSED_DESCRIPTION

        if self.enabled and "status" in self.reports:
            self._put(CommitStatus(repo=repo, sha=sha, state="error", description=REFUSED_DESCRIPTION,
                                   context=self.status_context(sweep)))

    def report_pending(self, store: Store, run_id: int) -> bool:
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
            report = build_report(store, previous.id, self.public_url) if previous is not None else None
            body = md.render_pending(key[1], run.revision_sha, run.id, self.run_url(run.id), report)
            self._put(PullRequestComment(repo=run.meta["github"]["repo"], pr=key[1], body=body, sha=run.revision_sha))
            return True
        except Exception as exc:  # noqa: BLE001 - reporting never affects the run
            self._failed(f"could not queue the pending pull-request report of run {run_id}", exc)
            return False

    def finished(self, run: RunInfo, summary: RunSummary, store: Store | None = None) -> bool:
        """Queue the final status of a finished ``run`` (a RunInfo) from its ``summary`` (a RunSummary).

        The run-finished hook of the scheduler may call this directly; :meth:`check_watched` calls it
        for watched runs.  False when the run reports nowhere (not created from a webhook).
        """
        target = github_target(run)
        if not self.enabled or target is None:
            return False
        self._note_run(run)
        repo, sha = target
        store = store if store is not None else self.store
        verdict: RunVerdict | None = None  # decided once for the status and the pull-request report
        if "status" in self.reports:
            if store is not None:
                from service.orchestration.judge import run_verdict

                verdict = run_verdict(store, run.id)
            state, description = status_text(store, run.id, summary, verdict)
            self._put(CommitStatus(repo=repo, sha=sha, state=state, description=description,
                                   target_url=self.run_url(run.id), context=self.status_context(run.sweep)))
        self.report_pull_request(run, store, verdict)
        return True

    def report_pull_request(self, run: RunInfo, store: Store | None, verdict: RunVerdict | None = None) -> bool:
        """Queue the PR comment (only for the newest run of its pull request) and the completed check
        run (every run: its head's check run must not stay ``in_progress``) of a finished ``run``, per
        ``reports``, from its ``verdict`` when the caller decided it already; False when nothing was queued."""
        if not self.enabled or store is None or not ("comment" in self.reports or self.live_checks):
            return False
        from service.github import comment as md
        from service.github.pr_report import build_report

        try:
            newest = self._is_newest_of_pr(store, run)
            if not newest and not self.live_checks:
                return False
            report = build_report(store, run.id, self.public_url, verdict)
            items = [md.comment(report) if "comment" in self.reports and newest else None,
                     self._final_check(run, report) if self.live_checks else None]
        except Exception as exc:  # noqa: BLE001 - a report that cannot be built never affects the run
            self._failed(f"could not build the pull-request report of run {run.id}", exc)
            return self._complete_unreported(run, verdict, exc)
        queued = False
        for item in items:
            if item is not None:
                self._put(item)
                queued = True
        return queued

    def _complete_unreported(self, run: RunInfo, verdict: RunVerdict | None, exc: BaseException) -> bool:
        """Queue the completion of ``run``'s check run when its report could not be built
        (:func:`service.github.live_checks.unreported`), so it never stays in progress; True when queued."""
        target = github_target(run)
        if not self.live_checks or target is None:
            return False
        why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc).strip() else ''}"
        self._put(live.unreported(target[0], target[1], run.sweep, run.id, self.run_url(run.id),
                                  verdict.state if verdict is not None else None, run.status, why))
        return True

    @staticmethod
    def _final_check(run: RunInfo, report: PullRequestReport) -> CheckRun | None:
        """The completed check run of ``run``: the report's text, the conclusion from the state
        run's verdict decided (``report.state``, :func:`service.regressions.verdict.decide_run`;
        :func:`service.github.live_checks.conclusion`)."""
        from service.github.comment import check_run

        check = check_run(report, live.check_name(run.sweep))
        if check is None:
            return None
        compared = report.cells - report.counts.get("new", 0) - report.counts.get("not_measured", 0)
        return replace(check, conclusion=live.conclusion(report.state, run.status, compared),
                       status="completed", external_id=str(int(run.id)))

    def refresh(self, store: Store, run_id: int) -> bool:
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
    def _pr_of(run: RunInfo) -> tuple[str, int] | None:
        gh = (getattr(run, "meta", None) or {}).get("github")
        if not isinstance(gh, dict) or not isinstance(gh.get("pr"), int) or not isinstance(gh.get("repo"), str):
            return None
        return gh["repo"].lower(), gh["pr"]

    def _newest_pr_run(self, store: Store, run: RunInfo, final_only: bool = False,
                       limit: int = 500) -> RunInfo | None:
        """The newest run (by id) of ``run``'s pull request, or ``run`` itself when it belongs to none."""
        key = self._pr_of(run)
        if key is None:
            return run
        best: RunInfo | None = None
        for other in store.list_runs(limit=limit, trigger="pull_request"):
            if self._pr_of(other) != key or (final_only and other.status not in FINAL_RUN_STATES):
                continue
            if best is None or other.id > best.id:
                best = other
        return best

    def _is_newest_of_pr(self, store: Store, run: RunInfo) -> bool:
        newest = self._newest_pr_run(store, run)
        return newest is None or newest.id <= run.id

    def check_watched(self, store: Store) -> int:
        """Queue final statuses for watched runs that have finished; return how many.  One query reads every
        watched run's state (a round costs the same with one open run or a hundred); a run no longer in the store
        is unwatched."""
        done = 0
        watched = self.outbox.watched()
        runs = store.get_runs(watched)
        for run_id in watched:
            run = runs.get(run_id)
            if run is None:
                self.outbox.unwatch(run_id)
                continue
            if run.status not in FINAL_RUN_STATES:
                if run.status == "running" and self.live_checks and run_id not in self._started:
                    target = github_target(run)
                    if target is not None:
                        self._started.add(run_id)
                        self._put(live.stage(target[0], target[1], run.sweep, run_id, self.run_url(run_id),
                                             "in_progress"))
                continue
            self._started.discard(run_id)
            self.finished(run, store.run_summary(run_id), store)
            self.outbox.unwatch(run_id)
            done += 1
        return done

    def complete_open_checks(self, store: Store) -> int:
        """The sweep of check runs left open (:func:`service.github.open_checks.sweep`); how many final reports
        it re-queued.  Never raises."""
        from service.github.open_checks import sweep

        return sweep(self, store)

    def recover(self, store: Store, limit: int = 500) -> int:
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

    def _each_round(self) -> None:
        if self.store is not None and time.monotonic() - self._last_watch >= self.watch_interval:
            self._last_watch = time.monotonic()
            self.check_watched(self.store)
        if self.store is not None and time.monotonic() - self._last_sweep >= self.sweep_interval:
            self._last_sweep = time.monotonic()
            self.complete_open_checks(self.store)
