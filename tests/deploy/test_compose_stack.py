"""End to end: the compose stack of this checkout is built, started and driven on this machine.

Builds the local base images (deploy/images.py: Debian packages, no registry) and the ampci image,
starts the CPU stack under a project name of its own with the API published on a free port of
127.0.0.1, and checks what a user relies on: a signed push and pull request become runs that finish
on ``worker-cpu`` with 6 results (the pull request against the base tip), results and regressions
read back through ``GET /api/runs/{id}`` and the ``ampci`` CLI inside the api container, a worker
container killed mid-job has its job redelivered and the run still ends with one result per cell,
a Redis restart loses no queued job, ``/healthz`` names the dependency that is down, bad
configuration is one line in ``docker compose logs``, the stack's image started against a checkout whose code
changed since the build refuses with one line, and ``down -v`` leaves nothing behind.  The credentials reach the api container alone, a worker
container can make the full pass sandbox (deploy/seccomp-worker.json), and a hostile pass revision
run through the stack reaches neither PostgreSQL nor Redis nor the API from its conversion.

Docker is required: when no daemon can be started the test fails, unless ``AMPCI_NO_DOCKER=1`` is set
(then it is skipped, saying so).  Timings go to ``artifacts/deploy_timings.json``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

import service.settings as settings_module
from deploy.images import LOCAL_OVERRIDE, build_base_images, compose_command, docker_env, ensure_dockerd
from deploy.source_digest import CHECKOUT, EXIT_STALE, SOURCE_PATHS
from tests.deploy.stack import (
    REMOTE_IN_CONTAINER,
    ROOT,
    Stack,
    bare_remote,
    docker,
    free_port,
    push_commit,
    wait_for,
)
from tests.service.api.helpers import encode, pr_payload, push_payload, webhook_headers

pytestmark = [pytest.mark.deploy, pytest.mark.slow]

SECRET = "deploy-test-secret"
REPO = "acme/amp-pass"
CELLS = 6  # sweeps/smoke.toml: 3 smoke models x fp16/bf16 x default x cpu
HEALTHY = ("postgres", "redis", "api", "beat", "worker-cpu")
AMPCI_SERVICES = ("migrate", "api", "beat", "worker-cpu")  # the CPU stack's services built from the Dockerfile
API_TOKEN = "deploy-test-api-token"
GITHUB_TOKEN = "ghs_" + "D" * 36
CREDENTIALS = set(settings_module.CREDENTIALS)
#: Why the worker's pass sandbox cannot be made, with the worker's own policy ("None": it can).
SANDBOX_PROBE = ("from service.settings import Settings; from workers.sandbox.policy import full_sandbox_error; "
                 "print(full_sandbox_error(Settings.from_env().worker_config().sandbox_policy()))")
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
def remote(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The users' remote: a bare repository of this checkout, mounted into worker-cpu (see :func:`bare_remote`)."""
    return bare_remote(tmp_path_factory.mktemp("remote"))


@pytest.fixture(scope="module")
def stack(remote: tuple[Path, Path]) -> Iterator[Stack]:
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
               AMPCI_TRACKED_BRANCHES="main", AMPCI_API_TOKEN=API_TOKEN, AMPCI_GITHUB_TOKEN=GITHUB_TOKEN,
               AMPCI_GITHUB_API_URL="http://127.0.0.1:9",  # statuses go nowhere (refused at once)
               AMPCI_PASS_REPO_ALLOW_FILE="true")  # the "remote" is a bare repository mounted as file://
    project = f"ampcitest{uuid.uuid4().hex[:10]}"
    # The image under a tag of this run's own: ampci:latest is shared by every checkout on the machine, and a
    # concurrent build from another one would swap the code under this stack (its containers would then refuse
    # to start: deploy/source_digest.py).
    tagged = remote[1].parent / "image.yml"
    tagged.write_text(json.dumps({"services": {s: {"image": _image(project)} for s in AMPCI_SERVICES}}))
    st = Stack(compose, project, [ROOT / "docker-compose.yml", LOCAL_OVERRIDE, remote[1], tagged], env, port=port)
    try:
        t1 = time.monotonic()
        st.run("build", "migrate", timeout=1500)  # api, beat and worker-cpu share this image
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
            st.down(files=[_bad_config_file(_image(project))])
            left = st.resources()
            # the run's tag goes; its layers stay (--no-prune) as the next build's cache
            subprocess.run(["docker", "rmi", "--no-prune", _image(project)], capture_output=True, timeout=120)
            TIMINGS["test total"] = round(time.monotonic() - t0, 1)
            out = ROOT / "artifacts" / "deploy_timings.json"
            out.parent.mkdir(exist_ok=True)
            out.write_text(json.dumps(TIMINGS, indent=2) + "\n")
            assert not any(left.values()), f"`down -v` left resources of {project}: {left}"


