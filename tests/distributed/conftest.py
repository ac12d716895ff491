"""Fixtures for the distributed tests: a private Redis, a pass repository, Celery workers by pid."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from service.settings import Settings
from tests.distributed.procs import RedisServer, Worker


@pytest.fixture(scope="module")
def private_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A redis-server of this test module only (so restarting it disturbs nobody)."""
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def fresh_redis(private_redis: RedisServer) -> RedisServer:
    """The module's private Redis, emptied for this test."""
    import redis

    redis.Redis.from_url(private_redis.url).flushall()
    return private_redis


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=repo, check=True,
                          capture_output=True, text=True).stdout.strip()


@pytest.fixture
def pass_repo(tmp_path: Path) -> Path:
    """A git repository whose ``amp_pass`` says which commit it is (two commits on ``main``)."""
    repo = tmp_path / "passrepo"
    (repo / "amp_pass").mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    for value in ("first", "second"):
        (repo / "amp_pass" / "__init__.py").write_text(f"VALUE = {value!r}\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", value)
    return repo


@pytest.fixture
def cluster_env(tmp_path: Path, fresh_redis: RedisServer, pg_url: str, pass_repo: Path) -> dict[str, str]:
    """AMPCI_* environment shared by the test (scheduler side) and its workers."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("AMPCI_")}
    env.update({
        "AMPCI_BROKER_URL": fresh_redis.url,
        "AMPCI_DATABASE_URL": pg_url,
        "AMPCI_CACHE_DIR": str(tmp_path / "cache"),
        "AMPCI_DATA_DIR": str(tmp_path / "data"),
        "AMPCI_PASS_REPO": str(pass_repo),
        "AMPCI_JOB_TIMEOUT": "8s",      # visibility timeout 13 s: redelivery after a lost worker is quick
        "AMPCI_MAX_ATTEMPTS": "2",
        "AMPCI_LOG_LEVEL": "INFO",
    })
    return env


@pytest.fixture
def cluster_settings(cluster_env: dict[str, str]) -> Settings:
    return Settings.from_env(cluster_env)


@pytest.fixture
def start_worker(tmp_path: Path, cluster_env: dict[str, str]) -> Iterator[Callable[..., Worker]]:
    """Start real Celery workers; every one is stopped (by pid) when the test ends."""
    started: list[Worker] = []

    def start(node: str, queues: str = "cpu", extra_env: dict[str, str] | None = None, **kw: Any) -> Worker:
        w = Worker({**cluster_env, **(extra_env or {})}, queues, node, tmp_path / f"{node}.log", **kw)
        started.append(w)
        return w

    try:
        yield start
    finally:
        for w in started:
            w.stop()
