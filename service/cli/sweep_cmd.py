"""``ampci sweep``: run a sweep for one pass revision and gate on its regressions.

    ampci sweep [--config FILE | --sweep smoke|full] [--revision REV|WORKTREE] [--baseline REV]
                [--no-baseline-run] [--no-wait] [--json]

Resolves ``--revision`` and ``--baseline`` (branch, tag, full or short sha) to full shas through the
pass repository (unknown: exit 2, nothing stored).  When the baseline has no results for some cells
of the sweep it runs the baseline revision for those cells first (as ``asv continuous`` does;
``--no-baseline-run`` turns it off).  Then creates the run, dispatches its jobs (embedded local pool,
or Celery when ``AMPCI_BROKER_URL`` is set), shows live progress on stderr (jobs done/failed, ETA),
waits, prints the result table and the regressions against the baseline, and exits 1 when there are
any, or when a cell with no baseline result fails (a CI gate: :mod:`service.regressions.gate`).

Embedded mode also adopts the jobs of local runs whose owning process is gone (a stopped or killed
``ampci serve`` or ``sweep`` on this host; a live owner's never): they run after this sweep's own jobs,
stay out of its gate, are listed as ``adopted_runs`` in ``--json``, and are handed back on Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, TypeAlias, TypedDict

from service.errors import UserError
from workers.result import GOOD_STATUSES, STATUSES

if TYPE_CHECKING:
    from service.cli.main import Subcommands
    from service.db.records import JobInfo, RegressionInfo, ResultRow, RunInfo
    from service.db.store import Store
    from service.json_types import JsonObject
    from service.orchestration.localpool import LocalPool
    from service.orchestration.scheduler import StartedRun
    from service.orchestration.sweeps import SweepConfig
    from service.settings import Settings


class SweepTimeout(Exception):
    """``--timeout`` passed before the run finished (exit 4; distributed jobs keep running)."""

    exit_code = 4


def register(subparsers: Subcommands) -> None:
    """Add ``ampci sweep``."""
    p = subparsers.add_parser("sweep", help="run a sweep for one pass revision and report regressions",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group()
    from service.cli.argtypes import bounded_int, path_arg, revision_arg, seconds, text_arg

    src.add_argument("--config", metavar="FILE", type=path_arg, help="sweep config TOML file")
    src.add_argument("--sweep", metavar="NAME", type=text_arg("sweep", 100), default=None,
                     help="built-in sweep (smoke, full); default smoke")
    p.add_argument("--revision", type=revision_arg, default="WORKTREE",
                   help="pass revision: branch, tag or sha of AMPCI_PASS_REPO, or WORKTREE (the uncommitted "
                        "working tree; the default)")
    p.add_argument("--baseline", type=revision_arg, default=None,
                   help="revision to compare with: branch, tag or sha (default: first parent; for WORKTREE, HEAD)")
    p.add_argument("--no-baseline-run", action="store_true",
                   help="do not run the baseline revision for cells it has no results for")
    p.add_argument("--trigger", default="manual", choices=["manual", "push", "pull_request", "nightly", "bisect"])
    p.add_argument("--workers", type=bounded_int(1, 256), default=None,
                   help="embedded mode: local worker processes (CPU count)")
    p.add_argument("--timeout", type=seconds(0.0, allow_low=False), default=None,
                   help="give up waiting after this many seconds")
    p.add_argument("--no-wait", action="store_true", help="enqueue and return (needs AMPCI_BROKER_URL)")
    p.add_argument("--json", action="store_true", help="print the outcome as JSON on stdout")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Exit 0: no regressions; 1: regressions found, or a cell without a baseline result fails;
    2: bad input (an unknown revision or baseline: nothing stored); 3: a service is unavailable;
    4: ``--timeout`` passed before the run finished."""
    from service.settings import Settings

    settings = Settings.from_env()
    if args.no_wait and settings.embedded:
        raise UserError("--no-wait needs AMPCI_BROKER_URL: without a broker the jobs run in this process")
    if args.workers is not None and args.workers < 1:
        raise UserError("--workers must be >= 1")
    if args.timeout is not None and not args.timeout > 0:  # (NaN included)
        raise UserError("--timeout must be a positive number of seconds")
    from service.orchestration.sweeps import load_sweep

    config = load_sweep(args.config, args.sweep)  # a bad sweep is refused before anything starts
    canary = None
    if settings.embedded:  # the pool's workers start (fork server preload, job code: the longest chain of the
        from service.cli.sandbox_check import start_canary
        from service.orchestration.localpool import warm_up  # sweep's start) while this process imports the

        warm_up(args.workers)  # scheduler and stores the run
        canary = start_canary(settings)  # the sandbox converts here, checked beside the rest of start-up
    from service.orchestration import scheduler
    store = scheduler.open_store(settings)
    sha, baseline = scheduler.sweep_revisions(settings, args.revision, args.baseline)  # stores nothing
    if canary is not None:
        canary()  # before the first job: a sandbox that cannot convert stops the sweep with one line (exit 3)
    baseline_run = None
    if baseline is not None and baseline != sha and not args.no_baseline_run:
        baseline_run = _run_baseline(settings, config, store, baseline, args)
    started = scheduler.start_sweep(settings, config, args.revision, trigger=args.trigger,
                                    baseline=baseline, store=store, local_workers=args.workers)
    where = "local pool" if settings.embedded else "celery"
    print(f"run {started.run_id}: sweep {config.name} at {started.revision[:12]}, {started.cells} jobs "
          f"({where})", file=sys.stderr)
    for warning in (store.get_run(started.run_id).meta or {}).get("warnings", []):
        print(f"warning: {warning}", file=sys.stderr)
    adopted = adopt_orphans(store, started.pool)
    if args.no_wait:
        _emit(args, {"run_id": started.run_id, "revision": started.revision, "jobs": started.cells,
                     "status": "queued"}, None)
        return 0
    _import_for_the_end()
    run_info = _wait(store, started, args.timeout, stop_workers=False)
    stopping = _stop_workers_meanwhile(started.pool)  # while the report is made: none of it needs them
    try:
        return _report(args, store, started, run_info, baseline_run, adopted)
    finally:
        if stopping is not None:
            stopping.join()  # every worker process reaped before this command returns


