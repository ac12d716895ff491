"""The Celery application: Redis broker and result backend, one queue per target, reliable delivery.

``make_app(settings)`` builds the app from one :class:`service.settings.Settings`; the module-level
``app`` (what ``celery -A service.orchestration.celery_app`` and ``ampci worker`` load) is built from the
environment.  Importing this module imports no onnxruntime and touches no GPU, so the prefork
parent never initialises CUDA; job code is imported lazily inside each child's task call.

Reliability guarantees (see DESIGN.md):

* ``task_acks_late`` + ``task_reject_on_worker_lost``: a job whose worker dies is redelivered;
* ``worker_prefetch_multiplier=1``: a worker holds at most one unstarted job per process;
* hard time limit = ``AMPCI_JOB_TIMEOUT`` (soft limit a little earlier) and a broker visibility
  timeout strictly longer than it, so a running job is never handed to a second worker while the
  first is still allowed to run it;
* attempts are counted in the database by the task (poison jobs end ``crashed``), and results
  are written idempotently on (run, cell) by the store;
* beat re-sends jobs whose message the broker lost (``ampci.reconcile`` on the control queue every
  ``AMPCI_RECONCILE_EVERY`` seconds, :mod:`service.orchestration.reconcile`).
"""

from __future__ import annotations

from typing import NotRequired, TypedDict

from celery import Celery
from celery.schedules import crontab
from kombu.entity import Exchange, Queue  # (what ``kombu`` re-exports lazily, where mypy cannot see it)

from service.errors import ConfigError
from service.settings import Settings

#: Queues every deployment has: one per built-in target, and ``control`` for scheduling tasks.
DEFAULT_QUEUES: tuple[str, ...] = ("cuda", "cpu")
CONTROL_QUEUE = "control"
RUN_JOB_TASK = "ampci.run_job"
NIGHTLY_TASK = "ampci.nightly_sweep"
RECONCILE_TASK = "ampci.reconcile"


#: Jobs after which a Celery pool child is replaced whatever its memory (see ``worker_max_memory_per_child``).
MAX_TASKS_PER_CHILD = 2000
#: Resident memory (KiB) of a pool child after a job beyond which it is replaced (leaked arenas).
MAX_CHILD_RSS_KIB = 3 * 1024 * 1024


def visibility_timeout(settings: Settings) -> float:
    """Seconds an unacknowledged message stays invisible: strictly longer than the hard limit."""
    return settings.job_timeout + max(5.0, min(600.0, settings.job_timeout * 0.25))


def transport_options(settings: Settings) -> dict[str, float | int]:
    """Redis transport options: the visibility timeout and how often abandoned messages are swept.

    A message whose worker vanished (killed machine) is redelivered roughly ``visibility_timeout``
    plus one sweep period after it was taken.
    """
    vt = visibility_timeout(settings)
    return {"visibility_timeout": vt, "unacked_restore_interval": max(1, int(min(10.0, vt / 5))),
            "unacked_restore_throttle": 1 if vt < 600 else 10}


#: (soft, hard) time limits of the control tasks (nightly planning, reconcile): their own, never a job's.  With a
#: short ``AMPCI_JOB_TIMEOUT`` (8 s in the cluster tests) the job's soft limit interrupted a nightly sweep's
#: planning mid-query on a busy machine, and psycopg then returned a busy connection to the pool ("another
#: command is already in progress").
CONTROL_TIME_LIMITS = (540.0, 600.0)


def time_limits(settings: Settings) -> tuple[float, float]:
    """(soft, hard) time limits of one job; hard = ``job_timeout``, soft a little before it."""
    hard = settings.job_timeout
    return max(hard * 0.9, hard - 60.0), hard


def extra_queues(settings: Settings) -> tuple[str, ...]:
    """More target queues (e.g. GPU types) from ``AMPCI_EXTRA_QUEUES=cuda-a100,cuda-h100``."""
    raw = settings.extra_queues
    names = tuple(q.strip() for q in raw.split(",") if q.strip())
    for name in names:
        if not name.replace("-", "").replace("_", "").isalnum():
            raise ConfigError(f"AMPCI_EXTRA_QUEUES: bad queue name {name!r}")
    return names


def nightly_schedule(cron: str) -> crontab:
    """A UTC crontab from five cron fields (``"0 2 * * *"``); malformed text is a ConfigError."""
    parts = cron.split()
    if len(parts) != 5:
        raise ConfigError(f"AMPCI_NIGHTLY_CRON: expected 5 cron fields, got {cron!r}")
    minute, hour, dom, month, dow = parts
    try:
        return crontab(minute=minute, hour=hour, day_of_month=dom, month_of_year=month, day_of_week=dow)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"AMPCI_NIGHTLY_CRON: {exc}") from None


