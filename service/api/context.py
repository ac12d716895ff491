"""What the HTTP handlers share: settings, store, dispatcher, reporter, webhook processor, probes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from starlette.requests import HTTPConnection

from service.api.dispatch import RunDispatcher
from service.db.store import Store
from service.github.recorder import DeliveryRecorder
from service.github.reporter import StatusReporter
from service.github.webhook import WebhookProcessor
from service.settings import Settings, redact_url

if TYPE_CHECKING:
    from redis import Redis

Probe = Callable[[], tuple[bool, str]]  # () -> (reachable, one-line detail)


@dataclass
class AppContext:
    """One per app; built by :func:`service.api.app.create_app`."""

    settings: Settings
    store: Store
    dispatcher: RunDispatcher
    reporter: StatusReporter
    webhook: WebhookProcessor
    database_probe: Probe
    broker_probe: Probe
    recorder: DeliveryRecorder | None = None  # the webhook's DeliveryRecorder (group commit), made on first use


def app_context(request: HTTPConnection) -> AppContext:
    """The :class:`AppContext` of the app serving ``request`` (``create_app`` keeps it in ``app.state.ctx``)."""
    ctx: AppContext = request.app.state.ctx  # starlette types the app of a request as Any
    return ctx


def database_probe(store: Store) -> Probe:
    """``SELECT 1`` over the store's engine; never raises."""

    def probe() -> tuple[bool, str]:
        from service.db.engine import ping

        try:
            return True, ping(store.engine)
        except Exception as exc:  # noqa: BLE001 - a probe reports, it does not raise
            return False, _one_line(exc)

    return probe


def broker_probe(settings: Settings) -> Probe:
    """PING the Redis broker (embedded mode has none and is always reachable); never raises."""
    client: list[Redis] = []

    def probe() -> tuple[bool, str]:
        if settings.embedded:
            return True, "embedded (no broker; jobs run in local worker processes)"
        if not settings.broker_url.startswith(("redis://", "rediss://", "unix://")):
            return False, f"cannot probe broker {redact_url(settings.broker_url)} (only Redis is supported)"
        try:
            if not client:
                import redis

                client.append(redis.Redis.from_url(settings.broker_url, socket_timeout=2,
                                                   socket_connect_timeout=2))
            client[0].ping()
        except Exception as exc:  # noqa: BLE001
            return False, _one_line(exc)
        return True, redact_url(settings.broker_url)

    return probe


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return redact_url(f"{type(exc).__name__}: {text[0] if text else ''}")[:300]
