"""The sweep of check runs left open: a check run ampci created whose run ended but whose completion never landed
(dropped after every form GitHub refused, or lost) is completed by queueing the run's final report again.

The outbox notes which runs' check runs GitHub holds open (a ``queued`` or ``in_progress`` stage landed and no
completion after it: :meth:`service.github.poster.OutboxPoster._note_check`); the reporter's thread calls
:func:`sweep` every ``sweep_interval`` seconds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from service.errors import NotFoundError
from service.github.outbox import StatusOutbox
from service.github.poster import log
from service.vocabulary import FINAL_RUN_STATES

if TYPE_CHECKING:
    from service.db.records import RunInfo
    from service.db.store import Store

#: How many sweeps re-queue a completion that did not land before its check run is given up (one log line).
SWEEP_TRIES = 3


class Sweeper(Protocol):
    """What the sweep needs of :class:`service.github.reporter.StatusReporter`."""

    outbox: StatusOutbox
    ended_open: set[int]
    sweeps: dict[int, int]

    @property
    def live_checks(self) -> bool: ...
    def report_pull_request(self, run: RunInfo, store: Store | None) -> bool: ...
    def _failed(self, what: str, exc: BaseException) -> None: ...


def sweep(reporter: Sweeper, store: Store) -> int:
    """Re-queue the final report (:meth:`~service.github.reporter.StatusReporter.report_pull_request`: the
    completion, or its fallback when the report cannot be built) of each run whose check run GitHub holds open
    (``outbox.open_checks()``) while the run has ended -- once it was so at the sweep before too (a completion
    queued meanwhile lands first) and it is no longer watched; after :data:`SWEEP_TRIES` sweeps the check run is
    given up, in one log line.  Returns how many were re-queued.  Never raises."""
    if not reporter.live_checks:
        return 0
    outbox = reporter.outbox
    requeued = 0
    try:
        watched = set(outbox.watched())
        ended: set[int] = set()
        for run_id in outbox.open_checks():
            try:
                run = store.get_run(run_id)
            except NotFoundError:
                outbox.mark_check(run_id, open=False)
                continue
            if run.status not in FINAL_RUN_STATES or run_id in watched:
                continue
            ended.add(run_id)
            if run_id not in reporter.ended_open:
                continue
            tries = reporter.sweeps.get(run_id, 0)
            if tries >= SWEEP_TRIES:
                log.error("check run of run %s left open: its completion did not land in %d sweeps", run_id, tries)
                outbox.mark_check(run_id, open=False)
                ended.discard(run_id)
                continue
            reporter.sweeps[run_id] = tries + 1
            if reporter.report_pull_request(run, store):
                requeued += 1
        reporter.ended_open = ended
    except Exception as exc:  # noqa: BLE001 - the sweep runs again next time
        reporter._failed("could not sweep the check runs left open", exc)
    return requeued
