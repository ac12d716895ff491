"""Celery configuration: reliability settings, queues, beat schedule; no job code in the parent."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from service.errors import ConfigError
from service.orchestration.celery_app import (
    MAX_CHILD_RSS_KIB,
    make_app,
    time_limits,
    transport_options,
    visibility_timeout,
)
from service.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("timeout", [4.0, 600.0, 1800.0, 6 * 3600.0])
def test_visibility_timeout_exceeds_the_hard_limit(timeout: float) -> None:
    s = Settings(job_timeout=timeout)
    soft, hard = time_limits(s)
    assert soft < hard == timeout < visibility_timeout(s)
    assert transport_options(s)["visibility_timeout"] == visibility_timeout(s)


def test_reliability_settings_and_queues() -> None:
    settings = Settings.from_env({"AMPCI_EXTRA_QUEUES": "cuda-a100, cuda-h100", "AMPCI_NIGHTLY_CRON": "30 3 * * 1-5",
                                  "AMPCI_BROKER_URL": "redis://127.0.0.1:6379/0"})
    app = make_app(settings)
    c = app.conf
    assert c.task_acks_late and c.task_reject_on_worker_lost and c.worker_prefetch_multiplier == 1
    assert c.broker_transport_options["visibility_timeout"] > c.task_time_limit > c.task_soft_time_limit
    assert {q.name for q in c.task_queues} == {"cuda", "cpu", "cuda-a100", "cuda-h100", "control"}
    sched = c.beat_schedule["nightly-full-sweep"]
    assert sched["task"] == "ampci.nightly_sweep" and sched["args"] == ("full",)
    assert sched["schedule"].hour == {3} and sched["schedule"].minute == {30}
    assert sched["schedule"].day_of_week == {1, 2, 3, 4, 5}
    nightly_quick = make_app(Settings.from_env({"AMPCI_NIGHTLY_SWEEP": "smoke"}))
    assert nightly_quick.conf.beat_schedule["nightly-full-sweep"]["args"] == ("smoke",)
    assert c.timezone == "UTC" and c.enable_utc
    # a pool child is replaced for what it leaked (resident memory), rarely by count: each replacement idles the
    # worker for its preload (bench/bench_fleet.py: 200 jobs a child cost ~10% of 100 ms jobs' throughput)
    assert c.worker_max_memory_per_child == MAX_CHILD_RSS_KIB and c.worker_max_tasks_per_child >= 1000


@pytest.mark.parametrize("cron", ["0 2 * *", "99 2 * * *", "x y z w v"])
def test_bad_nightly_cron_is_a_config_error(cron: str) -> None:
    with pytest.raises(ConfigError, match="AMPCI_NIGHTLY_CRON"):
        make_app(Settings(nightly_cron=cron))


def test_tasks_are_named_thin_adapters() -> None:
    from service.orchestration import tasks
    from service.orchestration.celery_app import app

    assert app.tasks["ampci.run_job"].name == tasks.run_job_task.name == "ampci.run_job"
    assert app.tasks["ampci.nightly_sweep"].name == "ampci.nightly_sweep"
    assert app.tasks["ampci.run_job"].acks_late


def test_worker_parent_imports_no_job_code() -> None:
    """What the prefork parent imports (app, tasks, CLI) must not pull in onnxruntime (CUDA init)."""
    code = ("import sys, service.orchestration.celery_app, service.orchestration.tasks, service.orchestration.scheduler, service.cli.worker_cmd\n"
            "print(','.join(m for m in ('onnxruntime', 'workers.jobs.job', 'onnx') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""


def test_worker_argv_validation() -> None:
    from service.cli.worker_cmd import worker_argv
    from service.errors import UserError

    argv = worker_argv("cuda", 1, None, "INFO")
    assert argv[:3] == ["worker", "--pool", "prefork"] and argv[argv.index("-Q") + 1] == "cuda"
    assert argv[argv.index("-c") + 1] == "1"
    for bad in ("", "cuda;rm", "a b"):
        with pytest.raises(UserError):
            worker_argv(bad, 1, None, "INFO")
    with pytest.raises(UserError):
        worker_argv("cpu", 0, None, "INFO")


def test_control_tasks_have_their_own_time_limits_never_a_jobs() -> None:
    """Every task routed to the control queue (nightly planning, reconcile) runs under
    :data:`CONTROL_TIME_LIMITS`, however short ``AMPCI_JOB_TIMEOUT`` is: a job's soft limit firing mid-query in
    a nightly plan left a busy connection in the pool."""
    from service.orchestration import tasks
    from service.orchestration.celery_app import CONTROL_QUEUE, CONTROL_TIME_LIMITS

    settings = Settings.from_env({"AMPCI_JOB_TIMEOUT": "8", "AMPCI_BROKER_URL": "redis://127.0.0.1:6379/0"})
    routes = make_app(settings).conf.task_routes
    control = [name for name, route in routes.items() if route["queue"] == CONTROL_QUEUE]
    assert control, "no task is routed to the control queue"
    for name in control:
        task = tasks.app.tasks[name]
        assert (task.soft_time_limit, task.time_limit) == CONTROL_TIME_LIMITS, name
    assert CONTROL_TIME_LIMITS[0] > time_limits(settings)[1]