def _image(project: str) -> str:
    """The ampci image of the test's compose project (a tag of its own, see the ``stack`` fixture)."""
    return f"{project}-ampci:latest"


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
    # -- the credentials reach the api alone (not the workers, which run untrusted pass code, nor beat)
    for service in ("worker-cpu", "beat"):
        names = {ln.split("=", 1)[0] for ln in stack.exec(service, "env").stdout.splitlines()}
        assert not names & CREDENTIALS, f"{service} has {sorted(names & CREDENTIALS)}"
    api_env = stack.exec("api", "env").stdout.splitlines()
    for line in (f"AMPCI_WEBHOOK_SECRET={SECRET}", f"AMPCI_API_TOKEN={API_TOKEN}", f"AMPCI_GITHUB_TOKEN={GITHUB_TOKEN}"):
        assert line in api_env, f"{line.split('=')[0]} did not reach the api"
    # -- the worker makes the full pass sandbox (AMPCI_SANDBOX=require would refuse conversions otherwise)
    t_probe = time.monotonic()
    probe = stack.exec("worker-cpu", "python3", "-c", SANDBOX_PROBE).stdout.strip()
    TIMINGS["sandbox probe"] = round(time.monotonic() - t_probe, 1)
    assert probe == "None", f"worker-cpu cannot make the full pass sandbox: {probe}"
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


def test_a_commit_pushed_after_the_build_is_cloned_from_the_repository_that_sent_it(
        stack: Stack, remote: tuple[Path, Path], tmp_path: Path) -> None:
    """AMPCI_PASS_REPO unset (the compose default): a push of a commit made after the images were built -- unknown to
    /app -- is fetched by worker-cpu from the delivery's repository and gets its 6 results."""
    before, after = push_commit(remote[0], tmp_path / "work", "a commit made after the images were built")
    known = stack.exec("worker-cpu", "git", "-C", "/app", "cat-file", "-e", f"{after}^{{commit}}", check=False)
    assert known.returncode != 0, "the new commit is in the image: the test would prove nothing"
    t0 = time.monotonic()
    payload = push_payload(after, before=before, repo=REPO)
    payload["repository"]["clone_url"] = f"file://{REMOTE_IN_CONTAINER}"
    _webhook(stack, "push", payload)
    run_id = _run_of(stack, after, "push")
    detail = _finished(stack, run_id, timeout=420)  # (run alone: after a baseline run of `before`, 6 more jobs)
    TIMINGS["webhook to 6 results (commit pushed after the build)"] = round(time.monotonic() - t0, 1)
    _check_complete(detail)
    assert detail["run"]["meta"]["pass_repo"]["url"] == f"file://{REMOTE_IN_CONTAINER}"


#: A pass revision that tries the stack's services from its conversion, then fails with one line of findings.
_HOSTILE_MAIN = """import json, os, socket, sys

found = {"connected": [], "failed": {}, "ampci_env": sorted(k for k in os.environ if k.startswith("AMPCI_"))}
found["pids"] = len([p for p in os.listdir("/proc") if p.isdigit()]) if os.path.isdir("/proc") else 0
found["fds"] = len(os.listdir("/proc/self/fd")) - 1 if os.path.isdir("/proc/self/fd") else -1
found["no_new_privs"] = next((line.split()[1] for line in open("/proc/self/status") if line.startswith("NoNewPrivs")),
                             "?") if os.path.exists("/proc/self/status") else "no /proc"
import ctypes, platform
nr = {"x86_64": 248, "aarch64": 217}.get(platform.machine())
found["add_key"] = nr is not None and ctypes.CDLL(None, use_errno=True).syscall(nr, b"user", b"p", b"x", 1, -4) >= 0
for host, port in TARGETS:
    try:
        socket.create_connection((host, port), timeout=3).close()
        found["connected"].append(f"{host}:{port}")
    except OSError as exc:
        found["failed"][f"{host}:{port}"] = type(exc).__name__
print("FINDINGS " + json.dumps(found, sort_keys=True), file=sys.stderr)
sys.exit(1)
"""


