"""The pin that applies to a revision's branch, read in one statement (:func:`service.db.pins.pin_for_revision`):
the same answer as :func:`service.db.pins.pin_for` of the revision's recorded branch, on real stores (SQLite and
PostgreSQL) -- the branch's own pin before every branch's, every branch's for a revision without a branch or an
unknown one, None without a pin."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from service.db import Store, pins
from service.db.models import Revision
from tests.service.factories import chain, migrated_store


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    """A store on a fresh database at schema head (SQLite and PostgreSQL, as ``db_url``); disposed after."""
    s = migrated_store(db_url)
    yield s
    s.dispose()


def _branch(conn: sa.Connection, sha: str) -> str | None:
    return conn.execute(sa.select(Revision.__table__.c.branch).where(Revision.__table__.c.sha == sha)).scalar()


def test_the_revision_s_pin_is_the_pin_of_its_branch(store: Store) -> None:
    main = chain(store, 3)
    feature = chain(store, 2, branch="feature", start=10)
    loose = chain(store, 1, branch="", start=20)
    unknown = "f" * 40
    cases = [*main, *feature, *loose, unknown]
    expected_states: list[dict[str, str | None]] = []
    for step in ("none", "global", "feature", "unpin global"):
        with store.transaction() as conn:
            if step == "global":
                pins.pin(conn, branch="", sha=main[0], now=store.clock())
            elif step == "feature":
                pins.pin(conn, branch="feature", sha=feature[0], now=store.clock())
            elif step == "unpin global":
                pins.unpin(conn, branch="")
            got = {s: pins.pin_for_revision(conn, sha=s) for s in cases}
        want: dict[str, str | None] = {}
        for s in cases:
            with store.transaction() as conn:
                want[s] = pins.pin_for(conn, branch=_branch(conn, s))
        assert got == want, step
        expected_states.append(got)
    assert expected_states[0] == dict.fromkeys(cases)
    assert expected_states[1] == dict.fromkeys(cases, main[0])
    assert expected_states[2] == {**dict.fromkeys(cases, main[0]), **dict.fromkeys(feature, feature[0])}
    assert expected_states[3] == {**dict.fromkeys(cases), **dict.fromkeys(feature, feature[0])}
