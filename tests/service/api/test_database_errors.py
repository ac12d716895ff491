"""Database errors are told apart through ``service.db.errors`` alone (the floors above ``db`` import no
sqlalchemy): real failures of a real PostgreSQL — a value it refuses, a server that is not there — are
answered 400 / 503 by the API's error handlers and classified "refuse" / "retry" by the webhook intake."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi import FastAPI
from fastapi.testclient import TestClient

from service.api.errors import install_error_handlers
from service.db.engine import make_engine
from service.db.errors import is_database_down
from service.errors import DatabaseUnavailableError
from service.github.intake import is_infrastructure, is_permanent

DEAD_URL = "postgresql+psycopg://postgres@127.0.0.1:1/down"


def _refused_value(engine: sa.Engine) -> None:
    with engine.connect() as conn:  # PostgreSQL text cannot hold a NUL byte
        conn.execute(sa.text("SELECT CAST(:v AS text)"), {"v": "a\x00b"})


def _unreachable() -> None:
    make_engine(DEAD_URL).connect()


def _raised(action: Any, *args: Any) -> BaseException:
    with pytest.raises(Exception) as info:  # noqa: PT011 - whatever the driver raises is the point
        action(*args)
    return info.value


@pytest.fixture
def client(store: Any) -> Iterator[TestClient]:
    app = FastAPI()
    install_error_handlers(app)
    app.get("/refused")(lambda: _refused_value(store.engine))
    app.get("/down")(_unreachable)
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def test_the_api_answers_a_refused_value_400_and_an_unreachable_database_503(client: TestClient) -> None:
    refused = client.get("/refused")
    assert refused.status_code == 400 and refused.json()["error"] == "bad_request"
    assert refused.json()["message"].startswith("a value in the request cannot be stored or compared: ")
    down = client.get("/down")
    assert down.status_code == 503 and down.json() == {"error": "unavailable",
                                                        "message": "database unavailable or overloaded; try again"}


def test_the_intake_retries_a_database_outage_and_refuses_a_value(store: Any) -> None:
    down, refused = _raised(_unreachable), _raised(_refused_value, store.engine)
    assert is_database_down(down) and is_infrastructure(down) and not is_permanent(down)
    assert not is_database_down(refused) and not is_infrastructure(refused) and is_permanent(refused)
    unavailable = DatabaseUnavailableError("database unavailable at postgresql://…")
    assert is_database_down(unavailable) and is_infrastructure(unavailable)
    assert not is_database_down(ValueError("x"))