#: Modules that finishing a run (:func:`service.orchestration.jobs.finish_if_complete`) and its report import
#: on first use, after the last job: imported by :func:`_import_for_the_end` while the jobs run instead.
END_MODULES = ("service.orchestration.bisection", "service.regressions.gate", "service.regressions.verdict")


def _import_for_the_end() -> None:
    """Import :data:`END_MODULES` now (the sweep's jobs are starting: this process would only wait), so that
    the time from the last job's end to the exit holds no imports."""
    import importlib

    for name in END_MODULES:
        importlib.import_module(name)


def _stop_workers_meanwhile(pool: LocalPool | None) -> threading.Thread | None:
    """Start stopping ``pool``'s finished workers (:meth:`LocalPool.stop_workers`) in a thread; the caller
    joins it.  None without a pool (Celery)."""
    if pool is None:
        return None
    stopping = threading.Thread(target=pool.stop_workers, name="ampci-pool-stop")
    stopping.start()
    return stopping


def _report(args: argparse.Namespace, store: Store, started: StartedRun, run_info: RunInfo,
            baseline_run: int | None, adopted: list[int]) -> int:
    """Print the finished run's outcome (table or ``--json``) and its gate; return the exit status."""
    results = store.results(run_id=started.run_id)
    regressions = store.regressions(run_id=started.run_id, category="regression")
    regressions = [r for r in regressions if r.state in ("open", "acknowledged")]
    comparison = compared_cells(store, started.run_id, len(results), started.baseline, len(regressions))
    payload: JsonObject = {"run": run_info.to_dict(), "summary": store.run_summary(started.run_id).to_dict(),
                           "results": [r.to_dict() for r in results],
                           "regressions": [r.to_dict() for r in regressions],
                           "comparison": comparison, "baseline_run": baseline_run, "adopted_runs": adopted}
    from service.orchestration.judge import run_verdict

    verdict = run_verdict(store, started.run_id)  # decided once: the gate, the headline and the exit code
    decision = verdict.decision
    payload["gate"] = decision.to_dict()
    if decision.unmeasured:  # cells that could not measure are said first: never "no regressions"
        comparison["message"] = verdict.headline()
    lines = _finding_lines(store, started.run_id)
    payload["finding_lines"] = lines
    _emit(args, payload, (run_info, results, regressions, started, comparison))
    if not args.json:
        for reason in decision.reasons[1 if regressions else 0:]:
            print(reason)
        for note in latency_notes(store, results):
            print(note)
        for line in lines:  # the printout ends with one line per kind of finding
            print(line)
    return verdict.exit_code


def _finding_lines(store: Store, run_id: int) -> list[str]:
    """One line per kind of finding of run ``run_id`` (:func:`service.regressions.finding_lines.finding_lines`):
    its own findings and the earlier regressions it resolved."""
    from service.db import verdicts
    from service.regressions.finding_lines import finding_lines

    own = store.regressions(run_id=run_id, limit=100_000)
    with store.transaction() as conn:
        resolved = verdicts.resolved_by(conn, run_id=run_id)
    return finding_lines(own, resolved)


