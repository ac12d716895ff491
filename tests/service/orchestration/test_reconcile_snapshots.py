"""Reconcile never re-sends a job that either broker snapshot showed: the union of the snapshot taken
before the database read and the one taken after it is what was seen (a message a worker took between
the two, or one a sender pushed between them, is not lost).  Real Redis (keys under a unique prefix),
real PostgreSQL; the broker changes between the two snapshots through a client that runs a step after
each MULTI/EXEC, as a worker or a sender would."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import redis

from service.db import Store
from service.db.migrate import upgrade
from service.orchestration import reconcile as rc
from service.settings import Settings
from tests.service.factories import sha

pytestmark = [pytest.mark.redis, pytest.mark.postgres]


def _message(job_id: int) -> bytes:
    body = json.dumps([[job_id, "f" * 40], {}, {"callbacks": None}]).encode()
    return json.dumps({"body": base64.b64encode(body).decode(), "content-encoding": "utf-8",
                       "content-type": "application/json", "headers": {"task": "ampci.run_job", "id": str(job_id)},
                       "properties": {"body_encoding": "base64"}}).encode()


class _Pipe:
    def __init__(self, owner: SteppingClient, pipe: Any) -> None:
        self.owner, self.pipe = owner, pipe

    def lrange(self, *a: Any) -> _Pipe:
        self.pipe.lrange(*a)
        return self

    def hvals(self, *a: Any) -> _Pipe:
        self.pipe.hvals(*a)
        return self

    def execute(self) -> Any:
        out = self.pipe.execute()
        self.owner.snapshots += 1
        step = self.owner.steps.get(self.owner.snapshots)
        if step is not None:
            step()
        return out


class SteppingClient:
    """A redis-py client that runs ``steps[n]`` right after its ``n``-th MULTI/EXEC snapshot."""

    def __init__(self, client: Any, steps: dict[int, Callable[[], object]]) -> None:
        self.client, self.steps, self.snapshots = client, steps, 0

    def ping(self) -> Any:
        return self.client.ping()

    def pipeline(self, transaction: bool = True) -> _Pipe:
        return _Pipe(self, self.client.pipeline(transaction=transaction))


def test_a_job_seen_in_either_snapshot_is_not_lost(pg_url: str, redis_url: str, unique_prefix: str) -> None:
    upgrade(pg_url)
    store = Store.from_url(pg_url)
    r = redis.Redis.from_url(redis_url)
    prefix = f"{unique_prefix}:"
    try:
        rev = sha(1)
        store.upsert_revision(rev)
        target = "cpu"
        run = store.create_run_with_jobs(rev, "push", None, "t", [(m, "fp16", "default", target)
                                                                   for m in ("taken", "pushed", "lost")],
                                         dispatch="broker")
        ids = {j.model: j.id for j in run.jobs}
        queue = prefix + target
        r.rpush(queue, _message(ids["taken"]))  # in the first snapshot; a worker takes it before the second

        def between() -> None:
            assert r.lrem(queue, 1, _message(ids["taken"])) == 1
            r.rpush(queue, _message(ids["pushed"]))  # a sender's message lands between the snapshots

        client = SteppingClient(r, {1: between})
        app = SimpleNamespace(conf=SimpleNamespace(broker_transport_options={"global_keyprefix": prefix},
                                                   task_queues=()))
        settings = Settings(database_url=pg_url, broker_url=redis_url)
        found = rc.lost_jobs(settings, store, app=app, grace_s=0, client=client)
        assert client.snapshots == 2
        assert [c.job.id for c in found.lost] == [ids["lost"]]  # only the job neither snapshot showed
    finally:
        for key in r.scan_iter(f"{prefix}*"):
            r.delete(key)
        store.dispose()
