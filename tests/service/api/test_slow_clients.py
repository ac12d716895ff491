"""Issue 24 item 11: slow clients are timed out and one client cannot hold unbounded connections.

A bounded slowloris on loopback against a real ``ampci serve`` (subprocess, stopped by its pid): 12
connections trickle request headers a byte at a time, 2 more send their headers and then trickle
the body, with ``AMPCI_HTTP_HEADER_TIMEOUT=1s``, ``AMPCI_HTTP_BODY_TIMEOUT=1.5s`` and
``AMPCI_HTTP_CLIENT_CONNECTIONS=8``.  Connections past the cap are closed at once, the trickling
ones within their deadline (they were held open for the whole probe before), and afterwards a
normal request is answered at once.  The whole test takes under 15 s.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.bench_webhook import free_port, stop_server
from tests.service.api.helpers import API_TOKEN, REPO, SECRET

ROOT = Path(__file__).resolve().parents[3]
pytestmark = [pytest.mark.postgres, pytest.mark.redis]

HEADER_TIMEOUT, BODY_TIMEOUT, CAP = 1.0, 1.5, 8


@pytest.fixture
def server(pg_url: str, redis_url: str, tmp_path: Path, store: Any) -> Any:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMPCI_")}
    env.update(AMPCI_DATABASE_URL=pg_url, AMPCI_BROKER_URL=redis_url, AMPCI_WEBHOOK_SECRET=SECRET,
               AMPCI_ALLOWED_REPOS=REPO, AMPCI_API_TOKEN=API_TOKEN, AMPCI_LOG_LEVEL="WARNING",
               AMPCI_DATA_DIR=str(tmp_path), AMPCI_HTTP_HEADER_TIMEOUT=f"{HEADER_TIMEOUT}s",
               AMPCI_HTTP_BODY_TIMEOUT=f"{BODY_TIMEOUT}s", AMPCI_HTTP_CLIENT_CONNECTIONS=str(CAP),
               AMPCI_HTTP_KEEPALIVE_TIMEOUT="1s")
    log = open(tmp_path / "serve.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([sys.executable, "-m", "service.cli.main", "serve", "--host", "127.0.0.1",
                             "--port", str(port), "--no-migrate"], cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                httpx.get(base + "/healthz", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.2)
        assert proc.poll() is None, (tmp_path / "serve.log").read_text()
        yield port, base, tmp_path / "serve.log"
    finally:
        stop_server(proc)
        log.close()


def _closed(sock: socket.socket) -> bool:
    """True when the server closed ``sock`` (EOF or reset), False while it is still open."""
    try:
        sock.setblocking(False)
        data = sock.recv(65536)
        return data == b"" or b"HTTP/1.1 408" in data or b"HTTP/1.1 4" in data
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        sock.setblocking(True)


def test_slow_clients_are_cut_off_and_capped(server: Any) -> None:
    port, base, log = server
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200
    body_head = (b"POST /api/runs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Authorization: Bearer " + API_TOKEN.encode() + b"\r\nContent-Length: 500\r\n\r\n{")
    socks: list[socket.socket] = []
    slow_bodies: list[socket.socket] = []
    try:
        for _ in range(2):  # first, so that they are under the cap: their body deadline is what cuts them
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(body_head)
            slow_bodies.append(s)
        for _ in range(12):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(head[:10])
            socks.append(s)
        time.sleep(0.3)
        over_cap = [s for s in socks + slow_bodies if _closed(s)]
        assert len(over_cap) >= 12 + 2 - CAP, f"{len(over_cap)} closed at once; cap {CAP}"  # the cap
        started = time.monotonic()
        open_ones = [s for s in socks + slow_bodies if s not in over_cap]
        sent = 10
        cut_at: dict[int, float] = {}
        while open_ones and time.monotonic() - started < HEADER_TIMEOUT + BODY_TIMEOUT + 3:
            for s in list(open_ones):
                try:
                    s.sendall(head[sent:sent + 1] if s in socks else b" ")  # a byte each, keeps trickling
                except OSError:
                    open_ones.remove(s)
                    continue
                if _closed(s):
                    open_ones.remove(s)
                    cut_at[id(s)] = time.monotonic() - started
            sent += 1
            time.sleep(0.1)
        held = time.monotonic() - started
        assert not open_ones, f"{len(open_ones)} slow connections still open after {held:.1f}s"
        assert held < HEADER_TIMEOUT + BODY_TIMEOUT + 2.5
        assert all(s not in over_cap for s in slow_bodies)
        assert all(cut_at[id(s)] < BODY_TIMEOUT + 1.5 for s in slow_bodies), cut_at  # 408 at the body deadline
    finally:
        for s in socks + slow_bodies:
            s.close()
    t0 = time.monotonic()
    assert httpx.get(base + "/healthz", timeout=5).status_code in (200, 503)  # served at once afterwards
    assert time.monotonic() - t0 < 2
    text = log.read_text()
    assert "Traceback" not in text, text[-2000:]
    assert "AMPCI_HTTP_HEADER_TIMEOUT" in text and "AMPCI_HTTP_CLIENT_CONNECTIONS" in text, text[-2000:]