def latency_notes(store: Store, results: Sequence[ResultRow], most: int = 200) -> list[str]:
    """One ``info:`` line per reason latency could not be measured on a worker for a reason that is not
    the model's (onnxruntime's CPU provider has no bf16 kernels: :data:`workers.result.LATENCY_UNSUPPORTED`),
    with the cells it concerns -- said once, instead of on every cell (reads at most ``most`` results)."""
    from workers.result import LATENCY_UNSUPPORTED

    cells: dict[str, list[str]] = {}
    candidates = [r for r in results if r.latency_p50_ms is None and r.status in ("pass", "fail_accuracy", "diverged")]
    for r in candidates[:most]:
        latency = store.get_result(r.id).latency
        if latency is not None and latency.error.startswith(LATENCY_UNSUPPORTED):
            cells.setdefault(latency.error[len(LATENCY_UNSUPPORTED):], []).append("/".join(r.cell))
    out = []
    for why, names in cells.items():
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        out.append(f"info: latency not measured for {len(names)} cell(s) ({shown}): {why}")
    return out


def adopt_orphans(store: Store, pool: LocalPool | None) -> list[int]:
    """Embedded mode (``pool`` not None): take over the jobs of ``local`` runs whose owning process is
    gone -- released by a clean stop, or dead on this host (a SIGTERM'd or SIGKILLed ``ampci sweep`` or
    ``serve``) -- onto ``pool``, as ``ampci serve`` does at start-up
    (:func:`service.orchestration.orphans.resume_orphans`: a live owner's runs, or another host's, are
    never taken; each run is claimed under a row lock).  They run after this sweep's own jobs, do not
    count in its gate, and are handed back, not cancelled, if this sweep is interrupted.  Returns the
    adopted run ids; a failure to adopt is one warning line, never fatal."""
    if pool is None:
        return []
    from service.orchestration.orphans import resume_orphans

    try:
        taken = resume_orphans(store, pool)
    except Exception as exc:  # noqa: BLE001 - the sweep itself goes on
        print(f"warning: could not adopt local jobs left by stopped processes: {type(exc).__name__}: "
              f"{str(exc).splitlines()[0] if str(exc) else ''}", file=sys.stderr)
        return []
    pool.hand_back_on_cancel(o.run_id for o in taken)
    for orphan in taken:
        print(f"adopted {orphan.describe()}", file=sys.stderr)
    return [o.run_id for o in taken]


def _run_baseline(settings: Settings, config: SweepConfig, store: Store, baseline: str,
                  args: argparse.Namespace) -> int | None:
    """Run ``baseline`` for the sweep's cells that have no result there yet (``asv continuous``), and wait
    for it unless ``--no-wait``; return its run id (None: nothing was missing)."""
    from service.orchestration import scheduler
    from service.orchestration.judge import cells_with_results

    have = cells_with_results(store, baseline)
    catalog = scheduler.zoo_catalog(config.zoo_path(), settings.data_dir)
    missing = [c.cell for c in config.expand(catalog) if c.cell not in have]
    if not missing:
        return None
    started = scheduler.start_sweep(settings, config, baseline, trigger="manual", store=store,
                                    local_workers=args.workers, only_cells=missing)
    print(f"baseline run {started.run_id}: {baseline[:12]} has no results for {len(missing)} cell(s); "
          f"running them first", file=sys.stderr)
    if not args.no_wait:
        _wait(store, started, args.timeout)
    return started.run_id


def _wait(store: Store, started: StartedRun, timeout: float | None, stop_workers: bool = True) -> RunInfo:
    """Wait for a started run with progress; on Ctrl-C or timeout cancel embedded jobs (Celery jobs go on).
    An embedded run's pool has ended every job it was given when this returns; its worker processes are
    stopped too unless ``stop_workers`` is False (then the caller stops them: ``pool.stop_workers()``)."""
    try:
        if started.pool is not None:  # the pool tells us when a job ends
            run_info = _wait_with_progress(store, started.run_id, started.cells, timeout, started.pool.wait_for_change)
        else:  # Celery workers notify job ends through PostgreSQL (SQLite: polling)
            with store.job_end_listener(started.run_id) as wake:
                run_info = _wait_with_progress(store, started.run_id, started.cells, timeout, wake)
    except BaseException as exc:  # Ctrl-C or a timeout: embedded jobs stop with us; Celery jobs keep going
        if started.pool is not None:
            started.pool.cancel()
        if isinstance(exc, TimeoutError):
            what = "its jobs were cancelled" if started.pool is not None else "its jobs keep running on the workers"
            raise SweepTimeout(f"{exc}; {what}") from None
        raise
    if started.pool is not None:
        adopted = sorted(started.pool.adopted_runs)
        if adopted and any(store.has_pending_jobs(r) for r in adopted):
            print(f"finishing adopted run(s) {', '.join(map(str, adopted))}", file=sys.stderr)
        try:
            started.pool.finish()  # runs the adopted runs' jobs to the end too
        except BaseException:  # Ctrl-C meanwhile: adopted runs are handed back, not cancelled
            started.pool.cancel()
            raise
        if stop_workers:
            started.pool.stop_workers()
    return run_info


