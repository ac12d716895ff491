"""AMPCI_DB_POOL_SIZE / AMPCI_DB_MAX_OVERFLOW / AMPCI_LOCAL_WORKERS: parsed, passed to every engine the
service builds from settings, and a pool that is exhausted is a DatabaseUnavailableError (503), never
one more connection."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from service.db.engine import connect, make_engine
from service.errors import ConfigError, DatabaseUnavailableError
from service.settings import Settings


def test_settings_parse_the_bounds() -> None:
    s = Settings.from_env({"AMPCI_DB_POOL_SIZE": "3", "AMPCI_DB_MAX_OVERFLOW": "0", "AMPCI_LOCAL_WORKERS": "2"})
    assert s.db_pool() == {"pool_size": 3, "max_overflow": 0} and s.local_workers == 2
    assert Settings.from_env({}).db_pool() == {"pool_size": 5, "max_overflow": 10}
    for bad in ({"AMPCI_DB_POOL_SIZE": "0"}, {"AMPCI_DB_POOL_SIZE": "x"}, {"AMPCI_DB_MAX_OVERFLOW": "-1"}):
        with pytest.raises(ConfigError):
            Settings.from_env(bad)


def test_engines_built_from_settings_hold_the_bound(pg_url: str) -> None:
    from service.orchestration.jobs import open_store

    store = open_store(Settings(database_url=pg_url, **{"db_pool_size": 1, "db_max_overflow": 1}))
    try:
        assert store.engine.pool.size() == 1
        held = [connect(store.engine), connect(store.engine)]  # pool 1 + overflow 1
        store.engine.pool._timeout = 0.2  # noqa: SLF001 - do not wait 30 s for the third
        with pytest.raises(DatabaseUnavailableError, match="every connection this process may open is in use"):
            connect(store.engine)
        for c in held:
            c.close()
        with connect(store.engine) as c:
            assert c.execute(sa.text("select 1")).scalar_one() == 1
    finally:
        store.dispose()


def test_sqlite_ignores_the_pool_bounds(sqlite_url: str) -> None:
    engine = make_engine(sqlite_url, pool_size=1, max_overflow=0)
    with engine.connect() as c:
        assert c.execute(sa.text("select 1")).scalar_one() == 1
    engine.dispose()
