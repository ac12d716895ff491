"""What the HTTP handlers share: settings, store, dispatcher, reporter, webhook processor, probes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from service.api.dispatch import RunDispatcher
from service.github.reporter import StatusReporter
from service.github.webhook import WebhookProcessor
from service.settings import Settings, redact_url

Probe = Callable[[], tuple[bool, str]]  # () -> (reachable, one-line detail)


@dataclass
class AppContext:
    """One per app; built by :func:`service.api.app.create_app`."""

    settings: Settings
    store: Any
    dispatcher: RunDispatcher
    reporter: StatusReporter
    webhook: WebhookProcessor
    database_probe: Probe
    broker_probe: Probe
    recorder: Any = None  # the webhook's DeliveryRecorder (group commit), made on first use


def database_probe(store: Any) -> Probe:
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
    client: list[Any] = []

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
