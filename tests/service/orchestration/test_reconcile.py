"""Reconcile without a broker process: message decoding, key names, the candidate query on both
databases, settings, the beat entry, embedded mode and brokers that cannot be inspected.

The broker side (real Redis, real Celery workers) is tested in tests/distributed/test_reconcile.py.
"""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from service.db import Store
from service.db.migrate import upgrade
from service.db.models import Run
from service.errors import ConfigError
from service.orchestration import reconcile as rc
from service.settings import Settings
from tests.service.factories import make_result, sha

t_run = Run.__table__

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def _message(body: Any, task: str | None = "ampci.run_job", encode: bool = True,
             content_type: str = "application/json", **headers: Any) -> dict[str, Any]:
    raw = json.dumps(body).encode()
    return {"body": base64.b64encode(raw).decode() if encode else raw.decode(),
            "content-encoding": "utf-8", "content-type": content_type,
            "headers": {"task": task, "id": "x", **headers},
            "properties": {"body_encoding": "base64"} if encode else {}}


def test_run_job_id_protocol_2() -> None:
    assert rc.run_job_id(_message([[42, "f" * 40], {}, {"callbacks": None}])) == 42
    assert rc.run_job_id(_message([[], {"job_id": 7, "revision": "r"}, {}])) == 7
    assert rc.run_job_id(_message([["smoke"], {}, {}], task="ampci.nightly_sweep")) is None
    assert rc.run_job_id(_message([[3, "r"], {}, {}], encode=False)) == 3


def test_run_job_id_protocol_1() -> None:
    body = {"task": "ampci.run_job", "id": "x", "args": [9, "r"], "kwargs": {}}
    msg = _message(body, task=None)
    del msg["headers"]["task"]
    assert rc.run_job_id(msg) == 9


