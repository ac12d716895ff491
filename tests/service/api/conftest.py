"""Fixtures of the HTTP service tests: a migrated PostgreSQL store, an isolated Redis job queue,
settings, and the app (in-process or as a real uvicorn server on a loopback port)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from service.api.app import create_app
from service.api.dispatch import RunDispatcher
from service.github.client import GitHubStatusClient
from service.github.outbox import RedisOutbox
from service.github.reporter import StatusReporter
from service.settings import Settings
from tests.service.api.helpers import API_TOKEN, GITHUB_TOKEN, REPO, SECRET


@pytest.fixture
def store(pg_url: str) -> Iterator[Any]:
    """A Store over a fresh PostgreSQL database at schema head."""
    from service.db import Store

    s = Store.from_url(pg_url)
    s.upgrade()
    yield s
    s.dispose()


@pytest.fixture
def queue(redis_url: str, unique_prefix: str) -> Iterator[str]:
    """A Celery queue (= job target) of this test only; its Redis keys are deleted afterwards."""
    import redis

    name = "cpu-" + unique_prefix.rsplit("-", 1)[-1]  # a queue of the cpu target, at most 16 characters
    yield name
    r = redis.Redis.from_url(redis_url)
    for key in r.scan_iter(f"*{name}*"):
        r.delete(key)
    for key in r.scan_iter("_kombu.binding.*"):
        for member in r.smembers(key):
            if name.encode() in member:
                r.srem(key, member)


def test_planner(target: str) -> Callable[[str], list[Any]]:
    """Plan sweeps as two models x fp16/bf16 on ``target`` (an isolated queue)."""
    from service.orchestration.scheduler import SweepConfig

    def plan(sweep: str) -> list[Any]:
        config = SweepConfig.from_dict({"name": sweep, "models": ["mlp_small", "conv_small"],
                                        "dtypes": ["fp16", "bf16"], "policies": ["default"],
                                        "targets": [target], "repeats": 6})
        return config.expand({"mlp_small": ["smoke"], "conv_small": ["smoke"]})

    return plan


test_planner.__test__ = False  # type: ignore[attr-defined]


@pytest.fixture
def make_settings(pg_url: str, redis_url: str) -> Callable[..., Settings]:
    """Settings for the tests (secret, tokens, allowlist, real PostgreSQL and Redis); override by kwargs."""

    def make(**overrides: Any) -> Settings:
        base: dict[str, Any] = dict(database_url=pg_url, broker_url=redis_url, webhook_secret=SECRET,
                                    api_token=API_TOKEN, github_token=GITHUB_TOKEN,
                                    github_api_url="http://127.0.0.1:9", allowed_repos=REPO,
                                    public_url="https://ci.example.com",
                                    # one run per delivery here; tests/service/api/test_webhook_baseline.py runs baselines
                                    baseline_runs=False)
        base.update(overrides)
        return Settings(**base)

    return make


def make_reporter(settings: Settings, redis_url: str, prefix: str, **kwargs: Any) -> StatusReporter:
    """A reporter over a Redis outbox under ``prefix`` posting to ``settings.github_api_url`` (with the
    settings' token, or as ``client`` says)."""
    client = kwargs.pop("client", None) or (GitHubStatusClient(settings.github_api_url, settings.github_token,
                                                               timeout=2.0, backoff_base=0.01)
                                            if settings.github_token else None)
    return StatusReporter(RedisOutbox(redis_url, prefix=prefix), client, public_url=settings.public_url, **kwargs)


@pytest.fixture
def make_client(store: Any, queue: str, redis_url: str,
                make_settings: Callable[..., Settings]) -> Iterator[Callable[..., Any]]:
    """Build a TestClient over ``create_app`` with the real store, the isolated queue and a reporter
    whose Redis outbox lives under the queue's name (deleted with it)."""
    from fastapi.testclient import TestClient

    clients: list[Any] = []

    def make(settings: Settings | None = None, **kwargs: Any) -> Any:
        settings = settings or make_settings()
        kwargs.setdefault("dispatcher", RunDispatcher(settings, store, planner=test_planner(queue)))
        kwargs.setdefault("reporter", make_reporter(settings, redis_url, queue, store=store))
        kwargs.setdefault("background", False)
        client = TestClient(create_app(settings, store=store, **kwargs), raise_server_exceptions=False)
        client.__enter__()
        clients.append(client)
        return client

    yield make
    for c in clients:
        c.__exit__(None, None, None)
