"""The plain function behind the Celery task, called without a broker, on SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from service.orchestration import scheduler, tasks
from service.settings import Settings
from workers.result import JobResult

SHA = "ab" * 20


@pytest.fixture
def setup(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Settings, list[Any]]:
    settings = Settings(database_url=db_url, cache_dir=tmp_path / "cache", data_dir=tmp_path / "data",
                        max_attempts=2)
    store = scheduler.open_store(settings)
    calls: list[Any] = []

    def fake_run_cell(cell, revision, settings, options=None):  # the job itself is tested elsewhere
        calls.append((cell, revision, options))
        return JobResult(*cell, status="pass", revision=revision, message="ran")

    monkeypatch.setattr(tasks, "run_cell", fake_run_cell)
    return store, settings, calls


def _run(store: Any, cells: list[tuple[str, str, str, str]]) -> int:
    meta = {"options": {"|".join(c): {"repeats": 4, "timeout": None, "zoo": None} for c in cells}}
    return store.create_run(SHA, "manual", None, "t", cells, None, meta)


def test_delivery_records_once_and_finishes_the_run(setup) -> None:
    store, settings, calls = setup
    run_id = _run(store, [("m1", "fp16", "default", "cpu"), ("m2", "bf16", "default", "cpu")])
    j1, j2 = store.jobs(run_id)
    assert tasks.execute_job(j1.id, settings, "w1", store=store) == "done"
    assert store.get_run(run_id).finished_at is None
    assert tasks.execute_job(j2.id, settings, "w1", store=store) == "done"
    assert calls[0] == (("m1", "fp16", "default", "cpu"), SHA, {"repeats": 4, "timeout": None, "zoo": None})
    assert store.get_run(run_id).status == "complete"
    # a redelivery of a finished job (e.g. after a lost ack) does nothing
    assert tasks.execute_job(j1.id, settings, "w2", store=store) == "done"
    assert len(calls) == 2 and store.get_job(j1.id).attempts == 1
    assert len(store.results(run_id=run_id)) == 2


def test_poison_job_is_crashed_after_max_attempts(setup) -> None:
    store, settings, calls = setup
    run_id = _run(store, [("bad", "fp16", "default", "cpu")])
    (job,) = store.jobs(run_id)
    for n in range(settings.max_attempts):  # deliveries whose worker died: counted, never finished
        assert store.start_attempt(job.id, f"dead{n}") == n + 1
    assert tasks.execute_job(job.id, settings, "w", store=store) == "crashed"
    assert calls == []
    job = store.get_job(job.id)
    assert job.status == "crashed" and job.attempts == settings.max_attempts + 1
    (result,) = store.results(run_id=run_id)
    assert result.status == "crashed" and "2 attempts" in (result.message or "")
    assert store.get_run(run_id).status == "failed"


def test_worker_config_applies_sweep_options() -> None:
    base = Settings(job_timeout=100.0, convert_timeout=90.0, latency_runs=20).worker_config()
    s = base.for_cell({"repeats": 3, "timeout": 500.0})
    assert s.latency_runs == 3 and s.convert_timeout == 100.0
    assert base.for_cell(None) is base
    assert base.for_cell({"timeout": 30.0}).convert_timeout == 30.0


def test_run_cell_turns_a_bad_revision_into_a_result(tmp_path: Path) -> None:
    settings = Settings(cache_dir=tmp_path / "cache", pass_repo=str(tmp_path / "missing"))
    result = tasks.run_cell(("m", "fp16", "default", "cpu"), "not-a-sha", settings)
    assert result.status == "bad_spec" and "revision" in result.message


@pytest.mark.parametrize("status", ["pass", "convert_error", "fail_accuracy", "crashed", "timeout"])
def test_the_result_keeps_its_own_status_and_the_job_ends(db_url: str, tmp_path: Path, status: str) -> None:
    """Store.begin_job/complete_job (the worker path) store the result's status, not the job's."""
    from service.db.store import Store

    store = Store.from_url(db_url)
    store.upgrade()
    run_id = store.create_run(SHA, "manual", cells=[("m1", "fp16", "default", "cpu")])
    (job,) = store.jobs(run_id)
    start = store.begin_job(job.id, "w")
    assert store.complete_job(start.run, job.id, JobResult(*job.cell, status=status, revision=SHA,
                                                           message="why")) is False
    (row,) = store.results(run_id=run_id)
    assert row.status == status and store.get_result(row.id).status == status
    assert store.get_job(job.id).status == ("crashed" if status == "crashed" else "done")
