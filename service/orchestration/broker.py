"""Sending jobs to Celery: one cached app per (process, settings) and :func:`enqueue`.

Imports Celery only when a message is sent, so the embedded path never loads it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING

from service.settings import Settings

if TYPE_CHECKING:  # annotations only: Celery is imported when a message is sent
    from celery import Celery

    from service.db.records import JobInfo

_CELERY_APPS: dict[tuple[int, Settings], Celery] = {}
_CELERY_APPS_LOCK = threading.Lock()


def celery_app(settings: Settings) -> Celery:
    """The Celery app for ``settings``, built once per process and reused (thread-safe).

    Building one costs tens of milliseconds and its producer pool is what makes repeated sends
    cheap; settings are immutable, so one app per distinct ``Settings`` value is exact.  Keyed by
    process id too: a forked child (prefork worker) builds its own instead of sharing the
    parent's broker connections.
    """
    key = (os.getpid(), settings)
    app = _CELERY_APPS.get(key)
    if app is None:
        from service.orchestration.celery_app import make_app

        with _CELERY_APPS_LOCK:
            app = _CELERY_APPS.get(key)
            if app is None:
                app = _CELERY_APPS[key] = make_app(settings)
    return app


def enqueue(settings: Settings, revision: str, jobs: Iterable[JobInfo], app: Celery | None = None) -> int:
    """Send one ``ampci.run_job`` message per job to the queue of its target; return how many.

    ``app`` is the Celery app to send with (default: :func:`celery_app` of ``settings``, cached
    per process); all messages of one call share one producer (one broker connection).
    """
    from service.orchestration.celery_app import RUN_JOB_TASK

    app = app if app is not None else celery_app(settings)
    n = 0
    with app.producer_or_acquire() as producer:
        for job in jobs:
            app.send_task(RUN_JOB_TASK, args=[job.id, revision], queue=job.target, producer=producer)
            n += 1
    return n
