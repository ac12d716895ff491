"""The faster paths of regression detection give the findings the plain ones give, on SQLite and PostgreSQL:
result documents read as text and parsed in Python, baseline pools taken from the rows the baseline search
already fetched, the flaky lineage read (on the run's branch) only for cells with a finding, and stale findings
deleted by one statement or, for a very large run, by ids selected first."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from service.db import Store, findings, series
from service.db.series import SAMPLE_COLS, t_res
from service.orchestration import judge
from service.orchestration.judge import detect_run
from service.regressions import detect
from service.regressions.stored import StoredResult, sample, sample_doc
from service.regressions.thresholds import Thresholds
from tests.service.factories import CELL, chain, make_result, run_with

OTHER = ("other", "bf16", "default", "cpu")


def stored_row(store: Store, result_id: int, data: object | None = None, summary: bool = False) -> StoredResult:
    """The stored result (as detection reads it) of a result, after replacing its stored document with ``data``
    when given: stored without a sample summary (as before migration 0012), or with its summary (``summary``)."""
    with store.transaction() as conn:
        if data is not None:
            conn.execute(t_res.update().where(t_res.c.id == result_id).values(
                data=data, sample_doc=sample_doc(data) if summary else None))  # type: ignore[arg-type]
        return series.stored(conn.execute(sa.select(*SAMPLE_COLS).where(t_res.c.id == result_id)).one())


def test_sample_reads_the_stored_document_as_the_json_paths_read_it(store: Store) -> None:
    (rev,) = chain(store, 1)
    result = make_result(latency_ms=2.0, samples=6, seed=3)
    run = run_with(store, rev, [result], detect=False)
    (res,) = store.results(run_id=run)
    got = sample(stored_row(store, res.id))
    assert got.latency_samples == tuple(result.latency.samples_ms)  # type: ignore[union-attr]
    assert got.fp32_latency_samples == tuple(result.latency.fp32_samples_ms)  # type: ignore[union-attr]
    assert (got.status, got.max_abs, got.env_fingerprint, got.casts_inserted) == ("pass", 1e-3, "env-a", 4)
    assert (got.compute_low, got.compute_nodes, got.error_unit) == (9, 10, "absolute")  # no convergence: legacy

    odd = {"latency": {"samples_ms": [1.5, 2, True, "3", None, 4.25], "fp32_samples_ms": "not a list",
                       "fp32_cpu_samples_ms": [0.5, 0.25]},
           "graph": {"source": "measured", "compute_low": 3.0, "compute_nodes": False, "compute_ops_version": 2,
                     "convert_samples_s": [0.2, 0.3], "pass_iterations": 4, "pass_converged": 1},
           "convergence": {"error_unit": "relative"}}
    got = sample(stored_row(store, res.id, odd))
    assert got == sample(stored_row(store, res.id, odd, summary=True))  # its summary reads the same
    assert got.latency_samples == (1.5, 2.0, 4.25)  # booleans, strings and nulls skipped, ints as floats
    assert (got.fp32_latency_samples, got.cpu_latency_samples, got.fp32_cpu_latency_samples) == ((), (), (0.5, 0.25))
    assert (got.compute_low, got.compute_nodes, got.compute_ops_version) == (3, None, "2")
    assert (got.convert_samples, got.convert_reference, got.pass_iterations, got.pass_converged) == ((0.2, 0.3), (), 4,
                                                                                                   None)
    assert got.error_unit == "relative"

    # a step that is not an object reads as a missing key, and the pass's own graph report gives no counts
    for doc in ({"latency": None, "graph": "measured", "convergence": [1]},
                {"latency": [1.0], "graph": {"source": "pass", "compute_low": 3, "compute_nodes": 4}}):
        got = sample(stored_row(store, res.id, doc))
        assert got == sample(stored_row(store, res.id, doc, summary=True))
        assert (got.latency_samples, got.fp32_latency_samples, got.compute_low, got.compute_nodes) == ((), (), None, None)
        assert got.error_unit == "absolute"


def test_pools_come_from_the_baseline_search_as_a_pool_query_finds_them(store: Store) -> None:
    base_rev, rev = chain(store, 2)
    for seed, env in ((1, "env-a"), (2, "env-a"), (3, "env-b"), (4, "env-a")):  # the last one is the baseline
        run_with(store, base_rev, [make_result(latency_ms=2.0, env=env, seed=seed), make_result(OTHER, seed=seed)],
                 detect=False)
    run = run_with(store, rev, [make_result(latency_ms=4.0, env="env-a", seed=9), make_result(OTHER, seed=9)],
                   detect=False)
    th = Thresholds(latency_pool=3)
    (reg,) = detect_run(store, run, th)
    # the baseline and the two newest other results of its revision: env-b is not pooled, the oldest not reached
    assert (reg.kind, reg.category) == ("latency", "regression") and "n=40/20" in reg.detail
    with store.transaction() as conn:
        run_row = store.run_row(conn, run)
        base, at_base = judge._baselines(conn, run_row, [CELL, OTHER], th)
        from_search = detect.pools_from_fetched(base, at_base, th.latency_pool)
        queried = {c: [sample(r) for r in rs]  # the nightly path's query
                   for c, rs in series.baseline_pools(conn, run_id=run, base=base, limit=th.latency_pool).items()}
    assert set(from_search) == set(queried) == {CELL, OTHER}
    assert from_search == queried
    assert [s.env_fingerprint for s in from_search[CELL]] == ["env-b", "env-a"]


def test_the_flaky_lineage_is_the_runs_branch_and_counts_for_each_cell_with_a_finding(store: Store) -> None:
    main = chain(store, 8)
    feature = chain(store, 6, branch="feature", start=100)
    for i in range(6):
        # on main, CELL always passes and OTHER flips; on the feature branch CELL flips
        run_with(store, main[i], [make_result(CELL, seed=i),
                                  make_result(OTHER, status=("pass", "fail_accuracy")[i % 2], seed=i)])
        run_with(store, feature[i], [make_result(CELL, status=("pass", "fail_accuracy")[i % 2], seed=i)])
    run = run_with(store, main[6], [make_result(CELL, max_abs=0.5, seed=7), make_result(OTHER, max_abs=0.5, seed=7)],
                   detect=False)
    got = {(r.model, r.kind): r.category for r in detect_run(store, run)}
    assert got == {("tiny_mlp", "accuracy"): "regression", ("other", "accuracy"): "flaky"}
    # a revision on no branch reads the lineage of every branch: the feature branch's flips make CELL flaky
    store.upsert_revision("f" * 40, [main[5]], None, "dev", "detached")
    run = run_with(store, "f" * 40, [make_result(CELL, max_abs=0.5, seed=8)], detect=False)
    assert [(r.kind, r.category) for r in detect_run(store, run)] == [("accuracy", "flaky")]


@pytest.mark.parametrize("keys_max", [findings.DELETE_KEYS_MAX, 0], ids=["one-delete", "select-then-delete"])
def test_stale_findings_go_and_triaged_ones_stay_by_either_delete(store: Store, monkeypatch: pytest.MonkeyPatch,
                                                                  keys_max: int) -> None:
    monkeypatch.setattr(findings, "DELETE_KEYS_MAX", keys_max)
    base_rev, rev = chain(store, 2)
    run_with(store, base_rev, [make_result(CELL), make_result(OTHER)])
    run = run_with(store, rev, [make_result(CELL, max_abs=0.5, casts=9), make_result(OTHER, max_abs=0.5)],
                   trigger="manual")
    first = {(r.model, r.kind): r for r in store.regressions(run_id=run)}
    assert set(first) == {("tiny_mlp", "accuracy"), ("tiny_mlp", "coverage"), ("other", "accuracy")}
    store.ack(first["tiny_mlp", "coverage"].id, by="alice")
    store.write_result(run, make_result(CELL, max_abs=1e-3, casts=4))  # CELL no longer regresses at all
    again = {(r.model, r.kind): (r.id, r.state) for r in detect_run(store, run)}
    assert again == {("tiny_mlp", "coverage"): (first["tiny_mlp", "coverage"].id, "acknowledged"),
                     ("other", "accuracy"): (first["other", "accuracy"].id, "open")}
    store.write_result(run, make_result(OTHER, max_abs=1e-3))
    assert [(r.model, r.kind, r.state) for r in detect_run(store, run)] == [("tiny_mlp", "coverage", "acknowledged")]


def test_the_findings_returned_are_those_stored(store: Store) -> None:
    base_rev, rev = chain(store, 2)
    run_with(store, base_rev, [make_result(CELL), make_result(OTHER)])
    run = run_with(store, rev, [make_result(CELL, max_abs=0.5), make_result(OTHER, status="convert_error")],
                   detect=False)
    returned = detect_run(store, run)  # read in the transaction that stored them
    assert returned == store.regressions(run_id=run)
    assert sorted((r.model, r.kind) for r in returned) == [("other", "conversion"), ("tiny_mlp", "accuracy")]
