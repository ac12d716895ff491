#!/usr/bin/env python3
"""Fleet-scale figures by simulation on this machine (issue 42, item 4): a nightly sweep of 1,000 stub cells
through the real control plane (scheduler, Redis broker, Celery workers, PostgreSQL, reconcile) on N worker
processes, PostgreSQL at 1M results, and the push-to-verdict latency of a 6-cell pull request.

    python bench/bench_fleet.py [--cells 1000] [--workers 1,2,4,8] [--stub-ms 100] [--results 1000000]
                                [--pr-tries 3] [--quick]

The model work is a fixed-duration stub (``bench/_fleet_stub.py``: a bench-only Celery app that the workers
this script starts load; nothing in production can enable it); everything else is the production path:
``start_sweep`` (trigger ``nightly``) writes the run and job rows and sends one ``ampci.run_job`` message per
job to a private redis-server (AOF on, as deployed), N ``celery worker -c 1`` processes run ``execute_job``
(attempt counting, idempotent result write, the run's finish and verdict by its last job), and one
``reconcile`` pass runs while the queue is full.  Printed:

1. throughput (jobs/s) against N x (1 / stub duration), from the job rows' start and finish stamps;
2. control-plane CPU per job: the scheduler (``start_sweep`` in this process), the reconcile pass, the
   workers (whole processes: Celery plus the bookkeeping timed inside ``execute_job``), the finisher (the
   run's last ``finish_if_complete``), PostgreSQL (its backends serving this database, sampled) and Redis
   (the private server's CPU and commands);
3. Redis ``used_memory`` before / peak / after; PostgreSQL commits and rows written per job;
4. PostgreSQL at ``--results`` synthetic results (``bench/_fleet_pg.py``): table sizes, query latency;
5. push-to-verdict of a 6-cell pull request (``bench/_fleet_pr.py``): webhook POSTed to the real API
   until the loopback GitHub stand-in holds its check run completed, with the last N workers idle;
6. where the first bottleneck would be at 100 workers, computed from the measured per-job costs.

Targets (full run; exit 1 when one is missed): throughput >= 90% of N x stub throughput for every N
measured, push-to-verdict (median) <= the cells' model work on the idle workers + 2 s.  ``--quick``
(160 cells, N = 1, 2, 50 ms stubs, 5,000 results, one pull request) checks the invariants only (every job
done, runs complete, no job re-sent by reconcile, a completed check run) and exits 1 when one fails.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench._fleet_control import (  # noqa: E402
    BOOK_KEY,
    FINISH_KEY,
    CpuMeter,
    SweepFigures,
    bottleneck_lines,
    free_port,
    fresh_pg,
    kill_tree,
    pg_backend_pids,
    redis_info,
    start_workers,
    stop_workers,
    stub_model,
    worker_gaps,
)

THROUGHPUT_TARGET = 0.90
VERDICT_SLACK_S = 2.0


def _pass_repo(tmp: Path) -> Path:
    repo = tmp / "passrepo"
    (repo / "amp_pass").mkdir(parents=True)
    (repo / "amp_pass" / "__init__.py").write_text("")
    git = ["git", "-c", "user.email=b@b", "-c", "user.name=b"]
    subprocess.run([*git, "init", "-q", "-b", "main"], cwd=repo, check=True)
    subprocess.run([*git, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "x"], cwd=repo, check=True)
    return repo


def run_sweep(n: int, args: argparse.Namespace, settings: Any, env: dict[str, str], store: Any, r: Any,
              redis_pid: int, db_name: str, tmp: Path, workers: list[subprocess.Popen[bytes]]) -> SweepFigures:
    """One nightly of ``args.cells`` stub cells on ``n`` fresh workers (left running in ``workers``)."""
    from service.orchestration import reconcile, scheduler
    from service.orchestration.broker import celery_app
    from service.orchestration.sweeps import SweepConfig

    own_connections = len(pg_backend_pids(store, db_name))  # this process's, before any worker connects
    workers.extend(start_workers(n, env, tmp, ROOT))
    client = celery_app(settings)
    deadline = time.monotonic() + 180
    while len(client.control.ping(timeout=1.0) or []) < n:
        if time.monotonic() > deadline:
            raise SystemExit(f"{n} workers not ready within 180 s (logs in {tmp})")
    r.delete(BOOK_KEY, FINISH_KEY)
    models = [stub_model(args.stub_ms, f"{i:05d}") for i in range(args.cells)]
    config = SweepConfig(name="nightly", models=tuple(models), dtypes=("fp16",), policies=("default",),
                         targets=("cpu",), repeats=6)
    meter = CpuMeter([w.pid for w in workers], redis_pid, lambda: pg_backend_pids(store, db_name))
    stats0, info0 = store_stats(store, db_name), redis_info(r)
    meter.start()
    t0, c0 = time.perf_counter(), time.thread_time()
    started = scheduler.start_sweep(settings, config, "main", trigger="nightly", dedup_key=f"bench-fleet-{n}",
                                    store=store, catalog={m: {"bench"} for m in models})
    dispatch = (time.perf_counter() - t0, time.thread_time() - c0)
    t0, c0 = time.perf_counter(), time.thread_time()
    report = reconcile.reconcile(settings, store, app=client, grace_s=0.0)
    recon = (time.perf_counter() - t0, time.thread_time() - c0, len(report.inspection.candidates))
    while store.get_run(started.run_id).finished_at is None:
        if time.perf_counter() - t0 > 1800:
            raise SystemExit("the sweep did not finish within 30 minutes")
        meter.sample()
        time.sleep(0.25)
    deadline = time.monotonic() + 30  # the last job pushes its timing after execute_job returned
    while r.llen(BOOK_KEY) < args.cells and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)  # PostgreSQL's statistics of the last transactions
    cpu = meter.stop()
    stats1, info1 = store_stats(store, db_name), redis_info(r)
    jobs = store.jobs(started.run_id)
    book = [tuple(map(float, x.split())) for x in r.lrange(BOOK_KEY, 0, -1)]
    finish = [tuple(map(float, x.split())) for x in r.lrange(FINISH_KEY, 0, -1)]
    first = min(j.started_at for j in jobs if j.started_at)
    last = max(j.finished_at for j in jobs if j.finished_at)
    return SweepFigures(
        n=n, cells=args.cells, stub_s=args.stub_ms / 1000, drain_s=(last - first).total_seconds(),
        dispatch_wall_s=dispatch[0], dispatch_cpu_s=dispatch[1], reconcile_wall_s=recon[0],
        reconcile_cpu_s=recon[1], reconcile_candidates=recon[2], resent=len(report.resent),
        worker_cpu_s=cpu.workers, pg_cpu_s=cpu.pg, redis_cpu_s=cpu.redis, pg_connections=cpu.pg_connections - own_connections,
        book_cpu_s=sum(b[0] for b in book), booked=len(book), finish_cpu_s=sum(f[0] for f in finish),
        finish_wall_s=sum(f[1] for f in finish),
        redis_commands=info1["total_commands_processed"] - info0["total_commands_processed"] - len(book) - len(finish),
        redis_used=info1["used_memory"], pg_commits=stats1[0] - stats0[0], pg_rows_written=stats1[1] - stats0[1],
        all_done=len(jobs) == args.cells and all(j.status == "done" for j in jobs),
        complete=store.get_run(started.run_id).status == "complete", run_id=started.run_id,
        revision=started.revision, load=os.getloadavg()[0],
        gaps=worker_gaps([(j.worker or "", j.started_at.timestamp(), j.finished_at.timestamp()) for j in jobs
                          if j.started_at and j.finished_at]))


def store_stats(store: Any, db_name: str) -> tuple[int, int]:
    """(commits, rows inserted + updated + deleted) of this database so far (pg_stat_database)."""
    import sqlalchemy as sa

    with store.engine.connect() as conn:
        conn.execute(sa.text("SELECT pg_stat_clear_snapshot()"))
        row = conn.execute(sa.text("SELECT xact_commit, tup_inserted + tup_updated + tup_deleted "
                                   "FROM pg_stat_database WHERE datname = :d"), {"d": db_name}).one()
    return int(row[0]), int(row[1])


def _default_watch_s() -> float:
    """The API reporter's watch interval when nothing sets it (``StatusReporter``'s default)."""
    import inspect

    from service.github.reporter import StatusReporter

    return float(inspect.signature(StatusReporter.__init__).parameters["watch_interval"].default)


def _table(title: str, header: list[str], rows: list[list[str]]) -> None:
    print(f"\n{title}\n| " + " | ".join(header) + " |\n|" + "|".join("---" for _ in header) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


def main(argv: list[str] | None = None) -> int:  # noqa: C901 - one measurement after the other
    from bench._fleet_pg import pg_at_scale
    from bench._fleet_pr import PR_CELLS, model_work_s, push_to_verdict
    from service.orchestration import reconcile, scheduler
    from service.orchestration.broker import celery_app
    from service.settings import Settings

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cells", type=int, default=1000)
    ap.add_argument("--workers", default="1,2,4,8", help="worker process counts, comma separated")
    ap.add_argument("--stub-ms", type=int, default=100, help="the stub job's fixed duration")
    ap.add_argument("--results", type=int, default=1_000_000, help="synthetic results for PostgreSQL at scale")
    ap.add_argument("--pr-tries", type=int, default=3)
    ap.add_argument("--watch-interval", type=float, default=None,
                    help="what-if: the API reporter's watch interval in seconds (default: the service's own)")
    ap.add_argument("--quick", action="store_true", help="160 cells, N=1,2, 50 ms stubs, 5k results; invariants only")
    args = ap.parse_args(argv)
    if args.quick:
        args.cells, args.workers, args.stub_ms, args.results, args.pr_tries = 160, "1,2", 50, 5_000, 1
    ns = [int(x) for x in args.workers.split(",") if x.strip()]
    admin_url = os.environ.get("AMPCI_TEST_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")

    tmp = Path(tempfile.mkdtemp(prefix="ampci-fleet-"))
    port = free_port()
    procs: list[subprocess.Popen[bytes]] = []
    workers: list[subprocess.Popen[bytes]] = []
    drop = None
    store = None
    keep_logs = True
    try:
        procs.append(subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp), "--appendonly", "yes",
             "--save", ""], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True))
        db_url, drop = fresh_pg(admin_url)
        env = {k: v for k, v in os.environ.items() if not k.startswith("AMPCI_")}
        env.update(AMPCI_BROKER_URL=f"redis://127.0.0.1:{port}/0", AMPCI_DATABASE_URL=db_url,
                   AMPCI_CACHE_DIR=str(tmp / "cache"), AMPCI_DATA_DIR=str(tmp / "data"),
                   AMPCI_PASS_REPO=str(_pass_repo(tmp)), AMPCI_LOG_LEVEL="WARNING", PYTHONPATH=str(ROOT))
        settings = Settings.from_env(env)
        store = scheduler.open_store(settings)
        db_name = db_url.rsplit("/", 1)[1].split("?")[0]
        import redis

        r = redis.Redis.from_url(env["AMPCI_BROKER_URL"], socket_timeout=None)
        deadline = time.monotonic() + 10
        while True:
            try:
                r.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        used_before = redis_info(r)["used_memory"]
        import sqlalchemy as sa

        with store.engine.connect() as conn:
            max_connections = int(conn.execute(sa.text("SHOW max_connections")).scalar_one())
        sweeps: list[SweepFigures] = []
        for n in ns:
            if workers:
                stop_workers(workers)
            sweeps.append(run_sweep(n, args, settings, env, store, r, procs[0].pid, db_name, tmp, workers))
            print(f"N={n}: {sweeps[-1].throughput:.1f} jobs/s ({sweeps[-1].efficiency:.0%} of ideal)", flush=True)
        used_after = redis_info(r)
        verdicts, api_cpu_s = push_to_verdict(env, db_url, sweeps[-1].revision,
                                              [stub_model(args.stub_ms, f"{i:05d}") for i in range(PR_CELLS)],
                                              args.pr_tries, tmp / "api.log", args.watch_interval)
        stop_workers(workers)
        revs = max(3, args.results // args.cells)

        def reconcile_pass(s: Any) -> object:
            return reconcile.reconcile(settings, s, app=celery_app(settings), grace_s=0.0)

        pg = pg_at_scale(admin_url, revs, args.cells, 3 if args.quick else 9, reconcile_pass)

        # -- tables ------------------------------------------------------------------------------------
        load = os.getloadavg()[0]
        print(f"\nfleet simulation: {args.cells} stub cells of {args.stub_ms} ms per nightly; load average "
              f"{load:.1f} on {os.cpu_count()} CPUs")
        _table("throughput", ["N workers", "drain s", "jobs/s", "ideal N/stub", "of ideal", "target",
                              "wall overhead per job on a worker", "gap finish -> next start, same child",
                              "pool-child replacements", "of ideal without them", "load average"],
               [[str(s.n), f"{s.drain_s:.1f}", f"{s.throughput:.1f}", f"{s.ideal:.1f}", f"{s.efficiency:.0%}",
                 f">= {THROUGHPUT_TARGET:.0%}", f"{s.overhead_ms:.1f} ms", f"{s.gaps.steady_ms:.1f} ms",
                 f"{s.gaps.replacements} ({s.gaps.replaced_s:.1f} s)", f"{s.efficiency_between_replacements:.0%}",
                 f"{s.load:.1f}"] for s in sweeps])
        _table("control-plane CPU per job (ms)",
               ["N", "scheduler (start_sweep)", "reconcile pass", "worker process", "of which execute_job",
                "finisher (per run)", "PostgreSQL", "Redis", "Redis cmds/job", "PG commits/job", "PG rows/job",
                "PG conns (workers)"],
               [[str(s.n), f"{s.per_job(s.dispatch_cpu_s):.2f}", f"{s.per_job(s.reconcile_cpu_s):.3f}",
                 f"{s.per_job(s.worker_cpu_s):.2f}", f"{s.per_job(s.book_cpu_s):.2f}",
                 f"{s.finish_cpu_s * 1000:.0f} ms", f"{s.per_job(s.pg_cpu_s):.2f}", f"{s.per_job(s.redis_cpu_s):.3f}",
                 f"{s.redis_commands / s.cells:.1f}", f"{s.pg_commits / s.cells:.1f}",
                 f"{s.pg_rows_written / s.cells:.1f}", str(s.pg_connections)] for s in sweeps])
        _table("reconcile pass with the sweep's queue full (grace 0)", ["N", "wall ms", "CPU ms", "candidates",
                                                                        "re-sent"],
               [[str(s.n), f"{s.reconcile_wall_s * 1000:.0f}", f"{s.reconcile_cpu_s * 1000:.0f}",
                 str(s.reconcile_candidates), str(s.resent)] for s in sweeps])
        _table("Redis memory (INFO memory)", ["before", "peak", "after the sweeps"],
               [[f"{used_before / 2**20:.1f} MiB", f"{used_after['used_memory_peak'] / 2**20:.1f} MiB",
                 f"{used_after['used_memory'] / 2**20:.1f} MiB"]])
        _table(f"PostgreSQL at {pg.results:,} results (loaded by COPY in {pg.load_s:.0f} s; results table "
               f"{pg.results_bytes / 2**20:.0f} MiB, jobs table {pg.jobs_bytes / 2**20:.0f} MiB)",
               ["query", "rows", "p50 ms", "p90 ms"],
               [[label, str(rows), f"{p50:.1f}", f"{p90:.1f}"] for label, rows, p50, p90 in pg.queries])
        idle = sweeps[-1].n
        work = model_work_s(args.stub_ms / 1000, idle)
        _table(f"push-to-verdict: {PR_CELLS}-cell pull request, {idle} idle workers, model work "
               f"{work:.2f} s (ceil({PR_CELLS}/{idle}) x {args.stub_ms} ms), reporter watch interval "
               f"{args.watch_interval or _default_watch_s():g} s; seconds from the webhook POST",
               ["try", "202", "run created", "first job", "run finished", "check completed", "conclusion",
                "target"],
               [[str(i + 1), f"{v.answered_s:.3f}", f"{v.created_s:.2f}", f"{v.first_start_s:.2f}",
                 f"{v.finished_s:.2f}", f"{v.completed_s:.2f}", v.conclusion, f"<= {work + VERDICT_SLACK_S:.2f}"]
                for i, v in enumerate(verdicts)])
        print(f"API process CPU over the pull requests: {api_cpu_s * 1000 / max(1, len(verdicts)):.0f} ms per "
              f"pull request ({api_cpu_s * 1000 / max(1, len(verdicts)) / PR_CELLS:.1f} ms per cell)")
        print("\nwhere the first bottleneck would be at 100 workers (on paper, from the per-job costs above):")
        for line in bottleneck_lines(sweeps, pg, args.stub_ms / 1000, max_connections,
                                     settings.reconcile_every or 60.0):
            print(f"  {line}")

        median_verdict = statistics.median(v.completed_s for v in verdicts) if verdicts else float("inf")
        invariants = {
            "every job of every sweep done, every run complete": all(s.all_done and s.complete for s in sweeps),
            "a bookkeeping time from every job": all(s.booked == s.cells for s in sweeps),
            "reconcile re-sent no job (every message was in the broker)": all(s.resent == 0 for s in sweeps),
            "every pull request got a completed check run": len(verdicts) == args.pr_tries,
        }
        targets = {
            f"throughput >= {THROUGHPUT_TARGET:.0%} of N x stub throughput (N = {args.workers})":
                all(s.efficiency >= THROUGHPUT_TARGET for s in sweeps),
            f"push-to-verdict (median {median_verdict:.2f} s) <= model work {work:.2f} s + {VERDICT_SLACK_S:.0f} s":
                median_verdict <= work + VERDICT_SLACK_S,
        }
        print()
        for name, met in {**invariants, **targets}.items():
            print(f"  {name}: {'met' if met else 'MISSED'}")
        if args.quick:
            print("(--quick: targets printed, not judged)")
        ok = all(invariants.values()) and (args.quick or all(targets.values()))
        if all(invariants.values()):
            keep_logs = False  # the workers' and the API's logs matter only when an invariant broke
        else:
            print(f"logs kept in {tmp}")
        return 0 if ok else 1
    finally:
        stop_workers(workers)
        if store is not None:
            store.dispose()
        for p in reversed(procs):
            kill_tree(p.pid)
        if drop is not None:
            drop()
        if not keep_logs:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