@pytest.mark.parametrize("msg", [
    _message([[1, "r"], {}, {}], content_type="application/x-python-serialize"),
    _message([[1, "r"], {}, {}], compression="application/x-gzip"),
    _message({"no": "task"}),
    _message([[None], {}, {}]),
    _message([[], {}, {}]),
])
def test_run_job_id_rejects_what_it_cannot_read(msg: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        rc.run_job_id(msg)


def test_undecodable_broker_message_is_a_one_line_error() -> None:
    with pytest.raises(rc.BrokerInspectionError, match="cannot decode a message in Redis key 'cpu'") as err:
        rc._decode(b"not json", "cpu", unacked=False)
    assert "\n" not in str(err.value) and err.value.exit_code == 3
    unacked = json.dumps([_message([[5, "r"], {}, {}]), "", "cpu"])
    assert rc._decode(unacked, "unacked", unacked=True) == 5


def test_broker_keys_follow_kombu_defaults_and_transport_options() -> None:
    keys = rc.BrokerKeys.from_options({})
    assert keys.lists("cpu") == ["cpu", "cpu\x06\x163", "cpu\x06\x166", "cpu\x06\x169"]
    assert keys.unacked_key == "unacked" and keys.lock_key == rc.LOCK_KEY
    custom = rc.BrokerKeys.from_options({"global_keyprefix": "p:", "priority_steps": [0, 5],
                                         "unacked_key": "u", "sep": ":"})
    assert custom.lists("cuda") == ["p:cuda", "p:cuda:5"]
    assert custom.unacked_key == "p:u" and custom.lock_key == "p:" + rc.LOCK_KEY


class Clock:
    """A settable clock for the store (jobs are stamped with it)."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def test_candidate_jobs_filters_status_attempts_age_and_run(db_url: str) -> None:
    upgrade(db_url)
    clock = Clock(T0)
    store = Store.from_url(db_url, clock=clock)
    try:
        rev = sha(1)
        store.upsert_revision(rev)
        cells = [(f"m{i}", "fp16", "default", "cpu") for i in range(4)]
        run = store.create_run_with_jobs(rev, "manual", None, "t", cells)
        jobs = {j.model: j for j in run.jobs}
        store.start_attempt(jobs["m1"].id, "w:1")                      # delivered: running
        store.write_result(run.run_id, make_result(cells[2]), job_id=jobs["m2"].id)  # done
        store.mark_job(jobs["m3"].id, "cancelled")
        cancelled = store.create_run_with_jobs(rev, "manual", None, "t", [("c", "fp16", "default", "cuda")])
        store.set_run_status(cancelled.run_id, "cancelled")
        clock.now = T0 + timedelta(seconds=30)
        later = store.create_run_with_jobs(rev, "push", None, "t", [("late", "bf16", "default", "cuda")])

        assert rc.candidate_jobs(store, 60, now=T0 + timedelta(seconds=59)) == []
        found = rc.candidate_jobs(store, 60, now=T0 + timedelta(seconds=61))
        assert [(c.job.id, c.revision) for c in found] == [(jobs["m0"].id, rev)]
        found = rc.candidate_jobs(store, 60, now=T0 + timedelta(seconds=95))
        assert [c.job.id for c in found] == [jobs["m0"].id, later.jobs[0].id]
        assert found[1].job.target == "cuda" and found[1].job.attempts == 0
        clock.now = T0 + timedelta(hours=1)
        assert [c.job.id for c in rc.candidate_jobs(store, 60)] == [jobs["m0"].id, later.jobs[0].id]
    finally:
        store.dispose()


def test_candidate_jobs_are_only_those_of_broker_runs(db_url: str) -> None:
    """A run created by an embedded process (``dispatch`` local) shares the database but not the
    broker: its never-started jobs are no candidates, however old; they are listed as local."""
    upgrade(db_url)
    store = Store.from_url(db_url, clock=Clock(T0))
    try:
        rev = sha(2)
        broker = store.create_run_with_jobs(rev, "manual", None, "t", [("b", "fp16", "default", "cpu")])
        local = store.create_run_with_jobs(rev, "manual", None, "t", [("l", "fp16", "default", "cpu")],
                                           dispatch="local")
        bisect = Store.from_url(db_url, clock=Clock(T0), run_dispatch="local").create_run_with_jobs(
            rev, "bisect", None, "bisect", [("l", "bf16", "default", "cuda")])
        later = T0 + timedelta(hours=2)
        assert [c.job.id for c in rc.candidate_jobs(store, 60, now=later)] == [broker.jobs[0].id]
        assert [c.job.id for c in rc.candidate_jobs(store, 60, now=later, dispatch="local")] == \
            [local.jobs[0].id, bisect.jobs[0].id]
        assert rc.candidate_jobs(store, 60, now=T0, dispatch="local") == []  # the grace applies too
    finally:
        store.dispose()


def _run_dispatch(store: Store, run_id: int) -> str:
    with store.transaction() as conn:
        return str(conn.execute(t_run.select().where(t_run.c.id == run_id)).one().dispatch)


def test_runs_record_how_the_creating_process_dispatches(pg_url: str) -> None:
    """Every way a run is created records its creator's dispatch, local in embedded mode, else
    broker: runs made through the scheduler's store (bisection steps) and by the webhook/API
    dispatcher (whose mode follows what its dispatch function does).  ``start_sweep``: see
    tests/distributed/test_reconcile.py."""
    from service.api.dispatch import CeleryDispatch, RunDispatcher, embedded_dispatch
    from service.orchestration.scheduler import dispatch_mode, open_store
    from service.orchestration.sweeps import SweepConfig

    embedded = Settings(database_url=pg_url)
    distributed = Settings(database_url=pg_url, broker_url="redis://127.0.0.1:1/0")
    assert (dispatch_mode(embedded), dispatch_mode(distributed)) == ("local", "broker")
    plan = SweepConfig(name="t", models=("m",), dtypes=("fp16",), policies=("default",), targets=("cpu",),
                       repeats=1).expand({"m": ["x"]})
    stores = [open_store(embedded), open_store(distributed)]
    try:
        for settings, store in zip((embedded, distributed), stores, strict=True):
            mode = dispatch_mode(settings)
            assert store.run_dispatch == mode
            run_id = store.create_run(sha(3), "bisect", None, "bisect", [(mode, "fp16", "default", "cpu")])
            assert _run_dispatch(store, run_id) == mode
            api = RunDispatcher(settings, store, planner=lambda _sweep: plan, dispatch=lambda *_: None)
            made = api.create(sha(4), "manual", None, "t", dedup_key=f"api-{mode}")
            assert (api.mode, _run_dispatch(store, made.run_id)) == (mode, mode)
        assert RunDispatcher(distributed, stores[1]).mode == "broker"               # Celery by default
        assert RunDispatcher(distributed, stores[1], dispatch=embedded_dispatch).mode == "local"
        assert RunDispatcher(embedded, stores[0], dispatch=CeleryDispatch()).mode == "broker"
        assert RunDispatcher(embedded, stores[0], dispatch=CeleryDispatch(), mode="local").mode == "local"
    finally:
        for store in stores:
            store.dispose()


def test_embedded_mode_has_nothing_to_reconcile(sqlite_url: str) -> None:
    settings = Settings(broker_url="", database_url=sqlite_url)
    report = rc.reconcile(settings, None)
    assert report.skipped and "AMPCI_BROKER_URL" in report.skipped and report.resent == ()
    assert rc.resend_lost_jobs(settings, None) == []
    assert rc.lost_jobs(settings, None).lost == ()


@pytest.mark.parametrize("url", ["amqp://u:secret@h:5672//", "sentinel://h:26379", "redis://a;redis://b"])
def test_a_broker_that_is_not_redis_is_a_one_line_error(url: str) -> None:
    settings = Settings(broker_url=url)
    with pytest.raises(rc.UnsupportedBrokerError) as err:
        rc.resend_lost_jobs(settings, None)
    assert err.value.exit_code == 2 and "\n" not in str(err.value) and "secret" not in str(err.value)


def test_reconcile_settings() -> None:
    assert Settings().reconcile_every == 300.0 and Settings().reconcile_grace == 300.0
    s = Settings.from_env({"AMPCI_RECONCILE_EVERY": "2m", "AMPCI_RECONCILE_GRACE": "90s"})
    assert s.reconcile_every == 120.0 and s.reconcile_grace == 90.0
    assert Settings.from_env({"AMPCI_RECONCILE_EVERY": "0"}).reconcile_every == 0.0
    assert Settings.from_env({"AMPCI_RECONCILE_EVERY": "off"}).reconcile_every == 0.0
    for var, raw in (("AMPCI_RECONCILE_EVERY", "-5"), ("AMPCI_RECONCILE_EVERY", "often"),
                     ("AMPCI_RECONCILE_GRACE", "0"), ("AMPCI_RECONCILE_GRACE", "soon")):
        with pytest.raises(ConfigError, match=var):
            Settings.from_env({var: raw})


def test_beat_schedules_reconcile_on_the_control_queue() -> None:
    from service.orchestration.celery_app import CONTROL_QUEUE, RECONCILE_TASK, make_app

    app = make_app(Settings.from_env({"AMPCI_RECONCILE_EVERY": "45s", "AMPCI_BROKER_URL": "redis://h:1/0"}))
    entry = app.conf.beat_schedule["reconcile-lost-jobs"]
    assert entry["task"] == RECONCILE_TASK and entry["schedule"] == 45.0
    assert entry["options"]["expires"] == 45.0
    assert app.amqp.router.route({}, RECONCILE_TASK)["queue"].name == CONTROL_QUEUE
    assert "nightly-full-sweep" in app.conf.beat_schedule
    off = make_app(Settings.from_env({"AMPCI_RECONCILE_EVERY": "0"}))
    assert "reconcile-lost-jobs" not in off.conf.beat_schedule
    from service.orchestration import tasks

    assert app.tasks[RECONCILE_TASK].name == tasks.reconcile_task.name
