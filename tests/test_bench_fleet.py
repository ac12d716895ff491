"""bench/bench_fleet.py's pieces that need no control plane (issue 42, item 4): the stub hook stays in the
bench-only worker app, stub cells are named by their duration, and the 100-worker arithmetic names the resource
that saturates first.  (``tests/test_bench_quick.py`` runs the whole bench with ``--quick``.)"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._fleet_control import SweepFigures, bottleneck_lines, stub_model, stub_ms, worker_gaps  # noqa: E402


def test_a_stub_cell_is_named_by_its_duration() -> None:
    assert stub_ms(stub_model(120, "00001")) == 120
    assert stub_ms("mlp_small") is None and stub_ms("model_stub100ms_x") is None and stub_ms("stubms_x") is None


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def test_only_the_worker_app_swaps_the_job_body() -> None:
    """The bench driver imports no patching module; the bench-only worker app swaps ``run_cell`` for stub cells
    only (a real cell reaches the real function) and drops the job-code preload."""
    driver = _python("import bench.bench_fleet, bench._fleet_pr, bench._fleet_pg\n"
                     "from service.orchestration import scheduler, tasks\n"
                     "print(tasks.run_cell.__module__, tasks.execute_job.__module__,"
                     " scheduler.finish_if_complete.__module__)")
    assert driver.returncode == 0, driver.stderr
    assert driver.stdout.split() == ["service.orchestration.tasks", "service.orchestration.tasks",
                                     "service.orchestration.jobs"]
    worker = _python("import time\nfrom bench import _fleet_stub as s\nfrom service.orchestration import tasks\n"
                     "from celery.signals import worker_process_init as w\n"
                     "t = time.perf_counter()\n"
                     "r = tasks.run_cell(('stub30ms_a', 'fp16', 'default', 'cpu'), 'a' * 40, None)\n"
                     "print(r.status, round(time.perf_counter() - t, 2) >= 0.03, tasks.run_cell is s._stub_run_cell,"
                     " s._real_run_cell.__module__,"
                     " [getattr(f, '__name__', '') for f in w._live_receivers(None)].count('preload_job_code'))\n"
                     "s._real_run_cell = lambda *a: 'real'\n"
                     "print(tasks.run_cell(('mlp_small', 'fp16', 'default', 'cpu'), 'a' * 40, None))")
    assert worker.returncode == 0, worker.stderr
    assert worker.stdout.split() == ["pass", "True", "True", "service.orchestration.tasks", "0", "real"]


BASE = SweepFigures(n=4, cells=1000, stub_s=0.1, drain_s=27.0, dispatch_wall_s=1.0, dispatch_cpu_s=0.5,
                    reconcile_wall_s=0.2, reconcile_cpu_s=0.1, reconcile_candidates=1000, resent=0,
                    worker_cpu_s=20.0, pg_cpu_s=1.0, redis_cpu_s=0.2, pg_connections=4, book_cpu_s=10.0, booked=1000,
                    finish_cpu_s=0.3, finish_wall_s=0.4, redis_commands=12_000, redis_used=1 << 20, pg_commits=3000,
                    pg_rows_written=4000, all_done=True, complete=True, run_id=1, revision="a" * 40)


def test_the_first_bottleneck_at_100_workers_is_computed_from_the_costs() -> None:
    lines = bottleneck_lines([replace(BASE, n=1, pg_cpu_s=9.0), BASE], None, 0.1, max_connections=100)
    assert lines[0].startswith("demand at 100 workers x 100 ms stubs: 100 / 0.100 s = 1,000 jobs/s (measured on N=4")
    # the largest N's costs: PostgreSQL 1 ms a job (1,000 jobs/s a core) before the scheduler (2,000) and Redis (5,000)
    assert lines[1].startswith("PostgreSQL CPU: per core / 1.000 ms per job = 1,000 jobs/s")
    assert "scheduler" in lines[2] and "2,000 jobs/s" in lines[2] and lines[3].startswith("Redis (one thread)")
    conns = next(x for x in lines if x.startswith("PostgreSQL connections"))
    assert "(1.0 per worker) x 100 + API and beat ~2 = 102 against max_connections 100 -> EXCEEDED" in conns
    assert "12.0 per job x 1,000 jobs/s = 12,000 commands/s" in " ".join(lines)
    assert lines[-1] == ("=> first CPU bottleneck: PostgreSQL CPU at 1,000 jobs/s per PostgreSQL core; but "
                         "PostgreSQL's connection "
                         "limit comes first (a pooler or a smaller pool per worker)")
    roomy = bottleneck_lines([replace(BASE, redis_cpu_s=3.0)], None, 0.1, max_connections=500)
    assert roomy[-1] == "=> first CPU bottleneck: Redis (one thread) at 333 jobs/s"


def test_gaps_across_a_pool_child_replacement_are_counted_apart() -> None:
    """Per worker, the gap from a job's finish to the next start: by the same child (steady) or across a new
    pid (a replacement), whichever worker's jobs interleave with it."""
    a = [("w1@h:10", 0.00, 0.10), ("w1@h:10", 0.11, 0.21), ("w1@h:11", 3.21, 3.31), ("w1@h:11", 3.33, 3.43)]
    b = [("w2@h:20", 0.05, 0.15), ("w2@h:20", 0.20, 0.30)]
    got = worker_gaps(b + a)
    assert got.replacements == 1 and abs(got.replaced_s - 3.0) < 1e-9
    assert abs(got.steady_ms - (10 + 20 + 50) / 3) < 1e-6
    assert worker_gaps([("w@h:1", 0.0, 1.0)]).steady_ms != worker_gaps([("w@h:1", 0.0, 1.0)]).steady_ms  # NaN
    two = replace(BASE, n=1, cells=1000, stub_s=0.1, drain_s=120.0)
    assert abs(replace(two, gaps=got).efficiency_between_replacements - 1000 / 117.0 / 10) < 1e-9
