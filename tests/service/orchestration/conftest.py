"""Fixtures shared by the orchestration tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from service.db import Store
from tests.service.factories import migrated_store


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    """A store on a fresh database at schema head (SQLite and PostgreSQL, as ``db_url``); disposed after."""
    s = migrated_store(db_url)
    yield s
    s.dispose()
