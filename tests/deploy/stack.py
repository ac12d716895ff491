"""A docker compose project of this checkout driven from a test: commands, health, bounded waits.

Every call is bounded (``timeout``) and names its own compose project, so the test's containers,
networks and volumes are the only ones touched; :meth:`Stack.down` removes them all (``down -v``).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(what: str, probe: Callable[[], T | None], timeout: float, every: float = 1.0) -> T:
    """Call ``probe`` until it returns something truthy; AssertionError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = probe()
        except Exception as exc:  # noqa: BLE001 - keep polling; the last failure goes into the message
            last = exc
        if last and not isinstance(last, Exception):
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")
        time.sleep(every)


class Stack:
    """One compose project: ``compose`` is the client argv, ``files`` the compose files (in order)."""

    def __init__(self, compose: Sequence[str], project: str, files: Sequence[Path], env: dict[str, str],
                 port: int = 0) -> None:
        self.port = port  # where the API is published on 127.0.0.1
        self.compose = list(compose)
        self.project = project
        self.files = list(files)
        self.env = env

    def argv(self, *args: str, files: Sequence[Path] = ()) -> list[str]:
        """The compose command line for ``args`` (this project, these files)."""
        out = [*self.compose, "-p", self.project]
        for f in [*self.files, *files]:
            out += ["-f", str(f)]
        return [*out, *args]

    def run(self, *args: str, timeout: float = 120.0, check: bool = True, files: Sequence[Path] = (),
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run a compose command in the checkout; raise with its output when ``check`` and it fails."""
        proc = subprocess.run(self.argv(*args, files=files), cwd=ROOT, env=env or self.env, capture_output=True,
                              text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"`compose {' '.join(args)}` exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
        return proc

    def exec(self, service: str, *cmd: str, timeout: float = 120.0, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run ``cmd`` inside the running ``service`` container (no TTY)."""
        return self.run("exec", "-T", service, *cmd, timeout=timeout, check=check)

    def containers(self, all_states: bool = False) -> list[dict[str, Any]]:
        """``docker inspect`` of every container of this project."""
        ids = docker("ps", *(["-a"] if all_states else []), "-q", "--filter",
                     f"label=com.docker.compose.project={self.project}").stdout.split()
        if not ids:
            return []
        return list(json.loads(docker("inspect", *ids).stdout))

    def container(self, service: str) -> dict[str, Any]:
        """The (first) container of ``service``, in any state."""
        for c in self.containers(all_states=True):
            if c["Config"]["Labels"].get("com.docker.compose.service") == service:
                return c
        raise AssertionError(f"no container for service {service}")

    def health(self) -> dict[str, str]:
        """Service -> health status (``healthy``, ``starting``, ``unhealthy``) or state when no check."""
        out: dict[str, str] = {}
        for c in self.containers(all_states=True):
            svc = c["Config"]["Labels"].get("com.docker.compose.service", "?")
            state = c["State"]
            out[svc] = state["Health"]["Status"] if state.get("Health") else state["Status"]
        return out

    def wait_healthy(self, services: Sequence[str], timeout: float) -> float:
        """Wait until every one of ``services`` is healthy; seconds it took."""
        t0 = time.monotonic()
        wait_for(f"healthy {', '.join(services)} ({self.project})",
                 lambda: all(self.health().get(s) == "healthy" for s in services) or None,
                 timeout, every=2.0)
        return time.monotonic() - t0

    def logs(self, *services: str, files: Sequence[Path] = ()) -> str:
        """``compose logs --no-color`` of ``services`` (all when none)."""
        return self.run("logs", "--no-color", *services, check=False, files=files, timeout=60).stdout

    def resources(self) -> dict[str, list[str]]:
        """Containers, volumes and networks labelled with this project (what ``down -v`` must remove)."""
        label = f"label=com.docker.compose.project={self.project}"
        return {"containers": docker("ps", "-a", "-q", "--filter", label).stdout.split(),
                "volumes": docker("volume", "ls", "-q", "--filter", label).stdout.split(),
                "networks": docker("network", "ls", "-q", "--filter", label).stdout.split()}

    def down(self, files: Sequence[Path] = ()) -> None:
        """``down -v --remove-orphans``: the project's containers, networks and volumes go."""
        self.run("down", "-v", "--remove-orphans", "--timeout", "5", check=False, timeout=180, files=files)


def docker(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run a docker CLI command (checked)."""
    proc = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, DOCKER_BUILDKIT="0"))
    if proc.returncode != 0:
        raise AssertionError(f"`docker {' '.join(args)}` exited {proc.returncode}: {proc.stderr.strip()}")
    return proc


#: Where the workers see the stand-in remote of :func:`bare_remote` (a delivery names ``file://`` + this).
REMOTE_IN_CONTAINER = "/srv/pass.git"
SERVICE_UID = 10001  # the image's service user (Dockerfile): git refuses a repository another user owns


def _git(*args: str, cwd: Path | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_AUTHOR_NAME="deploy test", GIT_AUTHOR_EMAIL="deploy@example.invalid",
               GIT_COMMITTER_NAME="deploy test", GIT_COMMITTER_EMAIL="deploy@example.invalid")
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True,
                          timeout=120).stdout.strip()


def bare_remote(where: Path) -> tuple[Path, Path]:
    """A bare clone of this checkout, ``main`` at its HEAD, at ``where/pass.git`` -- the "remote" users push to, since there is no
    network -- owned by the service user, and a compose override mounting it read-only into ``worker-cpu`` at
    :data:`REMOTE_IN_CONTAINER`.  Returns (bare repository, override file)."""
    bare = where / "pass.git"
    _git("clone", "-q", "--bare", "--no-hardlinks", str(ROOT), str(bare))
    _git("update-ref", "refs/heads/main", _git("rev-parse", "HEAD", cwd=ROOT), cwd=bare)  # main: what the image has
    _git("symbolic-ref", "HEAD", "refs/heads/main", cwd=bare)
    override = where / "remote.yml"
    override.write_text(json.dumps({"services": {"worker-cpu": {
        "volumes": [f"{bare}:{REMOTE_IN_CONTAINER}:ro"]}}}))  # JSON is YAML
    _own(bare)
    return bare, override


def push_commit(bare: Path, work: Path, message: str) -> tuple[str, str]:
    """A new commit on ``main`` of ``bare`` (a comment appended to ``amp_pass/__init__.py``), pushed there as a user
    would; returns (the branch's previous head, the new commit)."""
    _own(bare, os.geteuid())  # back to this user first: git refuses a repository another user owns
    _git("clone", "-q", str(bare), str(work))
    before = _git("rev-parse", "HEAD", cwd=work)
    init = work / "amp_pass" / "__init__.py"
    init.write_text(init.read_text() + f"# {message}\n")
    _git("commit", "-q", "-am", message, cwd=work)
    _git("push", "-q", "origin", "HEAD:refs/heads/main", cwd=work)
    _own(bare)
    return before, _git("rev-parse", "HEAD", cwd=work)


def _own(path: Path, uid: int = SERVICE_UID) -> None:
    if os.geteuid() == 0:  # as root: hand it to the containers' service user (else the caller must be that user)
        subprocess.run(["chown", "-R", f"{uid}:{uid}", str(path)], check=True, timeout=60)
