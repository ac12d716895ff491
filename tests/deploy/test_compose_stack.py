"""End to end: the compose stack of this checkout is built, started and driven on this machine.

Builds the local base images (deploy/images.py: Debian packages, no registry) and the ampci image,
starts the CPU stack under a project name of its own with the API published on a free port of
127.0.0.1, and checks what a user relies on: a signed push and pull request become runs that finish
on ``worker-cpu`` with 6 results (the pull request against the base tip), results and regressions
read back through ``GET /api/runs/{id}`` and the ``ampci`` CLI inside the api container, a worker
container killed mid-job has its job redelivered and the run still ends with one result per cell,
a Redis restart loses no queued job, ``/healthz`` names the dependency that is down, bad
configuration is one line in ``docker compose logs``, and ``down -v`` leaves nothing behind.

Docker is required: when no daemon can be started the test fails, unless ``AMPCI_NO_DOCKER=1`` is set
(then it is skipped, saying so).  Timings go to ``artifacts/deploy_timings.json``.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from deploy.images import LOCAL_OVERRIDE, build_base_images, compose_command, docker_env, ensure_dockerd
from tests.api.helpers import encode, pr_payload, push_payload, webhook_headers
from tests.deploy.stack import ROOT, Stack, docker, free_port, wait_for

pytestmark = [pytest.mark.deploy, pytest.mark.slow]

SECRET = "deploy-test-secret"
REPO = "acme/amp-pass"
CELLS = 6  # sweeps/smoke.toml: 3 smoke models x fp16/bf16 x default x cpu
HEALTHY = ("postgres", "redis", "api", "beat", "worker-cpu")
TIMINGS: dict[str, float] = {}


def _no_docker_allowed() -> bool:
    return os.environ.get("AMPCI_NO_DOCKER", "").strip().lower() in {"1", "true", "yes"}


def _require(problem: str | None) -> None:
    if problem is None:
        return
    if _no_docker_allowed():
        pytest.skip(f"AMPCI_NO_DOCKER=1: {problem}")
    pytest.fail(f"the deployment test needs Docker: {problem} (set AMPCI_NO_DOCKER=1 to skip it explicitly)")


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    """The CPU stack, built and healthy; removed with ``down -v`` (and checked gone) however the tests end."""
    _require(ensure_dockerd())
    compose = compose_command()
    _require(None if compose else "no compose client (apt-get install docker-compose)")
    assert compose is not None
    t0 = time.monotonic()
    TIMINGS.update({f"build {k}": round(v, 1) for k, v in build_base_images().items()})
    env = {k: v for k, v in docker_env().items() if not k.startswith(("AMPCI_", "COMPOSE_", "POSTGRES_"))}
    port = free_port()
    env.update(AMPCI_WEBHOOK_SECRET=SECRET, AMPCI_ALLOWED_REPOS=REPO, AMPCI_BIND="127.0.0.1",
               AMPCI_PORT=str(port), AMPCI_JOB_TIMEOUT="40s", AMPCI_LOG_LEVEL="INFO",
               AMPCI_TRACKED_BRANCHES="main")
    project = f"ampcitest{uuid.uuid4().hex[:10]}"
    st = Stack(compose, project, [ROOT / "docker-compose.yml", LOCAL_OVERRIDE], env, port=port)
    try:
        t1 = time.monotonic()
        st.run("build", "migrate", timeout=1500)  # api, beat and worker-cpu share this image (ampci:latest)
        TIMINGS["build ampci image"] = round(time.monotonic() - t1, 1)
        TIMINGS["images total"] = round(time.monotonic() - t0, 1)
        t2 = time.monotonic()
        st.run("up", "-d", "--no-build", timeout=300)
        st.wait_healthy(HEALTHY, timeout=240)
        TIMINGS["up to healthy"] = round(time.monotonic() - t2, 1)
        yield st
    finally:
        try:
            if any(h != "healthy" and s in HEALTHY for s, h in st.health().items()):
                print(st.logs()[-6000:])
        finally:
            st.down(files=[_bad_config_file()])
            left = st.resources()
            TIMINGS["test total"] = round(time.monotonic() - t0, 1)
            out = ROOT / "artifacts" / "deploy_timings.json"
            out.parent.mkdir(exist_ok=True)
            out.write_text(json.dumps(TIMINGS, indent=2) + "\n")
            assert not any(left.values()), f"`down -v` left resources of {project}: {left}"


def _api(stack: Stack) -> str:
    return f"http://127.0.0.1:{stack.port}"


def _webhook(stack: Stack, event: str, payload: dict[str, Any]) -> dict[str, Any]:
    body = encode(payload)
    resp = httpx.post(_api(stack) + "/webhooks/github", content=body, timeout=30,
                      headers=webhook_headers(body, event, secret=SECRET))
    assert resp.status_code == 202 and resp.json()["status"] == "queued", resp.text
    return dict(resp.json())


def _run_of(stack: Stack, sha: str, trigger: str) -> int:
    def find() -> int | None:
        runs = httpx.get(_api(stack) + "/api/runs", timeout=10).json()["runs"]
        ids = [r["id"] for r in runs if r["revision_sha"] == sha and r["trigger"] == trigger]
        return ids[0] if ids else None

    return wait_for(f"the {trigger} run of {sha[:12]}", find, timeout=60, every=0.3)


def _detail(stack: Stack, run_id: int) -> dict[str, Any]:
    resp = httpx.get(f"{_api(stack)}/api/runs/{run_id}", timeout=10)
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


def _finished(stack: Stack, run_id: int, timeout: float) -> dict[str, Any]:
    return wait_for(f"run {run_id} to finish",
                    lambda: (d := _detail(stack, run_id))["run"]["status"] in {"complete", "failed"} and d,
                    timeout=timeout, every=1.0)


def _check_complete(detail: dict[str, Any]) -> None:
    cells = detail["cells"]
    keys = [(c["job"]["model"], c["job"]["dtype"], c["job"]["policy"], c["job"]["target"]) for c in cells]
    assert len(cells) == CELLS and len(set(keys)) == CELLS, keys
    results = [c["result"] for c in cells if c.get("result")]
    assert len(results) == CELLS, f"{len(results)} results: {detail['summary']}"
    assert {r["status"] for r in results} == {"pass"}, [(r["model"], r["status"], r["message"]) for r in results]
    assert all(r["revision_sha"] == detail["run"]["revision_sha"] for r in results)
    for c in cells:
        assert c["job"]["status"] == "done" and c["job"]["worker"].startswith("worker-cpu@"), c["job"]
    assert detail["run"]["status"] == "complete" and detail["summary"]["cells"] == CELLS


def _queued_messages(stack: Stack) -> int:
    """Messages waiting in the broker's ``cpu`` queue (kombu keeps one list per priority step)."""
    keys = stack.exec("redis", "redis-cli", "--scan", "--pattern", "cpu*").stdout.split()
    return sum(int(stack.exec("redis", "redis-cli", "llen", k).stdout.strip() or 0) for k in keys)


