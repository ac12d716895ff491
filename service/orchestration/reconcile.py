"""Re-send jobs whose Celery message was lost (the broker forgot it, or its sender died), also
jobs left ``running`` by a worker that is gone (their lease expired).

A job is ``queued`` from the moment its run is created until a worker counts its first delivery
(``attempts`` 1, ``running``).  Meanwhile its one ``ampci.run_job`` message lives in the Redis list
of its target queue (or a priority sub-list of it) and, once a worker has taken it but not yet
acknowledged it, in kombu's ``unacked`` hash.  The message can vanish: a Redis crash inside kombu's
window between popping a message and recording it as unacked, a Redis without persistence
restarted, or a process that died between committing the job rows and sending their messages.
Such a job stays ``queued`` forever and its run never finishes.

:func:`resend_lost_jobs` finds those jobs and sends each one the message
:func:`service.orchestration.scheduler.enqueue` sent originally.  A job is **lost** when all of these hold:

* its run was dispatched through the broker (``runs.dispatch`` is ``broker``: a run created by an
  embedded process, whose local pool runs its jobs, is not this reconciler's to re-send even when
  that process shares the database);
* it is ``queued`` with ``attempts == 0`` (never delivered), or ``running`` past its lease (see
  *Job leases* below), and its run is not finished;
* it was queued more than ``grace_s`` seconds ago (a job whose message is being sent right now is
  not touched);
* no ``ampci.run_job`` message for it is in any queue list of the broker (every priority sub-list
  of every configured queue and of every candidate's target) nor in the ``unacked`` hash, in either
  of two atomic (MULTI/EXEC) snapshots of the broker taken before and after the database is read.
  A message moving between list and hash, or being taken by a worker meanwhile, is seen in one
  of them (or its job is no longer queued-without-attempts in the database).

**Job leases.**  A delivery holds its job for at most :func:`job_lease_s` seconds from
``started_at`` (stamped by every delivery, :meth:`service.db.store.Store.start_attempt`): the
broker's visibility timeout, itself longer than the hard time limit ``AMPCI_JOB_TIMEOUT`` after
which the worker's pool kills the job and records a ``timeout``.  A job still ``running`` after
its lease plus the grace period has no live delivery: its worker died, and if the broker still had
the message kombu would have handed it out again by now.  When such a job's message is in no queue
list nor the ``unacked`` hash either (a worker killed while Redis restarted empty, the double fault
that used to leave a run unfinished forever) it is **lost** too and re-sent.  The delivery of the
re-sent message counts an attempt like any other (``service.orchestration.tasks.execute_job``), so a poison job
still ends ``crashed`` after ``AMPCI_MAX_ATTEMPTS`` deliveries.  These jobs are reported as
:attr:`Inspection.stale`.

Jobs that would be candidates but belong to a ``local`` run are reported separately
(:attr:`Inspection.local`, "local, not re-sent"): the embedded process that owns them runs them;
if it died they stay ``queued``, never sent to Celery workers behind its back.

Guarantees: a job whose message is in the broker is never re-sent, nor is a job of a ``local``
run; the broker is read before anything is sent, so a broker that cannot be inspected (not Redis,
unreachable, a message that cannot be decoded) raises :class:`BrokerInspectionError` (one line)
and nothing is sent; embedded mode (no broker) does nothing; reconcilers sharing a broker are
serialised by a Redis lock with a time-to-live, and if two ever overlap the worst outcome is a
duplicate message, which ``service.orchestration.tasks.execute_job`` tolerates (final jobs are skipped, result
writes are idempotent).
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, cast

from service.db import recovery
from service.db.records import JobInfo
from service.errors import ServiceError, UserError
from service.json_types import JsonObject, JsonValue
from service.settings import Settings, redact_url

if TYPE_CHECKING:
    import redis
    from celery import Celery
    from redis.lock import Lock

    from service.db.store import Store

log = logging.getLogger(__name__)

LOCK_KEY = "ampci:reconcile:lock"
LOCK_TTL_S = 300.0     # a reconciler that dies holding the lock blocks others for at most this long
LOCK_WAIT_S = 10.0     # how long a second reconciler waits for the first before giving up

class BrokerInspectionError(ServiceError):
    """The broker cannot be inspected or written (unreachable, not Redis, undecodable message);
    nothing was re-sent unless the message says so.  Exit code 3 (a service is unavailable)."""

    exit_code = 3


class UnsupportedBrokerError(BrokerInspectionError, UserError):
    """``AMPCI_BROKER_URL`` names a broker whose queues cannot be inspected (only Redis can)."""

    exit_code = 2


@dataclass(frozen=True)
class LostJob:
    """A job whose message is in no queue list nor the ``unacked`` hash, with its run's revision
    (what the original message carried)."""

    job: JobInfo
    revision: str
    stale: bool = False   # a ``running`` job whose lease expired (else queued and never delivered)

    def to_dict(self) -> JsonObject:
        """JSON-ready form."""
        return {"job": self.job.to_dict(), "revision": self.revision, "stale_running": self.stale}


@dataclass(frozen=True)
class Inspection:
    """One read-only look at the database and the broker (see :func:`lost_jobs`)."""

    lost: tuple[LostJob, ...] = ()
    candidates: tuple[int, ...] = ()   # broker jobs queued, never delivered, older than the grace, run unfinished
    messages: int = 0                  # messages seen in the inspected lists and the unacked hash
    queues: tuple[str, ...] = ()       # queues whose lists were inspected
    local: tuple[int, ...] = ()        # the same but of ``local`` runs (embedded processes): never re-sent
    stale: tuple[int, ...] = ()        # broker jobs ``running`` past their lease and the grace, run unfinished
    lease_s: float = 0.0               # the lease that ``stale`` was judged by (before the grace)


@dataclass(frozen=True)
class ReconcileReport:
    """What one reconcile pass found and did: the inspection, the ids ``resent`` (empty for a dry
    run) and ``skipped`` (why nothing was examined, if so)."""

    inspection: Inspection = field(default_factory=Inspection)
    resent: tuple[int, ...] = ()
    dry_run: bool = False
    grace_s: float = 0.0
    skipped: str | None = None

    @property
    def lost(self) -> tuple[LostJob, ...]:
        """The jobs found lost."""
        return self.inspection.lost

    def to_dict(self) -> JsonObject:
        """JSON-ready form (for ``ampci reconcile --json``)."""
        i = self.inspection
        return {"candidates": list(i.candidates), "lost": [x.to_dict() for x in i.lost],
                "resent": list(self.resent), "local_not_resent": list(i.local), "broker_messages": i.messages,
                "stale_running": list(i.stale), "lease_s": i.lease_s,
                "queues": list(i.queues), "dry_run": self.dry_run, "grace_s": self.grace_s,
                "skipped": self.skipped}


# -- messages ---------------------------------------------------------------------------------------
def run_job_id(message: Mapping[str, JsonValue]) -> int | None:
    """The job id carried by a kombu message of an ``ampci.run_job`` task; None for any other task.

    Understands Celery task protocol 2 (``headers.task``, body ``[args, kwargs, embed]``) and
    protocol 1 (body ``{"task", "args", "kwargs"}``), JSON bodies, base64 body encoding.  The job id
    is ``args[0]`` (or ``kwargs["job_id"]``).  Raises ValueError for a message it cannot decode.
    """
    from service.orchestration.celery_app import RUN_JOB_TASK

    headers = message.get("headers") or {}
    props = message.get("properties") or {}
    if headers.get("compression"):
        raise ValueError(f"compressed body ({headers['compression']})")
    ctype = message.get("content-type") or message.get("content_type")
    if ctype != "application/json":
        raise ValueError(f"content type {ctype!r}, expected application/json")
    raw_body: JsonValue = message.get("body")
    body: JsonValue | bytes = base64.b64decode(raw_body) if props.get("body_encoding") == "base64" else raw_body
    decoded: JsonValue = json.loads(body) if isinstance(body, str | bytes) else body
    task = headers.get("task")
    if isinstance(decoded, list) and len(decoded) == 3:
        args, kwargs = decoded[0], decoded[1]
    elif isinstance(decoded, dict) and "task" in decoded:
        task, args, kwargs = decoded["task"], decoded.get("args"), decoded.get("kwargs")
    else:
        raise ValueError("body is neither a protocol 1 nor a protocol 2 task")
    if task != RUN_JOB_TASK:
        return None
    args, kwargs = args or [], kwargs or {}
    job_id = args[0] if args else kwargs.get("job_id")
    if isinstance(job_id, bool) or not isinstance(job_id, int | str):
        raise ValueError(f"{RUN_JOB_TASK} without a job id")
    return int(job_id)


def _decode(raw: bytes | str, where: str, unacked: bool) -> int | None:
    try:
        payload = json.loads(raw)
        if unacked:  # kombu's unacked hash holds [message, exchange, routing_key]
            payload = payload[0]
        return run_job_id(payload)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
        raise BrokerInspectionError(f"cannot decode a message in Redis key {where!r} ({exc}); "
                                    "not re-sending anything") from None


# -- broker -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BrokerKeys:
    """Redis key names of kombu's Redis transport (defaults of ``kombu.transport.redis.Channel``,
    overridden by ``broker_transport_options``)."""

    prefix: str = ""
    sep: str = "\x06\x16"
    priority_steps: tuple[int, ...] = (0, 3, 6, 9)
    unacked: str = "unacked"

    @classmethod
    def from_options(cls, options: Mapping[str, object]) -> BrokerKeys:
        """Key names for these transport options."""
        from kombu.transport.redis import Channel

        # kombu's option: a sequence of priorities (Celery's configuration is untyped)
        steps = cast("Iterable[int]", options.get("priority_steps", Channel.priority_steps))
        return cls(prefix=str(options.get("global_keyprefix", Channel.global_keyprefix) or ""),
                   sep=str(options.get("sep", Channel.sep)),
                   priority_steps=tuple(steps),
                   unacked=str(options.get("unacked_key", Channel.unacked_key)))

    def lists(self, queue: str) -> list[str]:
        """The list keys of ``queue``: the queue name (priority 0) and one sub-list per other step."""
        return [self.prefix + (f"{queue}{self.sep}{p}" if p else queue) for p in self.priority_steps]

    @property
    def unacked_key(self) -> str:
        """The hash of messages delivered to a consumer but not yet acknowledged."""
        return self.prefix + self.unacked

    @property
    def lock_key(self) -> str:
        """The key of the lock that serialises reconcilers."""
        return self.prefix + LOCK_KEY


def redis_client(settings: Settings) -> redis.Redis:
    """A redis-py client for ``AMPCI_BROKER_URL`` (same server and database as kombu), or
    UnsupportedBrokerError when the broker is not Redis.  Connects lazily."""
    import redis

    url = settings.broker_url.strip()
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if ";" in url or scheme not in {"redis", "rediss", "redis+socket"}:
        raise UnsupportedBrokerError(f"AMPCI_BROKER_URL {redact_url(url)!r}: only a single redis:// or rediss:// "
                                     "broker can be inspected for lost messages")
    if scheme == "redis+socket":
        url = "unix://" + url.split("://", 1)[1]
    return redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=30)


def _redis_errors() -> tuple[type[BaseException], ...]:
    import redis

    return (redis.exceptions.RedisError, OSError)


def _unreachable(settings: Settings, exc: BaseException) -> BrokerInspectionError:
    return BrokerInspectionError(f"cannot inspect the broker at {redact_url(settings.broker_url)}: "
                                 f"{type(exc).__name__}: {str(exc).rstrip('.')}; nothing re-sent")


def broker_job_ids(client: redis.Redis, keys: BrokerKeys, queues: Iterable[str]) -> tuple[set[int], int]:
    """(job ids of ``ampci.run_job`` messages, number of messages) in the lists of ``queues`` and in
    the ``unacked`` hash, read in one MULTI/EXEC transaction (a consistent snapshot)."""
    list_keys = [k for q in dict.fromkeys(queues) for k in keys.lists(q)]
    pipe = client.pipeline(transaction=True)
    for key in list_keys:
        pipe.lrange(key, 0, -1)
    pipe.hvals(keys.unacked_key)
    replies = pipe.execute()
    ids: set[int] = set()
    n = 0
    for where, items, unacked in [*zip(list_keys, replies[:-1], [False] * len(list_keys), strict=True),
                                  (keys.unacked_key, replies[-1], True)]:
        for raw in items:
            n += 1
            job_id = _decode(raw, where, unacked)
            if job_id is not None:
                ids.add(job_id)
    return ids, n


# -- database ---------------------------------------------------------------------------------------
def candidate_jobs(store: Store, grace_s: float, now: datetime | None = None,
                   dispatch: str = "broker") -> list[LostJob]:
    """Jobs that *could* be lost: ``queued``, ``attempts == 0``, queued at least ``grace_s`` seconds
    before ``now`` (default: the store's clock), in a run that is neither finished nor cancelled
    and whose jobs were dispatched by ``dispatch`` (default ``broker``: only those can be re-sent;
    ``local``: an embedded process's, for the report); oldest first, each with its run's revision."""
    cutoff = (now or store.clock()) - timedelta(seconds=grace_s)
    with store.transaction() as conn:
        found = recovery.undelivered_jobs(conn, queued_before=cutoff, dispatch=dispatch)
    return [LostJob(job=job, revision=revision) for job, revision in found]


def job_lease_s(settings: Settings) -> float:
    """Seconds one delivery may hold a ``running`` job: the broker's visibility timeout
    (:func:`service.orchestration.celery_app.visibility_timeout`, strictly longer than the hard time limit)."""
    from service.orchestration.celery_app import visibility_timeout

    return visibility_timeout(settings)


def stale_running_jobs(store: Store, lease_s: float, now: datetime | None = None,
                       dispatch: str = "broker") -> list[LostJob]:
    """Jobs ``running`` whose last delivery started at least ``lease_s`` seconds before ``now``
    (default: the store's clock), in an unfinished, uncancelled run dispatched by ``dispatch``;
    oldest first, marked ``stale``."""
    cutoff = (now or store.clock()) - timedelta(seconds=lease_s)
    with store.transaction() as conn:
        found = recovery.running_jobs_started_before(conn, started_before=cutoff, dispatch=dispatch)
    return [LostJob(job=job, revision=revision, stale=True) for job, revision in found]


def _candidates(store: Store, grace: float, lease: float, dispatch: str = "broker") -> list[LostJob]:
    """Queued-never-delivered jobs past the grace, then running jobs past lease + grace."""
    return [*candidate_jobs(store, grace, dispatch=dispatch), *stale_running_jobs(store, lease + grace,
                                                                                   dispatch=dispatch)]


# -- reconcile --------------------------------------------------------------------------------------
def _queues(app: Celery) -> list[str]:
    return [q.name for q in (app.conf.task_queues or ())]


def lost_jobs(settings: Settings, store: Store, app: Celery | None = None, grace_s: float | None = None,
              client: redis.Redis | None = None) -> Inspection:
    """The lost jobs and what was looked at to find them: see the module docstring.

    Reads only (the database and the broker); raises BrokerInspectionError if the broker cannot be
    inspected.  Only jobs of ``broker`` runs can be lost; those of ``local`` runs that would
    otherwise qualify are listed in ``local``.  Embedded mode (no broker) returns nothing.
    """
    if settings.embedded:
        return Inspection()
    grace = settings.reconcile_grace if grace_s is None else float(grace_s)
    if grace < 0:
        raise UserError(f"grace must be >= 0 seconds, got {grace}")
    if app is None:
        from service.orchestration.broker import celery_app

        app = celery_app(settings)
    client = client if client is not None else redis_client(settings)
    keys = BrokerKeys.from_options(app.conf.broker_transport_options or {})
    lease = job_lease_s(settings)
    try:
        client.ping()
        local = tuple(c.job.id for c in _candidates(store, grace, lease, dispatch="local"))
        first = _candidates(store, grace, lease)
        if not first:
            return Inspection(local=local, lease_s=lease)
        queues = list(dict.fromkeys([*_queues(app), *(c.job.target for c in first)]))
        seen_before, n = broker_job_ids(client, keys, queues)
        candidates = _candidates(store, grace, lease)
        queues = list(dict.fromkeys([*queues, *(c.job.target for c in candidates)]))
        seen_after, n_after = broker_job_ids(client, keys, queues)
    except _redis_errors() as exc:
        raise _unreachable(settings, exc) from None
    seen = seen_before | seen_after
    lost = tuple(c for c in candidates if c.job.id not in seen)
    return Inspection(lost, tuple(c.job.id for c in candidates if not c.stale), max(n, n_after), tuple(queues),
                      local, tuple(c.job.id for c in candidates if c.stale), lease)


def reconcile(settings: Settings, store: Store, app: Celery | None = None, grace_s: float | None = None,
              dry_run: bool = False, lock_wait_s: float = LOCK_WAIT_S, client: redis.Redis | None = None
              ) -> ReconcileReport:
    """Find lost jobs and (unless ``dry_run``) re-send each with :func:`service.orchestration.scheduler.enqueue`.

    See the module docstring for what counts as lost and the guarantees.  Re-sending holds a Redis
    lock (``ampci:reconcile:lock``) so a second reconciler waits ``lock_wait_s`` and then inspects
    the broker only after the first one's messages are in it (or reports ``skipped``).
    """
    grace = settings.reconcile_grace if grace_s is None else float(grace_s)
    if settings.embedded:
        return ReconcileReport(dry_run=dry_run, grace_s=grace,
                               skipped="no broker configured (AMPCI_BROKER_URL): nothing to reconcile")
    if app is None:
        from service.orchestration.broker import celery_app

        app = celery_app(settings)
    client = client if client is not None else redis_client(settings)
    if dry_run:
        return ReconcileReport(lost_jobs(settings, store, app, grace, client), dry_run=True, grace_s=grace)
    keys = BrokerKeys.from_options(app.conf.broker_transport_options or {})
    try:
        lock = client.lock(keys.lock_key, timeout=LOCK_TTL_S, blocking_timeout=lock_wait_s)
        acquired = lock.acquire()
    except _redis_errors() as exc:
        raise _unreachable(settings, exc) from None
    if not acquired:
        return ReconcileReport(grace_s=grace, skipped=f"another reconcile holds {keys.lock_key!r}; skipped")
    try:
        inspection = lost_jobs(settings, store, app, grace, client)
        resent = _resend(settings, app, inspection.lost)
    finally:
        _release(lock)
    if inspection.local:
        log.info("%d queued job(s) of local (embedded-mode) runs past the grace period, not re-sent: %s",
                 len(inspection.local), list(inspection.local))
    return ReconcileReport(inspection, tuple(resent), grace_s=grace)


def _resend(settings: Settings, app: Celery, lost: Sequence[LostJob]) -> list[int]:
    """Send the original message of each lost job, grouped by revision; return the ids sent."""
    from service.orchestration.broker import enqueue

    by_revision: dict[str, list[JobInfo]] = {}
    for item in lost:
        by_revision.setdefault(item.revision, []).append(item.job)
    sent: list[int] = []
    for revision, jobs in by_revision.items():
        try:
            enqueue(settings, revision, jobs, app=app)
        except Exception as exc:  # noqa: BLE001 - kombu/redis errors vary; report what was sent
            raise BrokerInspectionError(
                f"re-sending failed ({type(exc).__name__}: {exc}); re-sent: {sent}, maybe not re-sent: "
                f"{[j.id for j in jobs]}; run reconcile again (jobs in the broker are skipped)") from None
        for job in jobs:
            why = (f"running on {job.worker} since {job.started_at:%Y-%m-%d %H:%M:%S} past its lease"
                   if job.status == "running" and job.started_at else "queued")
            log.warning("re-sent job %d (run %d, queue %s, revision %s; %s): its message was in no queue "
                        "and not unacked", job.id, job.run_id, job.target, revision[:12], why)
        sent.extend(j.id for j in jobs)
    return sent


def _release(lock: Lock) -> None:
    try:
        lock.release()
    except Exception as exc:  # noqa: BLE001 - expired (LockNotOwnedError) or Redis gone: the TTL frees it
        log.warning("reconcile lock not released: %s: %s", type(exc).__name__, exc)


def resend_lost_jobs(settings: Settings, store: Store, app: Celery | None = None, grace_s: float | None = None,
                     dry_run: bool = False) -> list[int]:
    """Re-send the jobs whose message is lost; return their ids (those that would be, for a dry
    run).  ``grace_s`` defaults to ``AMPCI_RECONCILE_GRACE``.  See :func:`reconcile`."""
    report = reconcile(settings, store, app=app, grace_s=grace_s, dry_run=dry_run)
    return [item.job.id for item in report.lost] if dry_run else list(report.resent)