def _commit_hostile_revision(stack: Stack, services: tuple[str, ...], targets: list[tuple[str, int]]) -> str:
    """The same commit (fixed dates and author: the same sha) on branch ``hostile-pass`` of ``/app`` -- the
    pass repository -- in each of ``services``: HEAD with ``amp_pass/__main__.py`` replaced by the hostile one.
    A clone is edited and pushed back, so /app's own checkout (the installed code) is left alone."""
    main = f"TARGETS = {targets!r}\n" + _HOSTILE_MAIN
    script = (
        'set -e; d=$(mktemp -d); git clone -q /app "$d/p"; cd "$d/p"; printf "%s" "$MAIN" > amp_pass/__main__.py; '
        "git add amp_pass/__main__.py; "
        "export GIT_AUTHOR_NAME=hostile GIT_AUTHOR_EMAIL=hostile@example.invalid GIT_COMMITTER_NAME=hostile "
        "GIT_COMMITTER_EMAIL=hostile@example.invalid GIT_AUTHOR_DATE=2024-01-01T00:00:00Z "
        "GIT_COMMITTER_DATE=2024-01-01T00:00:00Z; "
        'git commit -q -m "a hostile pass"; git push -q -f origin HEAD:refs/heads/hostile-pass; '
        'git rev-parse HEAD; rm -rf "$d"')
    shas = {stack.exec(svc, "env", f"MAIN={main}", "sh", "-c", script).stdout.strip() for svc in services}
    assert len(shas) == 1, f"the hostile commit differs between {services}: {shas}"
    return shas.pop()


def test_a_hostile_pass_revision_reaches_no_service(stack: Stack) -> None:
    """Its conversions (in worker-cpu's pass sandbox) connect to neither PostgreSQL, Redis nor the API, by name
    or by address, see no AMPCI_* setting and no process of the worker; the run still ends with 6 results."""
    resolve = "import socket, sys; print(' '.join(socket.gethostbyname(h) for h in sys.argv[1:]))"
    pg_ip, redis_ip, api_ip = stack.exec("worker-cpu", "python3", "-c", resolve, "postgres", "redis", "api").stdout.split()
    targets = [("postgres", 5432), ("redis", 6379), ("api", 8000), (pg_ip, 5432), (redis_ip, 6379), (api_ip, 8000)]
    # the worker itself reaches them (the network is there; the sandbox is what shuts it)
    reach = "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5).close()"
    for host, port in targets[:3]:
        stack.exec("worker-cpu", "python3", "-c", reach, host, str(port))
    head = stack.exec("api", "git", "-C", "/app", "rev-parse", "HEAD").stdout.strip()
    sha = _commit_hostile_revision(stack, ("api", "beat", "worker-cpu"), targets)
    t0 = time.monotonic()
    _webhook(stack, "pull_request", pr_payload(sha, head, number=31, repo=REPO))
    run_id = _run_of(stack, sha, "pull_request")
    detail = _finished(stack, run_id, timeout=300)
    TIMINGS["webhook to 6 results (hostile pull request)"] = round(time.monotonic() - t0, 1)
    results = [c["result"] for c in detail["cells"] if c.get("result")]
    assert len(results) == CELLS, f"{len(results)} results: {detail['summary']}"
    for r in results:
        assert r["status"] == "convert_error" and "FINDINGS " in r["message"], (r["status"], r["message"])
        found = json.loads(r["message"].split("FINDINGS ", 1)[1])
        assert found["connected"] == [], f"the pass reached {found['connected']} from worker-cpu"
        assert sorted(found["failed"]) == sorted(f"{h}:{p}" for h, p in targets), found
        assert found["ampci_env"] == [], found
        assert found["pids"] <= 2, f"the pass saw {found['pids']} processes"
        # round 2 (issue 40): no keyring key, no descriptor but its stdio, no privilege to gain
        assert found["add_key"] is False and found["fds"] <= 3, found
        assert found["no_new_privs"] in ("1", "no /proc"), found


def _bad_config_file(image: str) -> Path:
    """A compose override with four misconfigured services of ``image`` (written next to the test's other files)."""
    path = ROOT / "artifacts" / "deploy-bad-config.yml"
    path.parent.mkdir(exist_ok=True)
    common = {"image": image, "restart": "no"}
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["worker-cpu"]
    worker = {**common, "security_opt": compose["security_opt"], "cap_drop": compose["cap_drop"]}
    good = {"AMPCI_DATABASE_URL": "postgresql+psycopg://ampci:ampci@postgres:5432/ampci",
            "AMPCI_BROKER_URL": "redis://redis:6379/0"}
    services = {
        "bad-db-password": {**common, "command": ["ampci", "db", "upgrade"],
                            "environment": {**good, "AMPCI_DATABASE_URL":
                                            "postgresql+psycopg://ampci:wrong-password@postgres:5432/ampci"}},
        "bad-broker": {**worker, "command": ["ampci", "worker", "--queues", "cpu"],
                       "environment": {**good, "AMPCI_BROKER_URL": "redis://no-such-broker:6379/0"}},
        "bad-queue": {**worker, "command": ["ampci", "worker", "--queues", "cpu-typo"], "environment": good},
        # a worker without the seccomp profile of docker-compose.yml cannot make the pass sandbox
        "no-sandbox": {**common, "command": ["ampci", "worker", "--queues", "cpu"], "environment": good},
    }
    path.write_text(json.dumps({"services": services}, indent=2))  # JSON is YAML
    return path