def test_stack_runs_jobs_survives_a_killed_worker_and_a_redis_restart(stack: Stack) -> None:
    # -- configuration reached the containers; the API is on loopback only; /app is the service user's
    env = stack.exec("worker-cpu", "env").stdout
    for line in ("AMPCI_ALLOWED_REPOS=acme/amp-pass", "AMPCI_JOB_TIMEOUT=40s", "AMPCI_TRACKED_BRANCHES=main"):
        assert line in env.splitlines(), f"{line} did not reach worker-cpu"
    ports = stack.container("api")["NetworkSettings"]["Ports"]["8000/tcp"]
    assert [p["HostIp"] for p in ports] == ["127.0.0.1"], ports
    for service in ("api", "worker-cpu"):
        owners = stack.exec(service, "stat", "-c", "%U", "/app", "/app/.git", "/var/cache/ampci").stdout.split()
        assert owners == ["ampci"] * 3, f"{service}: {owners}"
    assert stack.exec("api", "test", "-e", "/app/.env", check=False).returncode == 1
    shas = stack.exec("api", "git", "-C", "/app", "rev-parse", "HEAD", "HEAD~1", "HEAD~2").stdout.split()
    head, base, before = shas
    health = httpx.get(_api(stack) + "/healthz", timeout=10)
    assert health.status_code == 200 and health.json()["down"] == [], health.text

    # -- push: a run on worker-cpu; its worker container is killed mid-job, the job is redelivered
    t_push = time.monotonic()
    _webhook(stack, "push", push_payload(base, before=before, repo=REPO))
    push_run = _run_of(stack, base, "push")
    killed: list[int] = []
    for _ in range(3):  # a job may finish between the poll and the kill: then kill during the next one
        wait_for("a job of the push run running", lambda: [
            c for c in _detail(stack, push_run)["cells"] if c["job"]["status"] == "running"], timeout=180, every=0.2)
        docker("kill", stack.container("worker-cpu")["Id"])
        TIMINGS.setdefault("push to first job running", round(time.monotonic() - t_push, 1))
        # still `running` with the container dead: killed mid-job, its completion never written
        killed = [c["job"]["id"] for c in _detail(stack, push_run)["cells"] if c["job"]["status"] == "running"]
        stack.run("start", "worker-cpu")
        if killed:
            break
    assert killed, "no job was running when the worker container was killed (3 tries)"
    t_kill = time.monotonic()
    detail = _finished(stack, push_run, timeout=420)
    TIMINGS["kill to run finished (redelivery)"] = round(time.monotonic() - t_kill, 1)
    _check_complete(detail)
    attempts = {c["job"]["id"]: c["job"]["attempts"] for c in detail["cells"]}
    assert all(attempts[j] >= 2 for j in killed), f"killed jobs {killed} not redelivered: {attempts}"

    # -- a pull request (no kill): the time from the webhook to 6 results, baseline the base tip
    t_pr = time.monotonic()
    _webhook(stack, "pull_request", pr_payload(head, base, number=11, repo=REPO))
    pr_run = _run_of(stack, head, "pull_request")
    detail = _finished(stack, pr_run, timeout=300)
    TIMINGS["webhook to 6 results (pull request)"] = round(time.monotonic() - t_pr, 1)
    _check_complete(detail)
    assert detail["run"]["baseline_sha"] == base
    assert detail["run"]["meta"]["github"]["baseline_is_base_tip"] is True

    # -- results and regressions: the API and the CLI in the api container agree
    api_regs = httpx.get(_api(stack) + f"/api/regressions?run_id={pr_run}", timeout=10).json()["regressions"]
    assert all(r["run_id"] == pr_run and r["baseline_sha"] == base for r in api_regs), api_regs
    cli = stack.exec("api", "ampci", "regressions", "--run", str(pr_run), "--json", check=False)
    assert cli.returncode in (0, 1), cli.stderr  # 1: the run has open regressions (a gate answer)
    assert sorted(r["id"] for r in json.loads(cli.stdout)) == sorted(r["id"] for r in api_regs)
    cli_run = json.loads(stack.exec("api", "ampci", "run", str(pr_run), "--json").stdout)
    assert cli_run["summary"]["run_id"] == pr_run and cli_run["summary"]["result_status"] == {"pass": CELLS}
    assert sorted(j["id"] for j in cli_run["jobs"]) == sorted(c["job"]["id"] for c in detail["cells"])

    # -- Redis restart with jobs queued (worker stopped): nothing lost; /healthz names the broker meanwhile
    stack.run("stop", "worker-cpu", timeout=120)
    _webhook(stack, "pull_request", pr_payload(head, base, number=12, action="synchronize", repo=REPO))
    wait_for("6 messages queued for the second pull request", lambda: _queued_messages(stack) == CELLS,
             timeout=60)
    stack.run("stop", "redis", timeout=60)
    down = httpx.get(_api(stack) + "/healthz", timeout=20)
    assert down.status_code == 503 and down.json()["down"] == ["broker"], down.text
    stack.run("start", "redis")
    stack.wait_healthy(["redis"], timeout=60)
    assert _queued_messages(stack) == CELLS, "queued jobs were lost in the Redis restart"
    stack.run("start", "worker-cpu")
    runs = httpx.get(_api(stack) + "/api/runs", timeout=10).json()["runs"]
    second = max(r["id"] for r in runs if r["revision_sha"] == head and r["trigger"] == "pull_request")
    assert second != pr_run
    _check_complete(_finished(stack, second, timeout=300))
    stack.wait_healthy(HEALTHY, timeout=120)


