"""Two processes writing the same cell, counting attempts and deduplicating runs at once (PostgreSQL)."""

from __future__ import annotations

import multiprocessing

import pytest

from tests.service.factories import CELL, chain, make_result, migrated_store

ROUNDS = 25


def _writer(url: str, run_id: int, job_id: int, worker: str, barrier) -> None:  # type: ignore[no-untyped-def]
    from service.db import Store

    store = Store.from_url(url)
    barrier.wait(30)
    for i in range(ROUNDS):
        store.write_result(run_id, make_result(max_abs=1e-3 * (i + 1), seed=i))
        store.start_attempt(job_id, worker)
        store.create_run(store.get_run(run_id).revision_sha, "nightly", cells=[CELL], dedup_key=f"nightly:{i}")
        store.record_delivery(f"delivery-{i}", "push", "accepted")
    store.dispose()


@pytest.mark.postgres
def test_two_writers_one_cell(pg_url: str) -> None:
    store = migrated_store(pg_url)
    (rev,) = chain(store, 1)
    run_id = store.create_run(rev, "push", cells=[CELL])
    (job,) = store.jobs(run_id)
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_writer, args=(pg_url, run_id, job.id, f"w{i}", barrier)) for i in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    rows = store.results(run_id=run_id)
    assert len(rows) == 1 and rows[0].max_abs == pytest.approx(1e-3 * ROUNDS)
    assert store.get_job(job.id).attempts == 2 * ROUNDS  # no lost increments
    nightly = store.list_runs(trigger="nightly", limit=1000)
    assert len(nightly) == ROUNDS and len({r.dedup_key for r in nightly}) == ROUNDS
    assert all(len(store.jobs(r.id)) == 1 for r in nightly)
    assert all(store.get_delivery(f"delivery-{i}") is not None for i in range(ROUNDS))
    store.dispose()
