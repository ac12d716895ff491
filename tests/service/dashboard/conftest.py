"""Fixtures of the dashboard tests: a PostgreSQL database seeded through the real store code (shared
by the read-only tests of a module), the app in-process (TestClient) or as a real uvicorn server."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from tests.conftest import fresh_pg_database
from tests.service.dashboard.seed import Seeded, seed

TOKEN = "dashboard-test-token"
SECRET = "dashboard-test-secret"
REPO_ROOT = Path(__file__).resolve().parents[3]
T = TypeVar("T")
#: What a browser sends; without HTML in Accept, /runs/{id} redirects to the JSON API.
BROWSER = {"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}


@contextmanager
def seeded_database(seed_with: Callable[[Any], T]) -> Iterator[tuple[str, Any, T]]:
    """(url, store, what ``seed_with(store)`` returned) of a fresh, migrated PostgreSQL database; the store
    is disposed and the database dropped on exit."""
    from service.db import Store

    for url in fresh_pg_database():
        store = Store.from_url(url)
        store.upgrade()
        try:
            yield url, store, seed_with(store)
        finally:
            store.dispose()


@contextmanager
def served(url: str, **env: str) -> Iterator[str]:
    """The base URL of the service over database ``url`` started as a subprocess (:func:`start_server`),
    stopped by its pid on exit."""
    proc, base = start_server(url, **env)
    try:
        yield base
    finally:
        stop_server(proc)


@pytest.fixture(scope="module")
def seeded_db() -> Iterator[tuple[str, Any, Seeded]]:
    """(url, store, seeded) of a fresh PostgreSQL database holding the scenario of ``seed.py``."""
    with seeded_database(seed) as world:
        yield world


def make_app(store: Any, url: str, **overrides: Any) -> Any:
    """``create_app`` over ``store`` with the dashboard mounted and no background threads."""
    from service.api.app import create_app
    from service.dashboard import dashboard_router
    from service.settings import Settings

    fields: dict[str, Any] = dict(database_url=url, webhook_secret=SECRET, api_token=TOKEN)
    fields.update(overrides)
    return create_app(Settings(**fields), store=store, dashboard=dashboard_router(), background=False)


@pytest.fixture(scope="module")
def client(seeded_db: tuple[str, Any, Seeded]) -> Iterator[Any]:
    """A TestClient of the app over the module's seeded database."""
    from fastapi.testclient import TestClient

    url, store, _ = seeded_db
    with TestClient(make_app(store, url), raise_server_exceptions=False, headers=BROWSER) as c:
        yield c


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(url: str, **env: str) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``tests.service.dashboard.server`` on a free loopback port; return (process, base URL) once it answers."""
    port = free_port()
    environ = {**os.environ, "AMPCI_DATABASE_URL": url, "AMPCI_WEBHOOK_SECRET": SECRET, "AMPCI_API_TOKEN": TOKEN,
               "AMPCI_BROKER_URL": "", **env}
    proc = subprocess.Popen([sys.executable, "-m", "tests.service.dashboard.server", str(port)], cwd=REPO_ROOT, env=environ,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
            raise RuntimeError(f"dashboard server exited with {proc.returncode}:\n{out[-3000:]}")
        try:
            if httpx.get(base + "/dashboard.css", timeout=1).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            time.sleep(0.1)
    stop_server(proc)
    raise RuntimeError("dashboard server did not answer within 30 s")


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    """Stop the server process started by :func:`start_server` (by its pid): SIGTERM, then SIGKILL."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    if proc.stdout:
        proc.stdout.close()


@pytest.fixture
def count_queries() -> Callable[..., Any]:
    """A context manager collecting the SQL statements executed on an engine while it is open."""
    from contextlib import contextmanager

    from sqlalchemy import event

    @contextmanager
    def counting(engine: Any) -> Iterator[list[str]]:
        seen: list[str] = []

        def before(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            seen.append(statement)

        event.listen(engine, "before_cursor_execute", before)
        try:
            yield seen
        finally:
            event.remove(engine, "before_cursor_execute", before)

    return counting
