"""What a worker's bookkeeping costs the database per job, counted on the real PostgreSQL (issue 25).

The budget: at most 4 SQL statements and 2 commits around each job's own work (start the attempt;
write the result and end the job; ask whether the run is done), the run summary built once, by the
run's last job only.  Counted with SQLAlchemy's engine events on the Store the worker uses and, on the
psycopg connections of its job bookkeeping (``Store._bookkeeping``, plain prepared SQL), by a counting
cursor class on every connection that pool hands out, so any re-fetch of rows or per-job summary that
comes back fails here.  Those bookkeeping commits are asynchronous (``synchronous_commit`` off: no
``fdatasync`` per job), the Store's other connections keep the server's synchronous commits.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from service.orchestration import scheduler, tasks
from service.settings import Settings
from workers.result import JobResult

SHA = "cd" * 20
MAX_STATEMENTS, MAX_COMMITS = 4, 2


class Counter:
    """Statements sent and commits made by a Store (all threads), resettable: a commit is a COMMIT or
    a writing statement sent in autocommit mode.  SQLAlchemy statements are counted with the engine's
    events, the job bookkeeping's psycopg statements by a cursor class set on each of its connections
    at checkout (``seen`` keeps those connections)."""

    def __init__(self, store: Any) -> None:
        self.statements: list[str] = []
        self.commits = 0
        self.seen: dict[int, psycopg.Connection[Any]] = {}
        self._lock = threading.Lock()
        sa.event.listen(store.engine, "before_cursor_execute", self._statement)
        sa.event.listen(store.engine, "commit", self._commit)
        counter = self

        class CountingCursor(psycopg.Cursor):  # type: ignore[type-arg]
            def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
                counter._sent(str(query), self.connection.autocommit)
                return super().execute(query, params, **kwargs)

        def checkout(dbapi_conn: Any, record: Any, proxy: Any) -> None:
            dbapi_conn.cursor_factory = CountingCursor
            with self._lock:
                self.seen[id(dbapi_conn)] = dbapi_conn

        sa.event.listen(store._bookkeeping_pool(), "checkout", checkout)

    def _statement(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        self._sent(statement, conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT")

    def _sent(self, statement: str, autocommit: bool) -> None:
        with self._lock:
            self.statements.append(" ".join(statement.split())[:120])
            # a writing statement in autocommit mode is a transaction (a commit) of its own
            if autocommit and not statement.lstrip().upper().startswith(("SELECT", "SET", "SHOW")):
                self.commits += 1

    def _commit(self, conn: Any) -> None:
        with self._lock:
            self.commits += 1

    def take(self) -> tuple[list[str], int]:
        with self._lock:
            out = (self.statements, self.commits)
            self.statements, self.commits = [], 0
            return out


@pytest.fixture
def worker(pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Settings, Counter]:
    settings = Settings(database_url=pg_url, cache_dir=tmp_path / "cache", data_dir=tmp_path / "data")
    store = scheduler.open_store(settings)

    def noop_run_cell(cell, revision, settings, options=None):  # the job body is not what is measured
        return JobResult(*cell, status="pass", revision=revision, message="noop")

    monkeypatch.setattr(tasks, "run_cell", noop_run_cell)
    return store, settings, Counter(store)


def _cells(n: int) -> list[tuple[str, str, str, str]]:
    return [(f"m{i}", "fp16", "default", "cpu") for i in range(n)]


def test_each_job_but_the_last_costs_at_most_4_statements_and_2_commits(worker) -> None:
    store, settings, counter = worker
    run_id = store.create_run(SHA, "push", cells=_cells(6), meta={"options": {}})
    jobs = store.jobs(run_id)
    counter.take()
    for job in jobs[:-1]:
        assert tasks.execute_job(job.id, settings, "w1", store=store) == "done"
        statements, commits = counter.take()
        assert statements, "no statement counted: the counter does not see the bookkeeping"
        assert len(statements) <= MAX_STATEMENTS, statements
        assert commits <= MAX_COMMITS, statements
        assert not any("regressions" in s for s in statements), statements  # no detection, no summary
    assert store.get_run(run_id).status == "running"
    counter.take()
    assert tasks.execute_job(jobs[-1].id, settings, "w1", store=store) == "done"
    statements, _ = counter.take()
    assert len(statements) > MAX_STATEMENTS  # the last job finishes the run (and detects) once
    assert store.get_run(run_id).status == "complete"
    assert [m["name"] for m in store.zoo_models()] == [c[0] for c in _cells(6)]  # recorded at the finish


def test_a_redelivered_finished_job_costs_one_statement(worker) -> None:
    store, settings, counter = worker
    run_id = store.create_run(SHA, "push", cells=_cells(2))
    job = store.jobs(run_id)[0]
    tasks.execute_job(job.id, settings, "w1", store=store)
    counter.take()
    assert tasks.execute_job(job.id, settings, "w2", store=store) == "done"
    statements, commits = counter.take()
    # the refused update, the row it read, and whether its run still has pending jobs
    assert 1 <= len(statements) <= 3 and commits <= 1, statements
    assert store.get_job(job.id).attempts == 1


def test_a_redelivery_finishes_a_run_whose_last_job_was_recorded_but_not_finished(worker) -> None:
    """A worker killed between the last result's commit and the run's finish: the redelivery of that job
    (its status final, nothing to run) finishes the run, or nobody would (seen in the compose stack)."""
    store, settings, _ = worker
    run_id = store.create_run(SHA, "push", cells=_cells(2))
    first, last = store.jobs(run_id)
    assert tasks.execute_job(first.id, settings, "w1", store=store) == "done"
    real = tasks.scheduler.finish_if_complete
    tasks.scheduler.finish_if_complete = lambda *a, **k: False  # the delivery dies before the finish
    try:
        assert tasks.execute_job(last.id, settings, "w1", store=store) == "done"
    finally:
        tasks.scheduler.finish_if_complete = real
    assert store.get_run(run_id).status == "running"
    assert tasks.execute_job(last.id, settings, "w2", store=store) == "done"  # the redelivery
    assert store.get_run(run_id).status == "complete"


def test_job_bookkeeping_commits_asynchronously_and_nothing_else_does(worker) -> None:
    """Per-job commits skip the fdatasync (synchronous_commit off on the bookkeeping connections only, see
    Store._bookkeeping); a run's finish and every other write keep the server's synchronous commit, and a
    job's end is visible to another session at once."""
    store, settings, counter = worker
    run_id = store.create_run(SHA, "push", cells=_cells(2))
    first, last = store.jobs(run_id)
    assert tasks.execute_job(first.id, settings, "w1", store=store) == "done"
    with store.transaction() as conn:  # another session (the Store's own pool) sees the end at once
        assert conn.execute(sa.text("SELECT status FROM jobs WHERE id = :i"), {"i": first.id}).scalar() == "done"
        assert conn.execute(sa.text("SHOW synchronous_commit")).scalar() == "on"
    assert counter.seen, "the job went through no bookkeeping connection"
    for pg in counter.seen.values():
        assert pg.execute("SHOW synchronous_commit").fetchone()[0] == "off"
    assert tasks.execute_job(last.id, settings, "w1", store=store) == "done"
    assert store.get_run(run_id).status == "complete"
    with psycopg.connect(store.engine.url.set(drivername="postgresql").render_as_string(hide_password=False),
                         autocommit=True) as fresh:
        assert fresh.execute("SELECT count(*) FROM results WHERE run_id = %s", (run_id,)).fetchone()[0] == 2


