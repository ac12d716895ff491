"""Name resolution is inside an exchange's total deadline (service/github_auth/transport.py).

The operating system's resolver is what is faulted here: ``socket.getaddrinfo`` is replaced for one made-up
host name (``*.hang.invalid``) by a lookup that blocks until the test releases it, as a resolver whose DNS
server never answers does; every other name goes to the real resolver, and the answering server is a real
loopback HTTP server.  Without the deadline covering resolution, an exchange with such a host would block
for as long as the resolver does.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pytest_httpserver import HTTPServer

from service.github_auth import transport
from service.github_auth.transport import MAX_PENDING_RESOLUTIONS, BoundedHTTP, ExchangeError
from tests.waiting import wait_until

DEADLINE_S = 0.5
MARGIN_S = 30.0  # a loaded machine is slow, not wrong: the wait below fails only on a real hang
HANGING = "hang.invalid"


class HangingResolver:
    """``socket.getaddrinfo`` that blocks for names ending in ``hang.invalid`` until :meth:`release`,
    then answers 127.0.0.1 (a late answer); other names go to the real resolver."""

    def __init__(self, real: Callable[..., Any]) -> None:
        self._real = real
        self.released = threading.Event()
        self.started = 0
        self.answered = 0
        self._lock = threading.Lock()

    def __call__(self, host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(host, str) and host.endswith(HANGING):
            with self._lock:
                self.started += 1
            self.released.wait()
            with self._lock:
                self.answered += 1
            return self._real("127.0.0.1", port, *args, **kwargs)
        return self._real(host, port, *args, **kwargs)

    def release(self) -> None:
        self.released.set()


@pytest.fixture
def resolver(monkeypatch: pytest.MonkeyPatch) -> Iterator[HangingResolver]:
    fake = HangingResolver(socket.getaddrinfo)
    monkeypatch.setattr(socket, "getaddrinfo", fake)
    try:
        yield fake
    finally:
        fake.release()  # the abandoned lookups end (their answers are dropped)
        wait_until(lambda: transport._pending == 0, "the abandoned lookups to end")


def _in_thread(call: Callable[[], Any]) -> tuple[threading.Event, list[Any]]:
    """Run ``call`` in a daemon thread; (an event set when it ended, [its result or exception])."""
    done = threading.Event()
    outcome: list[Any] = []

    def body() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            outcome.append(exc)
        finally:
            done.set()

    threading.Thread(target=body, daemon=True).start()
    return done, outcome


def test_a_hanging_resolver_ends_the_exchange_at_its_deadline(resolver: HangingResolver, httpserver: HTTPServer):
    httpserver.expect_request("/ok").respond_with_json({"ok": True})
    http = BoundedHTTP(deadline=DEADLINE_S)
    try:
        done, outcome = _in_thread(lambda: http.request("GET", f"http://api.{HANGING}:{httpserver.port}/ok"))
        wait_until(done.is_set, f"the exchange to end within its {DEADLINE_S}s deadline (+ margin)",
                   timeout=DEADLINE_S + MARGIN_S, every=0.05)
        error = outcome[0]
        assert isinstance(error, ExchangeError), error
        assert error.deadline, str(error)
        assert f"within {DEADLINE_S:g}s" in str(error) and "\n" not in str(error)
        assert resolver.started == 1 and resolver.answered == 0  # it ended while the resolver still hung
        # the resolver answers late: the answer is dropped, nothing is sent on its behalf
        resolver.release()
        wait_until(lambda: resolver.answered == 1, "the late answer")
        wait_until(lambda: transport._pending == 0, "the abandoned lookup to end")
        assert httpserver.log == []
        # the client is still usable, with the real resolver (a name, so through the lookup thread too)
        answer = http.request("GET", f"http://localhost:{httpserver.port}/ok")
        assert answer.status_code == 200 and answer.json() == {"ok": True}
    finally:
        http.close()


def test_lookups_that_never_end_are_bounded(resolver: HangingResolver):
    """A dead resolver does not pile up threads: beyond MAX_PENDING_RESOLUTIONS hanging lookups an exchange
    is refused at once, with one line, and not as a deadline."""
    http = BoundedHTTP(deadline=0.2)
    try:
        for n in range(20 * MAX_PENDING_RESOLUTIONS):  # (a stalled machine may spend a deadline before the lookup)
            if transport._pending >= MAX_PENDING_RESOLUTIONS:
                break
            with pytest.raises(ExchangeError) as hung:
                http.request("GET", f"http://n{n}.{HANGING}:9/")
            assert hung.value.deadline
        assert transport._pending == MAX_PENDING_RESOLUTIONS
        with pytest.raises(ExchangeError) as refused:
            http.request("GET", f"http://more.{HANGING}:9/")
        assert not refused.value.deadline
        assert "lookups still pending" in str(refused.value) and "\n" not in str(refused.value)
        # every pending lookup is in the resolver; the refused one never reached it
        wait_until(lambda: resolver.started == MAX_PENDING_RESOLUTIONS, "the pending lookups in the resolver")
        assert transport._pending == MAX_PENDING_RESOLUTIONS
    finally:
        http.close()


def test_a_name_that_does_not_resolve_is_one_line_not_a_deadline():
    http = BoundedHTTP(deadline=30.0)
    try:
        with pytest.raises(ExchangeError) as failed:
            http.request("GET", "http://no-such-host.invalid:9/")
        assert not failed.value.deadline
        assert "name resolution of no-such-host.invalid failed" in str(failed.value)
        assert "\n" not in str(failed.value)
    finally:
        http.close()
