"""Celery app for the soft-time-limit test: the real app and tasks, where a ``stuck_*`` model runs the
real job (``workers.jobs.job.run_job``) whose fetch step hangs, so the soft limit fires inside job code that
turns every exception into a result.  Started as ``celery -A tests.distributed.soft_limit_app worker``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from service.orchestration import tasks
from service.orchestration.celery_app import app  # noqa: F401  - `celery -A` looks for `app`
from workers.jobs import job as job_module
from workers.jobs.spec import JobSpec
from workers.result import JobResult

_real_run_cell = tasks.run_cell
_real_fetch = job_module.fetch_entry


def _hanging_fetch(entry: Any, cache_dir: Path, *args: Any, **kw: Any) -> Any:
    if entry.name.startswith("stuck_"):
        time.sleep(120)  # the soft limit interrupts this
    return _real_fetch(entry, cache_dir, *args, **kw)


def run_cell(cell: tuple[str, str, str, str], revision: str, settings: Any,
             options: dict[str, Any] | None = None) -> JobResult:
    import os

    if cell[0].startswith("stuck_"):  # the real job, on a one-model zoo written by the test
        spec = JobSpec(*cell, revision=revision, zoo_path=Path(os.environ["AMPCI_TEST_ZOO"]))
        return job_module.run_job(spec, settings.worker_config())
    return _real_run_cell(cell, revision, settings, options)


job_module.fetch_entry = _hanging_fetch
tasks.run_cell = run_cell
