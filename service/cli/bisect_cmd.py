"""``ampci bisect --run ID``: narrow the open regressions of a run to their first bad commits.

    ampci bisect --run ID [--regression RID] [--parallel N] [--dispatch] [--json]

Each call advances every bisection by one step (``asv find`` style): it classifies the commits
between baseline and regressed revision from stored results, and creates ``bisect`` runs for the
midpoint(s) still untested (deduplicated, so calling it again is safe).  With ``--dispatch`` and a
broker configured the new runs' jobs are sent to the workers.  From then on the bisection goes on by
itself: each ``bisect`` run that finishes on a worker advances it one step and dispatches the next
midpoint (``service.scheduler.finish_if_complete``), until the first bad commit is found.  Calling
this again shows where it stands (and re-queues nothing that exists).  With ``AMPCI_AUTO_BISECT``
set, push/nightly regressions start their bisection without this command.
"""

from __future__ import annotations

import argparse
from typing import Any

from service.errors import NotFoundError, UserError


def register(subparsers: Any) -> None:
    """Add ``ampci bisect``."""
    p = subparsers.add_parser("bisect", help="bisect a run's regressions to their first bad commit",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", type=int, dest="run_id", required=True)
    p.add_argument("--regression", type=int, dest="regression_id", help="only this regression of the run")
    p.add_argument("--parallel", type=int, default=1, help="revisions to queue per step (default 1: midpoint)")
    p.add_argument("--dispatch", action="store_true", help="send new runs to the broker (AMPCI_BROKER_URL)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Exit 0 when every bisection found its commit or advanced; 2 on bad input."""
    from service.bisect import bisect_step
    from service.cli.query_cmd import emit, open_store
    from service.settings import Settings

    if args.parallel < 1:
        raise UserError("--parallel must be >= 1")
    store = open_store()
    store.get_run(args.run_id)
    regs = [r for r in store.regressions(run_id=args.run_id, category="regression")
            if r.state in ("open", "acknowledged")]
    if args.regression_id is not None:
        regs = [r for r in regs if r.id == args.regression_id]
        if not regs:
            raise NotFoundError(f"run {args.run_id} has no open regression {args.regression_id}")
    enqueue = None
    if args.dispatch:
        settings = Settings.from_env()
        if settings.embedded:
            raise UserError("--dispatch needs AMPCI_BROKER_URL; without it start the runs with the scheduler")
        from service import scheduler

        enqueue = scheduler.dispatcher(settings, store)

    states = [bisect_step(store, r.id, enqueue=enqueue, parallel=args.parallel) for r in regs]
    lines = [s.describe() for s in states] or [f"run {args.run_id} has no open regressions to bisect"]
    emit(args, [s.to_dict() for s in states], *lines)
    return 0
