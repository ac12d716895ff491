"""``Store.get_runs``: many runs by id in one query (the reporter's watch reads every watched run with it)."""

from __future__ import annotations

import sqlalchemy as sa

from tests.service.factories import CELL, chain, migrated_store


def test_runs_by_id_in_one_query_unknown_ids_absent(db_url: str) -> None:
    store = migrated_store(db_url)
    shas = chain(store, 3)
    ids = [store.create_run(s, "push", cells=[CELL]) for s in shas]
    statements: list[str] = []
    sa.event.listen(store.engine, "before_cursor_execute",
                    lambda _c, _cur, statement, *_a: statements.append(statement))
    got = store.get_runs([ids[2], ids[0], 10_000, ids[0]])
    assert sorted(got) == sorted([ids[0], ids[2]])
    assert got[ids[2]].revision_sha == shas[2] and got[ids[0]].revision_sha == shas[0]
    assert len([s for s in statements if s.lstrip().upper().startswith("SELECT")]) == 1
    assert store.get_runs([]) == {}
