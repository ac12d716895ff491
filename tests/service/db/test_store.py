"""The Store API on SQLite and PostgreSQL: revisions, runs, jobs, idempotent results, deliveries."""

from __future__ import annotations

import pytest

from service.db import Store
from service.errors import DatabaseUnavailableError, NotFoundError, UserError
from service.orchestration.judge import detect_run
from tests.service.factories import CELL, chain, make_result, migrated_store, sha


@pytest.fixture
def store(db_url: str) -> Store:
    s = migrated_store(db_url)
    yield s
    s.dispose()


def test_revisions_upsert_keeps_known_fields_and_walks_ancestry(store: Store) -> None:
    shas = chain(store, 5)
    store.upsert_revision(shas[4], parents=[shas[3]])  # partial info keeps branch/author/message
    rev = store.get_revision(shas[4][:10])
    assert (rev.branch, rev.message, rev.parents) == ("main", "commit 4", (shas[3],))
    assert rev.committed_at is not None and rev.committed_at.tzinfo is not None
    assert store.ancestors(shas[4]) == [(shas[3], 1), (shas[2], 2), (shas[1], 3), (shas[0], 4)]
    assert store.ancestors(shas[4], max_depth=2, include_self=True) == [(shas[4], 0), (shas[3], 1), (shas[2], 2)]
    assert store.first_parent_path(shas[4], shas[1]) == shas[1:]


def test_merge_commit_ancestry_takes_nearest_depth(store: Store) -> None:
    main = chain(store, 3)
    side = sha(100)
    store.upsert_revision(side, [main[0]], "feature")
    merge = sha(101)
    store.upsert_revision(merge, [main[2], side], "main")
    anc = dict(store.ancestors(merge))
    assert anc == {main[2]: 1, side: 1, main[1]: 2, main[0]: 2}


def test_revision_prefixes(store: Store) -> None:
    store.upsert_revision("abcd1" + "0" * 35)
    store.upsert_revision("abcd2" + "0" * 35)
    assert store.resolve_revision("ABCD1") == "abcd1" + "0" * 35
    with pytest.raises(UserError, match="ambiguous: abcd10000000, abcd20000000"):
        store.resolve_revision("abcd")
    with pytest.raises(NotFoundError, match="unknown revision ffff"):
        store.resolve_revision("ffff")
    for bad in ("abc", "zz-top", ""):
        with pytest.raises(UserError, match="not a revision"):
            store.resolve_revision(bad)
    with pytest.raises(UserError, match="not a git sha"):
        store.upsert_revision("xyz")


def test_create_run_dedup_and_jobs(store: Store) -> None:
    (rev,) = chain(store, 1)
    cells = [CELL, ("other", "bf16", "default", "cpu"), CELL]  # duplicate cell collapses
    run_id, created = store.create_run_if_new(rev, "nightly", sweep="full", cells=cells,
                                              dedup_key="nightly:2026-11-29:full")
    assert created
    again, created2 = store.create_run_if_new(rev, "nightly", sweep="full", cells=cells,
                                              dedup_key="nightly:2026-11-29:full")
    assert (again, created2) == (run_id, False)
    assert store.create_run(rev, "nightly", cells=cells, dedup_key="nightly:2026-11-29:full") == run_id
    assert store.find_run("nightly:2026-11-29:full").id == run_id
    jobs = store.jobs(run_id)
    assert [j.cell for j in jobs] == sorted({CELL, ("other", "bf16", "default", "cpu")})
    assert {j.status for j in jobs} == {"queued"} and len(store.list_runs()) == 1
    # runs without a dedup key never collide
    assert store.create_run(rev, "manual") != store.create_run(rev, "manual")
    # an unknown revision is recorded bare
    bare = store.create_run("f" * 40, "manual", cells=[CELL])
    assert store.get_revision("f" * 40).parents == () and store.get_run(bare).status == "queued"
    with pytest.raises(UserError, match="unknown trigger"):
        store.create_run(rev, "cron")
    with pytest.raises(UserError, match="a cell is"):
        store.create_run(rev, "manual", cells=[("m", "fp16", "")])


def test_attempts_jobs_and_run_status(store: Store) -> None:
    (rev,) = chain(store, 1)
    run_id = store.create_run(rev, "push", cells=[CELL, ("b", "fp16", "default", "cpu"),
                                                  ("c", "fp16", "default", "cpu")])
    by_cell = {j.cell: j for j in store.jobs(run_id)}
    a, b, c = by_cell[CELL], by_cell[("b", "fp16", "default", "cpu")], by_cell[("c", "fp16", "default", "cpu")]
    assert store.finish_run(run_id).status == "queued"
    assert [store.start_attempt(a.id, "w1"), store.start_attempt(a.id, "w2")] == [1, 2]
    assert store.get_job(a.id).worker == "w2" and store.get_job(a.id).status == "running"
    assert store.get_run(run_id).status == "running"
    assert store.finish_run(run_id).status == "running" and store.get_run(run_id).finished_at is None
    store.write_result(run_id, make_result(CELL))
    done = store.get_job(a.id)
    assert done.status == "done" and done.finished_at is not None
    assert store.start_attempt(a.id, "w3") == 3 and store.get_job(a.id).status == "done"  # redelivery only counts
    store.mark_job(b.id, "crashed", "worker died 3 times")
    store.mark_job(c.id, "error", "no GPU")
    run = store.finish_run(run_id)
    assert run.status == "partial" and run.finished_at is not None
    summary = store.run_summary(run_id)
    assert summary.job_status == {"done": 1, "crashed": 1, "error": 1}
    assert summary.describe() == "3 cells: 1 pass"
    assert store.get_job(b.id).error == "worker died 3 times"
    with pytest.raises(UserError, match="unknown job status"):
        store.mark_job(b.id, "exploded")
    with pytest.raises(NotFoundError):
        store.start_attempt(10_000, "w")
    with pytest.raises(NotFoundError):
        store.mark_job(10_000, "done")


