"""Races of the embedded local pool, with the interleaving forced instead of left to a loaded machine.

* ``LocalPool.shutdown`` hands back (re-queues) the jobs its threads are running itself, before it
  returns, even when a job thread does not get to run again before the process exits; a thread that
  wakes up afterwards writes nothing over a job that was handed back.
* ``Slot.stop`` called by two threads at once (a pool's shutdown and the slot's own job thread) ends
  the subprocess once, without either call failing.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from service.db import Store
from service.db.migrate import upgrade
from service.orchestration import orphans, pool_slots
from service.orchestration.localpool import LocalPool
from service.orchestration.pool_slots import Slot, SlotDied
from service.settings import Settings
from tests.waiting import SAFETY_NET_S
from workers.result import JobResult

CELLS = [("conv_net", "fp16", "default", "cpu"), ("conv_net", "bf16", "default", "cpu")]


class HeldSlot(Slot):
    """A slot whose job waits for ``release`` (our stand-in for a job thread a loaded machine does not
    schedule), then ends as ``outcome`` says: ``died`` (its subprocess was killed) or ``result``."""

    outcome = "died"
    instances: list[HeldSlot] = []

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()
        HeldSlot.instances.append(self)

    def run(self, request: tuple[Any, ...], timeout: float) -> str | None:
        cell, revision, _, _ = request
        self.entered.set()
        assert self.release.wait(SAFETY_NET_S)
        if self.outcome == "died":
            raise SlotDied()
        model, dtype, policy, target = cell
        return JobResult(model=model, dtype=dtype, policy=policy, target=target, status="pass",
                         revision=revision).to_json()


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    upgrade(db_url)
    store = Store.from_url(db_url)
    try:
        yield store
    finally:
        store.dispose()


def _held_pool(store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, outcome: str) -> tuple[LocalPool, int]:
    """A one-worker pool running the first job of a fresh run in a :class:`HeldSlot`, held."""
    monkeypatch.setattr(HeldSlot, "instances", [])
    monkeypatch.setattr(HeldSlot, "outcome", outcome)
    monkeypatch.setattr(pool_slots, "Slot", HeldSlot)
    sha = "b" * 40
    store.upsert_revision(sha, [], "main", "dev", "x")
    run_id = store.create_run(sha, "manual", None, "t", CELLS, dispatch="local")
    pool = LocalPool(Settings(data_dir=tmp_path / "data", cache_dir=tmp_path / "cache"), store, workers=1)
    pool.submit(store.jobs(run_id))
    assert HeldSlot.instances and HeldSlot.instances[0].entered.wait(SAFETY_NET_S)
    assert [j.status for j in store.jobs(run_id)].count("running") == 1
    return pool, run_id


@pytest.mark.parametrize("outcome", ["died", "result"])
def test_shutdown_hands_back_the_running_job_before_it_returns(store: Store, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch, outcome: str) -> None:
    pool, run_id = _held_pool(store, tmp_path, monkeypatch, outcome)
    (slot,) = HeldSlot.instances
    pool.shutdown(timeout=0.2)  # its job thread is held: it cannot hand its job back in time
    jobs = store.jobs(run_id)
    assert [(j.status, j.attempts, j.worker) for j in jobs] == [("queued", 0, None)] * 2, jobs
    assert orphans.owner_of(store, run_id) is None

    slot.release.set()  # the thread wakes up after the shutdown: its job is not its own any more
    pool.finish()
    assert not pool.errors, pool.errors
    jobs = store.jobs(run_id)
    assert [(j.status, j.attempts, j.worker) for j in jobs] == [("queued", 0, None)] * 2, jobs
    assert store.results(run_id) == []  # a late result is not written over a handed-back job
    assert store.get_run(run_id).finished_at is None


def test_shutdown_leaves_a_job_that_ended_before_it_ended(store: Store, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The hand-back re-queues only what is still running: a result written first stays."""
    pool, run_id = _held_pool(store, tmp_path, monkeypatch, "result")
    (slot,) = HeldSlot.instances
    first = store.jobs(run_id)[0].id
    slot.release.set()  # both jobs run to their end (the second finds the slot released already)
    pool.finish()
    pool.shutdown(timeout=0.2)
    jobs = {j.id: j for j in store.jobs(run_id)}
    assert jobs[first].status == "done" and {j.status for j in jobs.values()} == {"done"}, jobs
    assert len(store.results(run_id)) == 2


def test_two_threads_stopping_one_slot_at_once_end_it_once() -> None:
    slot = Slot()
    slot.ensure_started()  # a real worker subprocess
    proc, conn = slot.proc, slot.conn
    in_join, go_on = threading.Event(), threading.Event()
    real_join = proc.join
    calls = 0

    def held_join(timeout: float | None = None) -> None:  # the first stop is held inside its first join
        nonlocal calls
        calls += 1
        if calls == 1:
            in_join.set()
            assert go_on.wait(SAFETY_NET_S)
        real_join(timeout)

    proc.join = held_join
    errors: list[BaseException] = []

    def first() -> None:
        try:
            slot.stop(kill=True)  # the slot's own thread (its subprocess died under it)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    t = threading.Thread(target=first)
    t.start()
    assert in_join.wait(SAFETY_NET_S)
    slot.stop(kill=True)  # a pool's shutdown, meanwhile
    slot.ask_to_stop()
    go_on.set()
    t.join(SAFETY_NET_S)
    assert not t.is_alive() and errors == [], errors
    assert slot.proc is None and slot.conn is None
    assert proc.exitcode is not None and conn.closed  # reaped, its pipe closed
    assert proc not in pool_slots.LIVE
    slot.stop()  # and again: nothing to do
