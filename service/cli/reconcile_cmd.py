"""``ampci reconcile``: re-send jobs whose Celery message the broker lost.

    ampci reconcile [--grace SECONDS] [--dry-run] [--json] [--resume [--force]]

Finds jobs that are ``queued``, were never delivered (``attempts`` 0), belong to an unfinished run,
were queued more than ``--grace`` seconds ago (default ``AMPCI_RECONCILE_GRACE``) and whose message
is in no queue list of the Redis broker nor in its ``unacked`` hash, and sends each of them the
message it was first sent (``--dry-run``: only lists them).  Jobs still ``running`` when their
lease (the broker's visibility timeout, longer than ``AMPCI_JOB_TIMEOUT``) plus ``--grace`` has
passed since their delivery started, whose message is gone too (worker killed while Redis lost
its data), are re-sent the same way and listed as "running past its lease"; each re-delivery counts
an attempt, so a poison job still ends ``crashed`` after ``AMPCI_MAX_ATTEMPTS``.  Beat does the same every
``AMPCI_RECONCILE_EVERY`` seconds.  Only jobs of runs dispatched through the broker are
considered: those of runs created by an embedded process (no broker, its own local pool;
``runs.dispatch`` local) sharing the database are listed as "local, not re-sent" and left to that
process.  A broker that cannot be inspected is a one-line error (exit 3; 2 for a broker that is not
Redis) and nothing is sent.

Without ``AMPCI_BROKER_URL`` it lists the unfinished local runs with queued or running jobs and
their owning process (released by a clean stop, dead, alive, or on another host); ``--resume`` runs
the jobs of those whose process stopped or died (``--force``: also another host's) on a local pool
here until they are done.  ``ampci serve`` without a broker resumes them by itself when it starts, and
``ampci sweep`` without a broker adopts them beside its own run.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from service.errors import UserError

if TYPE_CHECKING:
    from service.cli.main import Subcommands
    from service.orchestration.orphans import Orphan
    from service.orchestration.reconcile import ReconcileReport
    from service.settings import Settings


def register(subparsers: Subcommands) -> None:
    """Add ``ampci reconcile``."""
    p = subparsers.add_parser("reconcile", help="re-send queued jobs whose broker message was lost",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    from service.cli.argtypes import seconds

    p.add_argument("--grace", type=seconds(0.0), default=None, metavar="SECONDS",
                   help="leave jobs queued less than this long alone (default AMPCI_RECONCILE_GRACE)")
    p.add_argument("--dry-run", action="store_true", help="list the lost jobs, send nothing")
    p.add_argument("--resume", action="store_true",
                   help="without a broker: run the jobs of local runs whose process stopped or died here, "
                        "on a local pool, until they are done")
    p.add_argument("--force", action="store_true",
                   help="with --resume: also take runs owned by a process on another host (make sure it is gone)")
    p.add_argument("--json", action="store_true", help="print the outcome as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Exit 0 whether or not jobs were lost (they are re-sent); 2 bad input or a non-Redis broker;
    3 the broker or database is unavailable (nothing sent)."""
    from service.cli.query_cmd import emit
    from service.orchestration import reconcile, scheduler
    from service.settings import Settings

    if args.grace is not None and not args.grace >= 0:
        raise UserError(f"--grace must be >= 0 seconds, got {args.grace}")
    settings = Settings.from_env()
    if settings.embedded:
        return _local(args, settings)
    else:
        store = scheduler.open_store(settings)
        try:
            report = reconcile.reconcile(settings, store, grace_s=args.grace, dry_run=args.dry_run)
        finally:
            store.dispose()
    emit(args, report.to_dict(), *describe(report))
    return 0


def _local(args: argparse.Namespace, settings: Settings) -> int:
    """Without a broker: list the jobs of ``local`` runs whose owning process stopped or died (and, with
    ``--resume``, run them here on a local pool until they are done)."""
    from service.cli.query_cmd import emit
    from service.orchestration import orphans
    from service.orchestration.jobs import open_store

    store = open_store(settings)
    try:
        found = orphans.find_orphans(store, include_alive=True)
        lines = [f"no broker configured: {len(found)} unfinished local run(s) with pending jobs"]
        lines += [("  " + o.describe() + ("" if o.resumable else
                                          "; not resumable" + (" (use --force)" if o.state == "other-host" else "")))
                  for o in found]
        taken: list[Orphan] = []
        if args.resume and not args.dry_run:
            from service.orchestration.localpool import LocalPool
            from service.orchestration.scheduler import wait_for_run

            pool = LocalPool(settings, store, workers=settings.local_workers or None)
            try:
                taken = orphans.resume_orphans(store, pool, force=args.force)
                for o in taken:
                    wait_for_run(store, o.run_id)
            finally:
                pool.close()
            lines.append(f"resumed {len(taken)} run(s): " + (", ".join(str(o.run_id) for o in taken) or "none"))
        elif found:
            lines.append("run `ampci reconcile --resume` to run the resumable ones here")
        emit(args, {"embedded": True, "orphans": [o.__dict__ | {"resumable": o.resumable} for o in found],
                    "resumed": [o.run_id for o in taken]}, *lines)
    finally:
        store.dispose()
    return 0


def describe(report: ReconcileReport) -> list[str]:
    """The human-readable lines for a :class:`service.orchestration.reconcile.ReconcileReport`."""
    if report.skipped:
        return [report.skipped]
    i = report.inspection
    lines = [f"{len(i.candidates)} queued job(s) never delivered and older than {report.grace_s:g}s, "
             f"{len(i.stale)} running job(s) past their lease ({i.lease_s:g}s + {report.grace_s:g}s); "
             f"{len(i.lost)} not in the broker ({i.messages} message(s) in {len(i.queues)} queue(s) and unacked)"]
    verb = "would re-send" if report.dry_run else "re-sent"
    for item in i.lost:
        j = item.job
        why = f"; running on {j.worker} past its lease, attempt {j.attempts + 1} next" if item.stale else ""
        lines.append(f"{verb} job {j.id} (run {j.run_id}, {j.model}/{j.dtype}/{j.policy}) to queue {j.target} "
                     f"at {item.revision[:12]}{why}")
    if i.local:
        lines.append(f"{len(i.local)} queued job(s) of embedded-mode runs older than {report.grace_s:g}s "
                     f"(local, not re-sent): {', '.join(map(str, i.local))}")
    if not i.lost:
        lines.append("nothing to re-send")
    elif report.dry_run:
        lines.append("dry run: nothing sent")
    return lines
