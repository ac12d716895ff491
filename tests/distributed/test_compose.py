"""docker-compose.yml: every project service runs a real entry point of this project, with health checks."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.cli.main import build_parser
from service.settings import CREDENTIALS

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
        assert "redis://redis:6379/0" in env["AMPCI_BROKER_URL"]
        assert env["AMPCI_DATABASE_URL"].startswith("postgresql")
        assert env["AMPCI_CACHE_DIR"] == "/var/cache/ampci"
    redis_cmd = services["redis"]["command"]
    assert "--appendonly" in redis_cmd and redis_cmd[redis_cmd.index("--appendonly") + 1] == "yes"
    assert "ARG BASE_IMAGE" in (ROOT / "Dockerfile").read_text()


def _setting_variables() -> list[str]:
    from dataclasses import fields

    from service.settings import PREFIX, Settings

    return [PREFIX + f.name.upper() for f in fields(Settings)]


def test_every_setting_reaches_every_project_service(compose: dict[str, Any]) -> None:
    """A setting added to service/settings.py but not to x-ampci-env would silently never reach the
    containers (values in .env only fill ${...} in the file): every one must be listed."""
    names = _setting_variables()
    assert len(names) > 30
    for name, svc in _project_services(compose).items():
        env = svc["environment"]
        assert isinstance(env, dict), f"{name}: environment must be the x-ampci-env mapping"
        missing = [n for n in names if n not in env]
        # issue 31: only the api holds the credentials; every other service gets every other setting
        allowed = set() if name == "api" else set(CREDENTIALS)
        assert set(missing) <= allowed, f"{name}: settings not passed to the container: {missing}"
    # the secret is required at `up` (one-line error), never defaulted to empty
    secret = compose["services"]["api"]["environment"]["AMPCI_WEBHOOK_SECRET"]
    assert secret.startswith("${AMPCI_WEBHOOK_SECRET:?") and "AMPCI_WEBHOOK_SECRET" in secret.split("?", 1)[1]


def test_gpu_worker_behind_a_profile_and_the_cpu_image_without_cuda(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert services["worker-cuda"]["profiles"] == ["gpu"]
    assert services["worker-cuda"]["build"]["args"]["ONNXRUNTIME"] == "onnxruntime-gpu"
    without_profile = {n for n, svc in services.items() if not svc.get("profiles")}
    assert without_profile == {"postgres", "redis", "migrate", "api", "beat", "worker-cpu"}
    for name in without_profile & set(_project_services(compose)):
        assert services[name]["build"]["args"]["ONNXRUNTIME"] == "onnxruntime", name
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "ARG ONNXRUNTIME=onnxruntime" in dockerfile and "onnxruntime-gpu" in dockerfile


def test_api_is_published_on_loopback_by_default(compose: dict[str, Any]) -> None:
    ports = compose["services"]["api"]["ports"]
    assert ports == ["${AMPCI_BIND:-127.0.0.1}:${AMPCI_PORT:-8000}:8000"]
    for name, svc in compose["services"].items():
        assert name == "api" or "ports" not in svc, f"{name} publishes a port"


def test_image_excludes_secrets_and_belongs_to_the_service_user() -> None:
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".env" in ignored and ".venv" in ignored
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "COPY --chown=10001:10001 . ." in dockerfile and "chown -R ampci:ampci /app" in dockerfile
    assert dockerfile.rstrip().splitlines()[-1].startswith("CMD") and "\nUSER ampci\n" in dockerfile
    assert "test ! -e /app/.env" in dockerfile


@pytest.mark.parametrize("files", [["celerybeat-schedule"], ["celerybeat-schedule.db"],
                                   ["celerybeat-schedule.dat", "celerybeat-schedule.dir", "celerybeat-schedule.bak"]])
def test_beat_health_check_accepts_every_dbm_flavour(compose: dict[str, Any], tmp_path: Path,
                                                     files: list[str]) -> None:
    import os
    import subprocess
    import sys
    import time

    test = compose["services"]["beat"]["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python3", "-c"]
    code = test[3].replace("/var/lib/ampci", str(tmp_path))

    def healthy() -> bool:
        return subprocess.run([sys.executable, "-c", code], timeout=30).returncode == 0

    assert not healthy()  # no schedule file yet
    for name in files:
        (tmp_path / name).write_text("x")
    assert healthy()
    old = time.time() - 3600
    for name in files:
        os.utime(tmp_path / name, (old, old))
    assert not healthy()  # beat stopped syncing an hour ago


def test_local_image_override_covers_every_cpu_service(compose: dict[str, Any]) -> None:
    local = yaml.safe_load((ROOT / "deploy" / "compose.local.yml").read_text())["services"]
    assert local["postgres"]["image"].startswith("local/") and local["redis"]["image"].startswith("local/")
    cpu_built = {n for n, svc in _project_services(compose).items() if not svc.get("profiles")}
    assert cpu_built == {n for n, svc in local.items() if "build" in svc}
    for svc in local.values():
        if "build" in svc:
            assert svc["build"]["args"] == {"BASE_IMAGE": "local/python:3.11", "ONNXRUNTIME": "onnxruntime"}
