"""``ampci serve`` without a broker keeps its PostgreSQL connections within the configured bound
during a burst of signed pushes (issue 17: every run used to get its own LocalPool with its own
engine, until PostgreSQL refused everyone).

A real ``ampci serve`` subprocess (embedded mode: no AMPCI_BROKER_URL) on a fresh PostgreSQL
database; ``pg_stat_activity`` is sampled for that database while the burst and the intake run.
The bound is the documented one for one API process in embedded mode:
``2 engines x (AMPCI_DB_POOL_SIZE + AMPCI_DB_MAX_OVERFLOW)`` (the app's store, the local pool's).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from bench.bench_webhook import free_port, stop_server
from tests.service.api.helpers import REPO, SECRET, encode, push_payload, sha, webhook_headers

ROOT = Path(__file__).resolve().parents[3]
pytestmark = [pytest.mark.postgres]

POOL_SIZE, MAX_OVERFLOW = 2, 1
BOUND = 2 * (POOL_SIZE + MAX_OVERFLOW)
PUSHES = 100
MONITOR = "ampci-test-monitor"  # this test's own connections, not counted


def _connections(admin: sa.Engine, database: str) -> int:
    with admin.connect() as c:
        return int(c.execute(sa.text("select count(*) from pg_stat_activity where datname = :d and "
                                     "application_name <> :me"), {"d": database, "me": MONITOR}).scalar_one())


def test_a_burst_of_pushes_stays_within_the_connection_bound(pg_url: str, tmp_path: Path) -> None:
    from service.db import Store

    Store.from_url(pg_url).upgrade()
    database = sa.make_url(pg_url).database
    admin = sa.create_engine(sa.make_url(pg_url).set(database="postgres"), poolclass=sa.pool.NullPool,
                             connect_args={"application_name": MONITOR})
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMPCI_")}
    env.update(AMPCI_DATABASE_URL=pg_url, AMPCI_WEBHOOK_SECRET=SECRET, AMPCI_ALLOWED_REPOS=REPO,
               AMPCI_LOG_LEVEL="WARNING", AMPCI_DATA_DIR=str(tmp_path / "data"), AMPCI_CACHE_DIR=str(tmp_path / "c"),
               AMPCI_DB_POOL_SIZE=str(POOL_SIZE), AMPCI_DB_MAX_OVERFLOW=str(MAX_OVERFLOW), AMPCI_LOCAL_WORKERS="1")
    with open(tmp_path / "serve.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "service.cli.main", "serve", "--no-migrate", "--host",
                                 "127.0.0.1", "--port", str(port)], cwd=ROOT, env=env, stdout=log,
                                stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _connections(admin, database))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "serve.log").read_text()[-3000:]
            try:
                if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        sampler.start()

        def push(i: int) -> int:
            body = encode(push_payload(sha(f"burst-{i}"), before=sha(f"burst-parent-{i}")))
            return httpx.post(base + "/webhooks/github", content=body, headers=webhook_headers(body, "push"),
                              timeout=60).status_code

        with ThreadPoolExecutor(32) as ex:
            codes = list(ex.map(push, range(PUSHES)))
        assert codes.count(202) == PUSHES, codes
        store = Store(sa.create_engine(pg_url.replace("postgresql://", "postgresql+psycopg://", 1),
                                       connect_args={"application_name": MONITOR}))
        try:
            deadline = time.monotonic() + 120
            while True:  # the intake settles every delivery (runs created, jobs on the local pool)
                with store.engine.connect() as c:
                    pending = c.execute(sa.text("select count(*) from webhook_deliveries where status = 'pending'")
                                        ).scalar_one()
                if not pending:
                    break
                assert time.monotonic() < deadline, f"{pending} deliveries still pending"
                time.sleep(0.5)
            time.sleep(3)  # local jobs keep running and writing results meanwhile
            with store.engine.connect() as c:
                runs = c.execute(sa.text("select count(*) from runs")).scalar_one()
        finally:
            store.dispose()
        assert runs >= 1
    finally:
        done.set()
        if sampler.is_alive():
            sampler.join(5)
        stop_server(proc)
        admin.dispose()
    print(f"peak connections {peak[0]} (bound {BOUND})")
    assert 0 < peak[0] <= BOUND, (peak[0], BOUND, (tmp_path / "serve.log").read_text()[-2000:])