def _bad_config_file() -> Path:
    """A compose override with three misconfigured services (written next to the test's other files)."""
    path = ROOT / "artifacts" / "deploy-bad-config.yml"
    path.parent.mkdir(exist_ok=True)
    common = {"image": "ampci:latest", "restart": "no"}
    good = {"AMPCI_DATABASE_URL": "postgresql+psycopg://ampci:ampci@postgres:5432/ampci",
            "AMPCI_BROKER_URL": "redis://redis:6379/0"}
    services = {
        "bad-db-password": {**common, "command": ["ampci", "db", "upgrade"],
                            "environment": {**good, "AMPCI_DATABASE_URL":
                                            "postgresql+psycopg://ampci:wrong-password@postgres:5432/ampci"}},
        "bad-broker": {**common, "command": ["ampci", "worker", "--queues", "cpu"],
                       "environment": {**good, "AMPCI_BROKER_URL": "redis://no-such-broker:6379/0"}},
        "bad-queue": {**common, "command": ["ampci", "worker", "--queues", "cpu-typo"], "environment": good},
    }
    path.write_text(json.dumps({"services": services}, indent=2))  # JSON is YAML
    return path


def test_bad_configuration_is_one_line_in_compose_logs(stack: Stack) -> None:
    bad = _bad_config_file()
    stack.run("up", "-d", "--no-deps", "--no-build", "bad-db-password", "bad-broker", "bad-queue",
              files=[bad], timeout=120)
    expect = {"bad-db-password": "ampci: error: database unavailable at postgresql+psycopg://ampci:***@postgres",
              "bad-broker": "ampci: error: broker unavailable at redis://no-such-broker:6379/0",
              "bad-queue": "ampci: warning: queue 'cpu-typo' has no producer"}

    def said(service: str) -> list[str]:
        lines = [ln.split("|", 1)[-1].strip() for ln in stack.logs(service, files=[bad]).splitlines()]
        return [ln for ln in lines if ln and not ln.startswith("Attaching to")]

    for service, text in expect.items():
        lines = wait_for(f"{service} to say what is wrong", lambda s=service, t=text: (
            [ln for ln in said(s) if ln.startswith(t)] and said(s)), timeout=90)
        assert len([ln for ln in lines if ln.startswith(text)]) == 1, lines
        if service != "bad-queue":  # the two that exit: that one line and nothing else (no traceback)
            assert len(lines) == 1, lines
    assert "password authentication failed" in said("bad-db-password")[0]
    for service in ("bad-db-password", "bad-broker"):
        state = wait_for(f"{service} to exit", lambda s=service: (
            (st := stack.container(s)["State"])["Status"] == "exited" and st), timeout=60)
        assert state["ExitCode"] == 3, (service, state)
    stack.run("rm", "-f", "-s", "bad-db-password", "bad-broker", "bad-queue", files=[bad], timeout=60)


def test_missing_webhook_secret_fails_up_with_one_line(stack: Stack) -> None:
    env = {k: v for k, v in stack.env.items() if k != "AMPCI_WEBHOOK_SECRET"}
    proc = stack.run("up", "-d", "--no-build", check=False, env=env, timeout=60)
    assert proc.returncode != 0
    assert "AMPCI_WEBHOOK_SECRET" in proc.stderr and "is not set" in proc.stderr, proc.stderr
    assert len([ln for ln in proc.stderr.splitlines() if "AMPCI_WEBHOOK_SECRET" in ln]) == 1, proc.stderr
    assert set(stack.health().values()) - {"exited"} == {"healthy"}, "the failed `up` changed the stack"