class Comparison(TypedDict):
    """What :func:`compared_cells` says of a run (the ``comparison`` of ``sweep --json``)."""

    baseline: str | None
    cells: int
    compared: int
    without_baseline: int
    baseline_revisions: list[str]
    message: str


def compared_cells(store: Store, run_id: int, cells: int, baseline: str | None, regressions: int) -> Comparison:
    """How many of the run's ``cells`` (with results) had a baseline result to compare with, and the one
    line saying so: a first run of its cells compares nothing, which is not "no regressions"."""
    from service.orchestration.judge import baseline_revisions

    found = baseline_revisions(store, run_id)
    n = len(found)
    base = (baseline or "none")[:12]
    missing = cells - n
    if regressions:
        message = f"{regressions} regression(s) against baseline {base} ({n} of {cells} cells compared)"
    elif cells == 0:
        message = "no results: nothing compared"
    elif n == 0:
        message = (f"no baseline results yet: first run of these cells ({cells} cells; baseline {base} has no "
                   "results for them)" if baseline else f"no baseline results yet: first run of these cells "
                   f"({cells} cells; no baseline revision)")
    else:
        message = f"no regressions in {n} compared cells (against baseline {base})"
        message += f"; {missing} not compared (no baseline result)" if missing else ""
    return {"baseline": baseline, "cells": cells, "compared": n, "without_baseline": missing,
            "baseline_revisions": sorted(set(found.values())), "message": message}


def _wait_with_progress(store: Store, run_id: int, total: int, timeout: float | None,
                        wake: Callable[[float], object] | None = None) -> RunInfo:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from service.orchestration.scheduler import wait_for_run

    console = Console(stderr=True)
    with Progress(TextColumn("[bold]sweep"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[failed]} failed, {task.fields[running]} running"),
                  TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=console,
                  transient=False) as progress:
        task = progress.add_task("jobs", total=total, failed=0, running=0)
        seen = {"final": -1, "failed": 0}

        def update(counts: Mapping[str, int]) -> None:
            final = sum(n for s, n in counts.items() if s not in ("queued", "running"))
            if final != seen["final"]:  # results only change when a job finishes
                seen["final"], seen["failed"] = final, failed_cells(store.jobs(run_id), store.results(run_id=run_id))
            progress.update(task, completed=final, failed=seen["failed"], running=counts.get("running", 0))

        info: RunInfo = wait_for_run(store, run_id, update, timeout=timeout, wake=wake)
        return info


#: Result statuses of a cell that did not pass (every status but the green ones): the job ran ("done") but
#: the cell failed.
FAILED_RESULT_STATUSES = frozenset(STATUSES) - GOOD_STATUSES


def failed_cells(jobs: Iterable[JobInfo], results: Iterable[ResultRow]) -> int:
    """Cells of a run that failed so far: a result with a failing status (:data:`FAILED_RESULT_STATUSES`;
    a job that ends ``done`` may carry a ``convert_error``), or a job that ended ``error``/``crashed``
    without a result.  Each cell counts once."""
    failed = {r.cell for r in results if r.status in FAILED_RESULT_STATUSES}
    with_result = {r.cell for r in results}
    failed |= {j.cell for j in jobs if j.status in ("error", "crashed") and j.cell not in with_result}
    return len(failed)


#: What the sweep's tables are made of: the finished run, its results and regressions, how it was started, and
#: :func:`compared_cells`.
SweepTable: TypeAlias = "tuple[RunInfo, Sequence[ResultRow], Sequence[RegressionInfo], StartedRun, Comparison]"


def _emit(args: argparse.Namespace, payload: JsonObject, table: SweepTable | None) -> None:
    """``payload`` as JSON (``--json``, or nothing to tabulate), else the finished run's tables fitted to the
    console (:func:`service.cli.sweep_table.sweep_tables`)."""
    if args.json or table is None:
        print(json.dumps(payload, indent=None if not args.json else 2, sort_keys=True))
        return
    from service.cli.query_cmd import console as table_console
    from service.cli.query_cmd import emit
    from service.cli.sweep_table import sweep_tables

    run_info, results, regressions, started, comparison = table
    console = table_console(args)
    emit(args, payload, *sweep_tables(run_info, started.revision, results, regressions, comparison["message"],
                                      console.width), out=console)