class BeatEntry(TypedDict):
    """One entry of Celery's ``beat_schedule``: the task, when (a crontab or every that many seconds), its
    arguments and its message options."""

    task: str
    schedule: crontab | float
    args: NotRequired[tuple[str, ...]]
    options: NotRequired[dict[str, float]]


def beat_schedule(settings: Settings) -> dict[str, BeatEntry]:
    """Beat entries: the nightly sweep (UTC crontab) and, unless ``AMPCI_RECONCILE_EVERY`` is 0, the
    periodic re-sending of lost job messages (:mod:`service.orchestration.reconcile`) every that many seconds;
    a reconcile message not started within one period expires, so they never pile up."""
    schedule: dict[str, BeatEntry] = {
        "nightly-full-sweep": {
            "task": NIGHTLY_TASK,
            "schedule": nightly_schedule(settings.nightly_cron),
            "args": (settings.nightly_sweep,),
        },
    }
    every = settings.reconcile_every
    if every < 0:
        raise ConfigError(f"AMPCI_RECONCILE_EVERY: must be >= 0 seconds, got {every}")
    if every > 0:
        schedule["reconcile-lost-jobs"] = {"task": RECONCILE_TASK, "schedule": every,
                                           "options": {"expires": max(1.0, every)}}
    return schedule


#: How long a new pool child may take to start (preloading the job code) before Celery kills it.
PROC_ALIVE_TIMEOUT_S = 120.0


def declared_queue(name: str) -> Queue:
    """The queue ``name`` bound to a direct exchange of its own with its own name as routing key.  A bare
    ``Queue(name)`` gets Celery's defaults (``task_default_queue``: exchange ``cpu``, key ``cpu``) for every
    queue, so the worker banner showed ``exchange=cpu key=cpu`` for cuda and control too, and a message
    published to that exchange and key would reach every queue."""
    return Queue(name, Exchange(name, type="direct"), routing_key=name)  # type: ignore[no-untyped-call]  # kombu's constructors are unannotated


def make_app(settings: Settings) -> Celery:
    """A configured Celery app for ``settings`` (needs ``AMPCI_BROKER_URL`` to be usable)."""
    broker = settings.broker_url or "redis://127.0.0.1:6379/0"
    soft, hard = time_limits(settings)
    app = Celery("ampci", broker=broker, backend=broker, include=["service.orchestration.tasks"])
    queues = [declared_queue(q) for q in (*DEFAULT_QUEUES, *extra_queues(settings), CONTROL_QUEUE)]
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_acks_on_failure_or_timeout=True,   # a job that *fails* is recorded, not redelivered
        worker_prefetch_multiplier=1,
        # bound slow leaks of onnxruntime arenas by what they cost: a child whose resident memory passed
        # MAX_CHILD_RSS_KIB after a job is replaced, and any child after MAX_TASKS_PER_CHILD jobs.  A replacement
        # idles the worker for its preload (~3 s here): at 200 jobs a child (the old bound) that was 11-15 ms of
        # every 100 ms job in bench/bench_fleet.py
        worker_max_tasks_per_child=MAX_TASKS_PER_CHILD,
        worker_max_memory_per_child=MAX_CHILD_RSS_KIB,
        # a pool child preloads numpy/onnx/onnx_ir (its conversion fork server) and onnxruntime before it
        # reports up (service.orchestration.tasks.preload_job_code): 4-8 s on a busy 2-core machine, where
        # Celery's default of 4 s SIGKILLed every new child, so the worker never ran a job again
        worker_proc_alive_timeout=PROC_ALIVE_TIMEOUT_S,
        task_soft_time_limit=soft,
        task_time_limit=hard,
        broker_transport_options=transport_options(settings),
        result_backend_transport_options={"visibility_timeout": visibility_timeout(settings)},
        result_expires=24 * 3600,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        task_queues=queues,
        task_default_queue="cpu",
        task_routes={NIGHTLY_TASK: {"queue": CONTROL_QUEUE}, RECONCILE_TASK: {"queue": CONTROL_QUEUE}},
        task_track_started=False,
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,      # survive a Redis restart
        worker_cancel_long_running_tasks_on_connection_loss=False,
        worker_hijack_root_logger=False,
        timezone="UTC",
        enable_utc=True,
        beat_schedule=beat_schedule(settings),
    )
    app.conf.ampci_settings = settings
    return app


def app_settings(celery_app: Celery) -> Settings:
    """The Settings an app was built with."""
    return celery_app.conf.ampci_settings  # type: ignore[no-any-return]  # celery publishes no types


app = make_app(Settings.from_env())
