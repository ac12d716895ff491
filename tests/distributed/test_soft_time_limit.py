"""A job past Celery's soft time limit ends ``timeout`` (naming the limit), not ``crash``, even though
the job code (``workers.jobs.job.run_job``) turns the ``SoftTimeLimitExceeded`` it gets into a result."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from service.orchestration import scheduler, tasks
from service.orchestration.scheduler import SweepConfig, open_store, start_sweep, wait_for_run
from service.settings import Settings
from workers.jobs import job as job_module
from workers.jobs.spec import JobSpec
from workers.result import JobResult

SHA = "cd" * 20
ZOO = ('[models.{name}]\nsource = {{ synthetic = "conv_net", seed = 0 }}\ntags = ["t"]\n'
       'inputs.x = {{ shape = [1, 3, 16, 16], dtype = "float32" }}\n')


@pytest.fixture
def billiard_child() -> Iterator[None]:
    """This process with the SIGUSR1 handler a billiard pool child installs (it raises
    SoftTimeLimitExceeded where the process is when the pool parent signals the soft limit)."""
    from billiard.pool import soft_timeout_sighandler

    previous = signal.signal(signal.SIGUSR1, soft_timeout_sighandler)
    try:
        yield
    finally:
        signal.signal(signal.SIGUSR1, previous)


def _job_run_cell(tmp_path: Path, fetch: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """tasks.run_cell runs the real job (no revision checkout) on a one-model zoo, with ``fetch``."""
    zoo = tmp_path / "zoo.toml"
    zoo.write_text(ZOO.format(name="stuck"))
    monkeypatch.setattr(job_module, "fetch_entry", fetch)

    def run_cell(cell: tuple[str, str, str, str], revision: str, settings: Settings,
                 options: dict[str, Any] | None = None) -> JobResult:
        spec = JobSpec(*cell, revision=revision, zoo_path=zoo)
        return job_module.run_job(spec, settings.worker_config())

    monkeypatch.setattr(tasks, "run_cell", run_cell)


def _one_job(db_url: str, tmp_path: Path) -> tuple[Any, Settings, Any]:
    settings = Settings(database_url=db_url, cache_dir=tmp_path / "cache", data_dir=tmp_path / "data",
                        job_timeout=100.0)
    store = scheduler.open_store(settings)
    run_id = store.create_run(SHA, "manual", None, "t", [("stuck", "fp16", "default", "cpu")], None, {})
    return store, settings, store.jobs(run_id)[0]


def test_soft_limit_inside_the_job_is_a_timeout(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 billiard_child: None) -> None:
    def hanging_fetch(entry: Any, cache_dir: Path, *args: Any, **kw: Any) -> Any:
        os.kill(os.getpid(), signal.SIGUSR1)  # what the pool parent sends at the soft limit
        time.sleep(30)
        raise AssertionError("the soft limit did not interrupt the job")

    _job_run_cell(tmp_path, hanging_fetch, monkeypatch)
    store, settings, job = _one_job(db_url, tmp_path)
    assert tasks.execute_job(job.id, settings, "w", store=store) == "done"
    (result,) = store.results(run_id=job.run_id)
    assert result.status == "timeout", result.message
    assert (result.message or "").startswith("job exceeded the soft time limit of 90s (AMPCI_JOB_TIMEOUT 100s)")
    assert "SoftTimeLimitExceeded" in (result.message or "")  # where it was stopped, as the job said
    assert store.get_run(job.run_id).status == "complete"
    assert signal.getsignal(signal.SIGUSR1).__name__ == "soft_timeout_sighandler"  # the handler is restored


def test_a_worker_bug_without_the_soft_limit_is_ampcis_error_not_a_timeout(db_url: str, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           billiard_child: None) -> None:
    def broken_fetch(entry: Any, cache_dir: Path, *args: Any, **kw: Any) -> Any:
        raise RuntimeError("worker bug")

    _job_run_cell(tmp_path, broken_fetch, monkeypatch)
    store, settings, job = _one_job(db_url, tmp_path)
    tasks.execute_job(job.id, settings, "w", store=store)
    (result,) = store.results(run_id=job.run_id)
    # a bug of the worker's own code is ampci's failure (workers.infra), never the pass's nor a timeout
    assert result.status == "error" and "worker bug" in (result.message or ""), result


@pytest.mark.celery
@pytest.mark.redis
@pytest.mark.postgres
@pytest.mark.slow
def test_real_worker_soft_limit_in_job_code_is_a_timeout(cluster_settings, cluster_env, start_worker,
                                                        tmp_path: Path) -> None:
    zoo = tmp_path / "zoo.toml"
    zoo.write_text(ZOO.format(name="stuck_x"))
    w = start_worker("ws", app="tests.distributed.soft_limit_app", extra_env={"AMPCI_TEST_ZOO": str(zoo)})
    w.wait_ready()
    cfg = SweepConfig(name="t", models=("stuck_x",), dtypes=("fp16",), policies=("default",), targets=("cpu",),
                      repeats=20)
    store = open_store(cluster_settings)
    started = start_sweep(cluster_settings, cfg, "main", catalog={"stuck_x": {"t"}}, store=store)
    run = wait_for_run(store, started.run_id, timeout=60)
    (result,) = store.results(run_id=started.run_id)
    assert result.status == "timeout", result.message
    assert (result.message or "").startswith("job exceeded the soft time limit of 7s (AMPCI_JOB_TIMEOUT 8s)")
    assert run.status == "complete" and store.jobs(started.run_id)[0].attempts == 1
    assert w.proc.poll() is None