@pytest.mark.parametrize(("statuses", "expected"), [
    (["done", "done"], "complete"), (["cancelled", "cancelled"], "cancelled"),
    (["error", "crashed"], "failed"), (["done", "cancelled"], "partial"), ([], "complete")])
def test_finish_run_derivation(store: Store, statuses: list[str], expected: str) -> None:
    (rev,) = chain(store, 1)
    run_id = store.create_run(rev, "manual", cells=[(f"m{i}", "fp16", "default", "cpu") for i in range(len(statuses))])
    for job, st in zip(store.jobs(run_id), statuses, strict=True):
        store.mark_job(job.id, st)
    assert store.finish_run(run_id).status == expected
    assert store.finish_run(run_id).status == expected  # idempotent


def test_write_result_is_idempotent_and_updates_in_place(store: Store) -> None:
    (rev,) = chain(store, 1)
    run_id = store.create_run(rev, "push", cells=[CELL])
    first = store.write_result(run_id, make_result(status="fail_accuracy", max_abs=0.5))
    second = store.write_result(run_id, make_result(max_abs=2e-3))
    assert first == second
    rows = store.results(run_id=run_id)
    assert len(rows) == 1 and (rows[0].status, rows[0].max_abs) == ("pass", 2e-3)
    full = store.get_result(first)
    assert full == make_result(max_abs=2e-3)  # the complete JobResult round-trips, samples included
    assert len(full.latency.samples_ms) == 20
    row = rows[0]
    assert row.env_fingerprint == "env-a" and row.casts_inserted == 4 and row.error_ratio == pytest.approx(2000)
    assert [m["name"] for m in store.zoo_models()] == ["tiny_mlp"]


def test_nan_errors_are_stored_as_inf(store: Store) -> None:
    (rev,) = chain(store, 1)
    run_id = store.create_run(rev, "push", cells=[CELL])
    store.write_result(run_id, make_result(status="fail_accuracy", max_abs=float("nan"), cosine=float("nan")))
    (row,) = store.results(run_id=run_id)
    assert row.max_abs == float("inf") and row.cosine is None


def test_results_filters_and_latest_per_revision(store: Store) -> None:
    (rev,) = chain(store, 1)
    other = ("other", "bf16", "default", "cpu")
    r1 = store.create_run(rev, "push", cells=[CELL, other])
    store.write_result(r1, make_result(CELL, max_abs=1e-3))
    store.write_result(r1, make_result(other, status="convert_error"))
    r2 = store.create_run(rev, "nightly", cells=[CELL])
    store.write_result(r2, make_result(CELL, max_abs=7e-3))
    latest = store.results(revision=rev[:8])
    assert [(r.model, r.run_id) for r in latest] == [("other", r1), ("tiny_mlp", r2)]
    assert len(store.results(revision=rev, latest_only=False)) == 3
    assert [r.model for r in store.results(status="convert_error")] == ["other"]
    assert [r.run_id for r in store.results(model="tiny_mlp", dtype="fp16")] == [r2, r1]
    with pytest.raises(NotFoundError, match="unknown model"):
        store.results(model="nope")
    with pytest.raises(NotFoundError):
        store.results(run_id=999)


def test_webhook_deliveries(store: Store) -> None:
    (rev,) = chain(store, 1)
    assert store.record_delivery("d-1", "push", "accepted", repository="o/r")
    assert not store.record_delivery("d-1", "push", "accepted")
    run_id = store.create_run(rev, "push", dedup_key="delivery:d-1")
    got = store.update_delivery("d-1", run_id=run_id, reason="queued 4 jobs")
    assert (got.status, got.run_id, got.reason, got.repository) == ("accepted", run_id, "queued 4 jobs", "o/r")
    assert store.get_delivery("nope") is None
    with pytest.raises(NotFoundError):
        store.update_delivery("nope", status="rejected")
    with pytest.raises(UserError):
        store.record_delivery("d-2", "push", "maybe")


def test_unknown_ids(store: Store) -> None:
    for call in (lambda: store.get_run(5), lambda: store.jobs(5), lambda: store.get_job(5),
                 lambda: store.get_result(5), lambda: store.get_regression(5), lambda: store.ack(5),
                 lambda: store.finish_run(5), lambda: store.run_summary(5), lambda: store.write_result(5, make_result()),
                 lambda: detect_run(store, 5)):
        with pytest.raises(NotFoundError):
            call()


def test_unreachable_database_is_redacted() -> None:
    store = Store.from_url("postgresql+psycopg://u:s3cretpw@127.0.0.1:1/x")
    with pytest.raises(DatabaseUnavailableError) as exc:
        store.list_runs()
    assert "s3cretpw" not in str(exc.value) and "u:***@127.0.0.1:1/x" in str(exc.value)
    assert exc.value.exit_code == 3


@pytest.mark.parametrize(("url", "message"), [("not a url", "not a database URL"),
                                              ("mysql+nodriver://u:pw@h/db", "cannot use database URL")])
def test_bad_database_urls_are_config_errors(url: str, message: str) -> None:
    from service.errors import ConfigError

    with pytest.raises(ConfigError, match=message) as exc:
        Store.from_url(url)
    assert "pw" not in str(exc.value)


def test_plain_postgresql_url_uses_psycopg(pg_url: str) -> None:
    plain = pg_url.replace("postgresql+psycopg://", "postgresql://")
    store = migrated_store(plain)
    assert store.engine.url.drivername == "postgresql+psycopg" and store.list_runs() == []
    store.dispose()