def test_workers_finishing_the_last_jobs_at_once_finish_the_run(worker) -> None:
    """The pending check reads after the commit, so of concurrent last jobs one always sees none left."""
    store, settings, _ = worker
    for _ in range(5):
        run_id = store.create_run(SHA, "push", cells=_cells(4))
        barrier = threading.Barrier(4)
        errors: list[BaseException] = []

        def deliver(job_id: int, barrier: threading.Barrier, errors: list[BaseException]) -> None:
            try:
                barrier.wait()
                tasks.execute_job(job_id, settings, f"w{job_id}", store=store)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=deliver, args=(j.id, barrier, errors)) for j in store.jobs(run_id)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors
        assert store.get_run(run_id).status == "complete"


def test_a_waiter_is_woken_by_the_end_of_a_job_of_its_run_only(worker) -> None:
    """Ending a job notifies its run on PostgreSQL (inside the job's own statement): the sweep CLI
    waiting on Celery wakes at once instead of sleeping between polls."""
    store, settings, counter = worker
    run_id = store.create_run(SHA, "push", cells=_cells(2))
    other = store.create_run("ef" * 20, "push", cells=_cells(1))
    with store.job_end_listener(run_id) as wait:
        assert wait is not None and wait(0.2) is False
        tasks.execute_job(store.jobs(other)[0].id, settings, "w1", store=store)
        assert wait(0.5) is False  # another run's job
        timer = threading.Timer(0.3, tasks.execute_job, args=(store.jobs(run_id)[0].id, settings, "w1"),
                                kwargs={"store": store})
        timer.start()
        assert wait(30) is True  # woken by the job's end (a wait that runs out answers False)
        timer.join()


def test_the_result_write_and_the_pending_read_share_one_round_trip_in_two_transactions(worker) -> None:
    """complete_job pipelines its write and its read (one round trip), with a Sync between them: the read
    is a transaction of its own, its snapshot taken after the write committed (what lets the last of
    several concurrent finishers see no job pending).  Without the Sync the two are one transaction."""
    from service.db.job_statements import pipeline_sync

    store, _, _ = worker
    with store._bookkeeping() as pg:
        with pg.pipeline() as pipeline:
            first = pg.execute("SELECT pg_current_xact_id()::text")
            pipeline_sync(pipeline)
            second = pg.execute("SELECT pg_current_xact_id()::text")
        a, b = first.fetchone(), second.fetchone()
        with pg.pipeline():
            third = pg.execute("SELECT pg_current_xact_id()::text")
            fourth = pg.execute("SELECT pg_current_xact_id()::text")
        c, d = third.fetchone(), fourth.fetchone()
    assert a != b
    assert c == d  # the control: the same pipeline without the Sync is one transaction
    calls: list[str] = []
    real = psycopg.Connection.pipeline

    def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append("pipeline")
        return real(self, *args, **kwargs)

    run_id = store.create_run(SHA, "push", cells=_cells(2))
    job = store.jobs(run_id)[0]
    psycopg.Connection.pipeline = counting  # type: ignore[method-assign]
    try:
        assert tasks.execute_job(job.id, worker[1], "w1", store=store) == "done"
    finally:
        psycopg.Connection.pipeline = real  # type: ignore[method-assign]
    assert calls == ["pipeline"]  # the result write and the pending read went out together
