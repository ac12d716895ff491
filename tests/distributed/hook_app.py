"""Celery app for tests: the real app and tasks, with test-only models handled before the job code.

Started as ``celery -A tests.distributed.hook_app worker``.  Models named ``noop_*`` check out the
job's revision for real and then return a ``pass`` result after ``AMPCI_TEST_NOOP_DELAY`` seconds
(no onnxruntime); models named ``poison_*`` kill the worker process running them (SIGKILL), every
time.  Every other model runs the real job.  ``AMPCI_TEST_IGNORE_SOFT_LIMIT=1`` makes noop jobs
ignore the soft time limit, so only the hard limit stops them.  ``AMPCI_TEST_CHILD_INIT_DELAY`` makes each pool
child sleep that many seconds more in its start-up (after the job code's preload), as a slow machine does.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from celery.signals import worker_process_init

from service.orchestration import tasks
from service.orchestration.celery_app import app  # noqa: F401  - `celery -A` looks for `app`
from workers.result import JobResult
from workers.revision.revisions import RevisionCache

_real_run_cell = tasks.run_cell


def run_cell(cell: tuple[str, str, str, str], revision: str, settings: Any,
             options: dict[str, Any] | None = None) -> JobResult:
    model, dtype, policy, target = cell
    if model.startswith("poison_"):
        os.kill(os.getpid(), signal.SIGKILL)
    if model.startswith("noop_"):
        root = RevisionCache.from_config(settings.worker_config()).checkout(revision)
        value = (root / "amp_pass" / "__init__.py").read_text().strip()
        _sleep(float(os.environ.get("AMPCI_TEST_NOOP_DELAY", "0")))
        return JobResult(model=model, dtype=dtype, policy=policy, target=target, status="pass",
                         revision=revision, message=f"pid={os.getpid()} node={os.environ.get('AMPCI_TEST_NODE')} "
                                                    f"pass={value}")
    return _real_run_cell(cell, revision, settings, options)


def _sleep(seconds: float) -> None:
    """Sleep; with AMPCI_TEST_IGNORE_SOFT_LIMIT=1 a soft time limit is ignored (a job stuck in C code)."""
    from celery.exceptions import SoftTimeLimitExceeded

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            time.sleep(max(0.0, min(0.2, end - time.monotonic())))
        except SoftTimeLimitExceeded:
            if os.environ.get("AMPCI_TEST_IGNORE_SOFT_LIMIT") != "1":
                raise


@worker_process_init.connect
def _slow_child_start(**_: Any) -> None:
    time.sleep(float(os.environ.get("AMPCI_TEST_CHILD_INIT_DELAY", "0")))


tasks.run_cell = run_cell
