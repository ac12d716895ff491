"""The Store's batch paths used by the webhook intake, on SQLite and PostgreSQL: bulk revision upserts,
runs created with their job rows, and the one-statement delivery intake with its state rules."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from service.db import Store
from service.db.deliveries import DeliveryWrite, Settlement
from service.db.records import RevisionRow, RunSpec
from service.errors import UserError
from tests.service.factories import migrated_store, sha

CELLS = (("m1", "fp16", "default", "cpu"), ("m2", "bf16", "default", "cpu"))


@pytest.fixture
def store(db_url: str) -> Store:
    s = migrated_store(db_url)
    yield s
    s.dispose()


def _statements(store: Store) -> list[str]:
    seen: list[str] = []
    sa.event.listen(store.engine, "before_cursor_execute",
                    lambda _c, _cur, stmt, _p, _ctx, _many: seen.append(stmt.split()[0].upper()))
    return seen


def test_upsert_revisions_merges_rows_and_matches_upsert_revision(store: Store) -> None:
    a, b, c = sha(1), sha(2), sha(3)
    store.upsert_revision(a, branch="main", author="A", message="first")
    seen = _statements(store)
    n = store.upsert_revisions([RevisionRow(b, (a,), "main", "B", "two"), RevisionRow(c, (b,), "main"),
                                RevisionRow(c, (), None, "C", "three"),   # merged: keeps parents, adds fields
                                RevisionRow(a, (), None, None, None)])    # Nones keep the stored fields
    assert n == 3
    assert seen.count("INSERT") == 2 and seen.count("DELETE") == 1  # revisions, parents (+ stale parents)
    assert (store.get_revision(a).author, store.get_revision(a).message, store.get_revision(a).parents) == \
        ("A", "first", ())
    got = store.get_revision(c)
    assert (got.parents, got.author, got.message, got.branch) == ((b,), "C", "three", "main")
    assert [s for s, _ in store.ancestors(c)] == [b, a]
    store.upsert_revisions([RevisionRow(c, (a,))])  # new parents replace the old links
    assert store.get_revision(c).parents == (a,) and [s for s, _ in store.ancestors(c)] == [a]
    with pytest.raises(UserError):
        store.upsert_revisions([RevisionRow("xyz")])


def test_create_runs_returns_job_rows_and_dedups_within_and_across_calls(store: Store) -> None:
    rev = sha(10)
    specs = [RunSpec(rev, "push", None, "smoke", CELLS, "k1", {"x": 1}),
             RunSpec(rev, "push", None, "smoke", CELLS + CELLS[:1], "k2"),   # repeated cell: one job
             RunSpec(rev, "push", None, "smoke", CELLS, "k1"),               # same key in this batch
             RunSpec(rev, "manual", None, "smoke", CELLS[:1], None)]         # no key: always new
    new = store.create_runs(specs)
    assert [n.created for n in new] == [True, True, False, True]
    assert new[2].run_id == new[0].run_id and new[2].jobs == new[0].jobs
    for n in new:
        assert [j.id for j in n.jobs] == [j.id for j in store.jobs(n.run_id)]
    assert len(new[1].jobs) == 2 and all(j.status == "queued" and j.attempts == 0 for j in new[1].jobs)
    again = store.create_runs([RunSpec(rev, "push", None, "smoke", CELLS, "k2")])
    assert (again[0].run_id, again[0].created, again[0].jobs) == (new[1].run_id, False, new[1].jobs)
    assert store.create_run_if_new(rev, "push", cells=CELLS, dedup_key="k1") == (new[0].run_id, False)
    single = store.create_run_with_jobs(sha(11), "push", cells=CELLS, dedup_key="k3")
    assert single.created and {j.cell for j in single.jobs} == set(CELLS)
    with pytest.raises(UserError):
        store.create_runs([RunSpec(rev, "sometimes")])
    assert len(store.list_runs()) == 4


def test_receive_deliveries_follows_the_state_rules(store: Store) -> None:
    payload = {"v": 1, "head": sha(5)}
    got = store.receive_deliveries([DeliveryWrite("p", "push", "pending", "push main", "o/r", payload),
                                    DeliveryWrite("r", "push", "rejected", "bad sha"),
                                    DeliveryWrite("p", "push", "pending", payload=payload)])  # copy in the batch
    assert [g.stored for g in got] == [True, True, False] and got[2].existing.status == "pending"
    assert not store.receive_delivery("p", "push", "rejected", reason="unsigned copy").stored  # pending stays
    assert store.get_delivery("p").reason == "push main"
    assert store.receive_delivery("r", "push", "pending", payload=payload).stored  # a rejected one is replaced
    assert store.count_pending_deliveries() == 2
    run_id = store.create_run(sha(5), "push", dedup_key="github:p")
    with store.transaction() as conn:
        pending = store.pending_deliveries(conn, 10)
        assert [p.delivery_id for p in pending] == ["p", "r"] and pending[0].payload == payload
        assert store.settle_deliveries(conn, [Settlement("p", "accepted", "push main", run_id),
                                              Settlement("r", "rejected", "unknown sweep"),
                                              Settlement("gone", "accepted")]) == 2
    assert (store.get_delivery("p").status, store.get_delivery("p").run_id) == ("accepted", run_id)
    assert store.count_pending_deliveries() == 0
    dup = store.receive_delivery("p", "push", "pending", payload=payload)
    assert not dup.stored and dup.existing.run_id == run_id  # a late copy learns the run
    with store.transaction() as conn:  # settled rows do not change again
        assert store.settle_deliveries(conn, [Settlement("p", "rejected", "late")]) == 0
    with pytest.raises(UserError):
        store.receive_delivery("x", "push", "maybe")
