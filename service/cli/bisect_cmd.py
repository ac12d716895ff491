"""``ampci bisect --run ID``: narrow the open regressions of a run to their first bad commits.

    ampci bisect --run ID [--regression RID] [--parallel N] [--workers N] [--step] [--dispatch] [--json]

Embedded mode (no ``AMPCI_BROKER_URL``): drives each bisection to its end in this process.  It
classifies the commits between baseline and regressed revision from stored results (``asv find``
style), runs the midpoint as a ``bisect`` run on the local pool, shows progress on stderr, and
repeats until the first bad commit is found; then prints it with its findings.  A midpoint that
cannot be judged (it does not build or convert) is skipped, as ``git bisect skip`` does, and named.
A run that tests its webhook's own repository (``AMPCI_PASS_REPO`` unset) is bisected in that repository:
its revision's history is read from it with git first, and the midpoints are cloned from it.
``--step`` only advances each bisection by one step (creating the midpoint runs without running them).

With a broker: each call advances every bisection by one step and creates ``bisect`` runs for the
midpoint(s) still untested (deduplicated, so calling it again is safe); with ``--dispatch`` their
jobs are sent to the workers, and from then on the bisection goes on by itself (each ``bisect`` run
that finishes on a worker advances it one step), until the first bad commit is found.  Calling this
again shows where it stands.  With ``AMPCI_AUTO_BISECT`` set, push/nightly regressions start their
bisection without this command.

Exit 0: every bisection found its commit (or, with a broker or ``--step``, advanced); 1: nothing
could be bisected (no open regression, the baseline is not a recorded first-parent ancestor, a
midpoint never finished); 2: bad input.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from service.errors import NotFoundError, ServiceError, UserError

if TYPE_CHECKING:
    from service.cli.main import Subcommands
    from service.db.records import RegressionInfo
    from service.db.store import Store
    from service.json_types import JsonObject
    from service.settings import Settings


class NothingBisected(ServiceError):
    """No bisection of the run could be done or advanced (exit 1, one line saying why)."""

    exit_code = 1


def register(subparsers: Subcommands) -> None:
    """Add ``ampci bisect``."""
    p = subparsers.add_parser("bisect", help="bisect a run's regressions to their first bad commit",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    from service.cli.argtypes import bounded_int, record_id

    p.add_argument("--run", type=record_id("run"), dest="run_id", required=True,
                   help="the run whose regressions to bisect (its id: ampci runs)")
    p.add_argument("--regression", type=record_id("regression"), dest="regression_id",
                   help="only this regression of the run")
    p.add_argument("--parallel", type=bounded_int(1, 64), default=1,
                   help="revisions to test per step (default 1: midpoint)")
    p.add_argument("--workers", type=bounded_int(1, 256), default=None, help="embedded mode: local worker processes")
    p.add_argument("--step", action="store_true", help="advance one step only; run nothing here")
    p.add_argument("--dispatch", action="store_true", help="send new runs to the broker (AMPCI_BROKER_URL)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """See the module docstring for the exit codes."""
    from service.cli.query_cmd import emit
    from service.orchestration.bisection import bisect_step, record_run_ancestry
    from service.orchestration.jobs import open_store
    from service.settings import Settings

    if args.parallel < 1:
        raise UserError("--parallel must be >= 1")
    if args.workers is not None and args.workers < 1:
        raise UserError("--workers must be >= 1")
    settings = Settings.from_env()
    if args.dispatch and settings.embedded:
        raise UserError("--dispatch needs AMPCI_BROKER_URL; without a broker `ampci bisect` runs the midpoints "
                        "itself")
    store = open_store(settings)
    store.get_run(args.run_id)
    regs = [r for r in store.regressions(run_id=args.run_id, category="regression")
            if r.state in ("open", "acknowledged")]
    if args.regression_id is not None:
        regs = [r for r in regs if r.id == args.regression_id]
        if not regs:
            raise NotFoundError(f"run {args.run_id} has no open regression {args.regression_id}")
    if not regs:
        raise NothingBisected(f"run {args.run_id} has no open regressions to bisect")
    record_run_ancestry(settings, store, args.run_id)  # a webhook's own repository: its history from git
    drive = settings.embedded and not args.step
    enqueue = None
    if args.dispatch:
        from service.orchestration import scheduler

        enqueue = scheduler.dispatcher(settings, store)

    payload: list[JsonObject] = []
    lines: list[str] = []
    failures: list[str] = []
    for reg in regs:
        try:
            if drive:
                payload_item, text = _drive(store, settings, reg, args)
            else:
                state = bisect_step(store, reg.id, enqueue=enqueue, parallel=args.parallel)
                payload_item, text = state.to_dict(), [state.describe()]
        except ServiceError as exc:  # the baseline is not an ancestor, no baseline result, a stuck midpoint
            if getattr(exc, "exit_code", None) not in (1, 2):
                raise
            failures.append(f"regression {reg.id} [{reg.kind} {'/'.join(reg.cell)}] cannot be bisected: {exc}")
            continue
        payload.append(payload_item)
        lines.extend(text)
    from service.cli.terminal import printable

    for line in failures:
        print(printable(line), file=sys.stderr)
    if not payload:
        raise NothingBisected(failures[0] if len(failures) == 1 else f"none of the {len(failures)} regressions of "
                              f"run {args.run_id} can be bisected")
    emit(args, payload, *lines)
    return 1 if failures else 0


def _drive(store: Store, settings: Settings, reg: RegressionInfo,
           args: argparse.Namespace) -> tuple[JsonObject, list[str]]:
    """Bisect ``reg`` to its end on the local pool; its JSON form and the lines for people."""
    from service.cli.terminal import printable
    from service.orchestration.bisect_run import bisect_to_end

    def progress(line: str) -> None:
        print(printable(line), file=sys.stderr, flush=True)

    out = bisect_to_end(store, settings, reg.id, parallel=args.parallel, workers=args.workers, progress=progress)
    state = out.state
    first = state.first_bad or state.bad
    try:
        subject = store.get_revision(first).message
        subject = printable(subject.splitlines()[0]) if subject else None  # its subject line, made safe
    except NotFoundError:
        subject = None
    lines = [f"regression {reg.id} [{reg.kind} {'/'.join(reg.cell)}]: first bad commit {first}"
             + (f" ({subject})" if subject else "") + f" after {out.midpoints} midpoint run(s)",
             f"  finding at {reg.revision_sha[:12]}: {reg.kind} {reg.severity}"
             + (f" {reg.metric} {_num(reg.baseline_value)} -> {_num(reg.value)}" if reg.value is not None else "")
             + f": {reg.detail or ''}"]
    lines += [f"  or {sha[:12]}: skipped, could not be judged ({why})" for sha, why in out.skip_reasons.items()]
    item = {**state.to_dict(), "midpoints": out.midpoints, "ran": out.ran, "skip_reasons": out.skip_reasons,
            "first_bad_message": subject, "finding": reg.to_dict()}
    return item, lines


def _num(value: float | None) -> str:
    return "?" if value is None else format(value, ".4g")