def test_bad_configuration_is_one_line_in_compose_logs(stack: Stack) -> None:
    bad = _bad_config_file(_image(stack.project))
    bad_services = ("bad-db-password", "bad-broker", "bad-queue", "no-sandbox")
    stack.run("up", "-d", "--no-deps", "--no-build", *bad_services, files=[bad], timeout=120)
    expect = {"bad-db-password": "ampci: error: database unavailable at postgresql+psycopg://ampci:***@postgres",
              "bad-broker": "ampci: error: broker unavailable at redis://no-such-broker:6379/0",
              "bad-queue": "ampci: warning: queue 'cpu-typo' has no producer",
              "no-sandbox": "ampci: error: AMPCI_SANDBOX=require but the pass sandbox cannot be made here"}

    def said(service: str) -> list[str]:
        lines = [ln.split("|", 1)[-1].strip() for ln in stack.logs(service, files=[bad]).splitlines()]
        return [ln for ln in lines if ln and not ln.startswith("Attaching to")]

    for service, text in expect.items():
        lines = wait_for(f"{service} to say what is wrong", lambda s=service, t=text: (
            [ln for ln in said(s) if ln.startswith(t)] and said(s)), timeout=90)
        assert len([ln for ln in lines if ln.startswith(text)]) == 1, lines
        if service != "bad-queue":  # those that exit: that one line and nothing else (no traceback)
            assert len(lines) == 1, lines
    assert "password authentication failed" in said("bad-db-password")[0]
    assert "deploy/seccomp-worker.json" in said("no-sandbox")[0]  # what to enable
    for service, code in (("bad-db-password", 3), ("bad-broker", 3), ("no-sandbox", 2)):
        state = wait_for(f"{service} to exit", lambda s=service: (
            (st := stack.container(s)["State"])["Status"] == "exited" and st), timeout=60)
        assert state["ExitCode"] == code, (service, state)
    stack.run("rm", "-f", "-s", *bad_services, files=[bad], timeout=60)


def test_a_stale_image_refuses_to_start(stack: Stack, tmp_path: Path) -> None:
    """The stack's image started because it matches this checkout (deploy/source_digest.py); against a checkout
    whose code changed after the build, the same image, started as compose starts it, refuses with one line."""
    api = stack.container("api")
    assert api["Config"]["Entrypoint"][:4] == ["python3", "/app/deploy/source_digest.py", "run", str(CHECKOUT)]
    mounts = {m["Destination"]: m for m in api["Mounts"]}
    for rel in SOURCE_PATHS:
        assert mounts[f"{CHECKOUT}/{rel}"]["RW"] is False, rel
    assert "/srv/ampci-checkout/.env" not in mounts and not any(m["Source"] == str(ROOT) for m in mounts.values())
    moved_on = tmp_path / "checkout"
    moved_on.mkdir()
    moved_on.chmod(0o755)
    shutil.copytree(ROOT / "service", moved_on / "service", ignore=shutil.ignore_patterns("__pycache__"))
    settings_py = moved_on / "service" / "settings.py"
    settings_py.write_text(settings_py.read_text() + "# changed after the image was built\n")
    volumes = [arg for rel in SOURCE_PATHS
               for arg in ("-v", f"{moved_on / rel if rel == 'service' else ROOT / rel}:{CHECKOUT}/{rel}:ro")]
    # the image of the running stack, by id
    stale = subprocess.run(["docker", "run", "--rm", "--network", "none", *volumes, "--entrypoint", "python3",
                            api["Image"], *api["Config"]["Entrypoint"][1:], "ampci", "--help"],
                           capture_output=True, text=True, timeout=120)
    assert stale.returncode == EXIT_STALE and stale.stdout == "", stale.stdout
    [line] = stale.stderr.splitlines()
    assert line.startswith("ampci: error: this image was built from other code than the checkout"), line
    assert "(differs: service)" in line and "docker compose up -d --build" in line


def test_missing_webhook_secret_fails_up_with_one_line(stack: Stack) -> None:
    env = {k: v for k, v in stack.env.items() if k != "AMPCI_WEBHOOK_SECRET"}
    proc = stack.run("up", "-d", "--no-build", check=False, env=env, timeout=60)
    assert proc.returncode != 0
    assert "AMPCI_WEBHOOK_SECRET" in proc.stderr and "is not set" in proc.stderr, proc.stderr
    assert len([ln for ln in proc.stderr.splitlines() if "AMPCI_WEBHOOK_SECRET" in ln]) == 1, proc.stderr
    assert set(stack.health().values()) - {"exited"} == {"healthy"}, "the failed `up` changed the stack"
