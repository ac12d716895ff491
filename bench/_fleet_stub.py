"""The bench-only Celery app of ``bench/bench_fleet.py``: the real ``ampci.run_job`` task with a fixed-duration
stub in place of the model work, and per-job timings of the bookkeeping around it.

    celery -A bench._fleet_stub worker ...      # only bench_fleet.py starts workers like this

What it changes, in the worker processes that load *this* module as their Celery app and nowhere else:

* :func:`service.orchestration.tasks.run_cell` (the module-level name the task calls, kept one for test
  workers) answers a cell whose model is named ``stub<MS>ms_<anything>`` by sleeping ``MS`` milliseconds
  and returning a ``pass`` result; every other cell goes to the real function, unchanged.  Nothing in
  ``service/`` or ``workers/`` knows the stub: it cannot be switched on by a setting or an environment
  variable in production, only by starting a worker on this bench module.
* the pool children's job-code preload (:func:`service.orchestration.tasks.preload_job_code`: the
  conversion fork server, onnxruntime) is disconnected: a stub job runs no job code, and N workers'
  start-up on 2 cores is not what is measured.
* :func:`~service.orchestration.tasks.execute_job` and the run finisher
  (:func:`service.orchestration.scheduler.finish_if_complete`, which ``execute_job`` calls for a run's last
  job) are wrapped to push their process CPU and wall seconds to Redis lists (``BOOK_KEY``, ``FINISH_KEY`` of
  ``bench/_fleet_control.py``): one ``RPUSH`` per job (bench_fleet subtracts it from the Redis command count).

Importing this module patches the process that imports it: only the workers do; ``bench_fleet.py`` itself
imports none of it (its stub names and keys live in ``bench/_fleet_control.py``).
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery.signals import worker_process_init

from bench._fleet_control import BOOK_KEY, FINISH_KEY, stub_ms
from service.orchestration import scheduler, tasks
from service.orchestration.celery_app import app  # noqa: F401 - `celery -A bench._fleet_stub` loads `app`
from workers.result import JobResult

worker_process_init.disconnect(tasks.preload_job_code)

_real_run_cell = tasks.run_cell
_real_execute_job = tasks.execute_job
_real_finish = scheduler.finish_if_complete
_redis: Any = None


def _stub_run_cell(cell: tuple[str, str, str, str], revision: str, settings: Any,
                   options: dict[str, Any] | None = None) -> JobResult:
    ms = stub_ms(cell[0])
    if ms is None:
        return _real_run_cell(cell, revision, settings, options)
    time.sleep(ms / 1000)
    return JobResult(*cell, status="pass", revision=revision, message=f"stub {ms} ms")


def _worker_redis() -> Any:
    global _redis
    if _redis is None:
        import redis

        _redis = redis.Redis.from_url(os.environ["AMPCI_BROKER_URL"])
    return _redis


def _timed_execute_job(job_id: int, settings: Any, worker: str | None = None, store: Any = None) -> str:
    t0, c0 = time.perf_counter(), time.process_time()
    status = _real_execute_job(job_id, settings, worker, store)
    _worker_redis().rpush(BOOK_KEY, f"{time.process_time() - c0} {time.perf_counter() - t0}")
    return status


def _timed_finish(store: Any, run_id: int, settings: Any = None, dispatch: Any = None) -> bool:
    t0, c0 = time.perf_counter(), time.process_time()
    done = _real_finish(store, run_id, settings, dispatch)
    _worker_redis().rpush(FINISH_KEY, f"{time.process_time() - c0} {time.perf_counter() - t0} {int(done)}")
    return done


tasks.run_cell = _stub_run_cell
tasks.execute_job = _timed_execute_job
scheduler.finish_if_complete = _timed_finish
