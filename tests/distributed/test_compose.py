"""docker-compose.yml: every project service runs a real entry point of this project, with health checks."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
EXPECTED = {"postgres", "redis", "api", "beat", "worker-cuda", "worker-cpu"}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _project_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: svc for name, svc in compose["services"].items() if "build" in svc}


def test_expected_services_with_health_checks(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert EXPECTED <= set(services)
    for name in EXPECTED:
        check = services[name].get("healthcheck", {})
        assert check.get("test") and not check.get("disable"), f"{name} has no health check"


def test_every_project_command_is_a_real_ampci_command(compose: dict[str, Any]) -> None:
    parser = build_parser()
    project = _project_services(compose)
    assert EXPECTED - {"postgres", "redis"} <= set(project)
    for name, svc in project.items():
        cmd = svc["command"]
        assert isinstance(cmd, list) and cmd[0] == "ampci", f"{name}: {cmd}"
        try:
            args = parser.parse_args(cmd[1:])
        except SystemExit:
            pytest.fail(f"{name}: `{' '.join(cmd)}` is not accepted by the ampci CLI")
        assert callable(getattr(args, "func", None)), f"{name}: {cmd} has no command function"


def test_worker_commands_and_celery_app_entry_point(compose: dict[str, Any]) -> None:
    from service.cli.worker_cmd import worker_argv

    services = compose["services"]
    parser = build_parser()
    for name, queue in (("worker-cuda", "cuda"), ("worker-cpu", "cpu")):
        args = parser.parse_args(services[name]["command"][1:])
        argv = worker_argv(args.queues, args.concurrency, args.name, "INFO")
        assert queue in argv[argv.index("-Q") + 1].split(",")
    assert parser.parse_args(services["worker-cuda"]["command"][1:]).concurrency == 1
    # health checks and `celery -A service.orchestration.celery_app` need the module-level app
    assert importlib.import_module("service.orchestration.celery_app").app.main == "ampci"
    gpu = services["worker-cuda"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert "gpu" in gpu["capabilities"]
    assert "cpu" in services["worker-cpu"]["command"][services["worker-cpu"]["command"].index("--queues") + 1]


def test_volumes_and_configuration_by_environment(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name in ("worker-cuda", "worker-cpu"):
        mounts = [str(v) for v in services[name].get("volumes", [])]
        assert any(m.endswith(":/var/cache/ampci") for m in mounts), f"{name}: no model/worktree cache volume"
        env = services[name]["environment"]
        assert env["AMPCI_BROKER_URL"].startswith("redis://")
        assert env["AMPCI_DATABASE_URL"].startswith("postgresql")
        assert env["AMPCI_CACHE_DIR"] == "/var/cache/ampci"
    redis_cmd = services["redis"]["command"]
    assert "--appendonly" in redis_cmd and redis_cmd[redis_cmd.index("--appendonly") + 1] == "yes"
    assert "ARG BASE_IMAGE" in (ROOT / "Dockerfile").read_text()
