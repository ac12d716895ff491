"""``ampci serve``: a real uvicorn server on a loopback port, and its refusal to start without a secret."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.bench_webhook import free_port, stop_server
from tests.service.api.helpers import REPO, SECRET, encode, push_payload, sha, webhook_headers

ROOT = Path(__file__).resolve().parents[3]
pytestmark = [pytest.mark.postgres, pytest.mark.redis]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMPCI_")}
    env.update(extra)
    return env


def test_serve_refuses_to_start_without_a_webhook_secret(tmp_path: Path):
    proc = subprocess.run([sys.executable, "-m", "service.cli.main", "serve", "--port", "0"], cwd=ROOT,
                          env=_env(AMPCI_DATA_DIR=str(tmp_path)), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "ampci: error: AMPCI_WEBHOOK_SECRET is required for the webhook "
        "(set AMPCI_INSECURE_DEV=1 to run without one in development)"]


def test_serve_rejects_a_bad_port():
    proc = subprocess.run([sys.executable, "-m", "service.cli.main", "serve", "--port", "70000"], cwd=ROOT,
                          env=_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "between 0 and 65535" in proc.stderr


def test_serve_runs_the_app_with_uvicorn(pg_url: str, redis_url: str, queue: str, tmp_path: Path, store: Any):
    port = free_port()
    env = _env(AMPCI_DATABASE_URL=pg_url, AMPCI_BROKER_URL=redis_url, AMPCI_WEBHOOK_SECRET=SECRET,
               AMPCI_ALLOWED_REPOS=REPO, AMPCI_LOG_LEVEL="WARNING", AMPCI_DATA_DIR=str(tmp_path))
    with open(tmp_path / "serve.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "service.cli.main", "serve", "--host", "127.0.0.1",
                                 "--port", str(port)], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        health = None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                health = httpx.get(base + "/healthz", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.2)
        assert health is not None, (tmp_path / "serve.log").read_text()
        assert health.status_code == 200 and health.json()["database"]["ok"] and health.json()["broker"]["ok"]
        ping = encode({"zen": "Design for failure.", "hook_id": 3})
        assert httpx.post(base + "/webhooks/github", content=ping,
                          headers=webhook_headers(ping, "ping")).status_code == 200
        unsigned = encode(push_payload(sha("serve")))
        assert httpx.post(base + "/webhooks/github", content=unsigned,
                          headers=webhook_headers(unsigned, "push", secret=None)).status_code == 401
        assert httpx.get(base + "/openapi.json").json()["info"]["title"] == "ampci"
        assert httpx.get(base + "/api/runs").json() == {"runs": []}
    finally:
        stop_server(proc)
    assert proc.returncode is not None
