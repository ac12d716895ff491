#!/usr/bin/env python3
"""Bootstrap entry point for a fresh machine that has only python3.

    python3 dev.py sweep     # install into .venv if needed, then run the embedded smoke sweep
    python3 dev.py test      # install into .venv if needed, start PostgreSQL/Redis if down, run pytest
                             # (as root with apt-get: also installs Debian's chromium for the browser tests)
    python3 dev.py test -m "not browser"   # the same without the browser tests: installs no chromium
                             # (as root with apt-get, `test` also installs docker.io, docker-compose and
                             # debootstrap for the deploy test; -m "not deploy" or AMPCI_NO_DOCKER=1: not)
    python3 dev.py typecheck # install into .venv if needed, then mypy as configured in pyproject.toml
                             # ([tool.mypy]: strict on the typed packages); non-zero on a type error
    python3 dev.py docs      # install into .venv if needed, then build the guide (docs/, mkdocs.yml) into site/
                             # with mkdocs --strict: a broken link, a missing anchor or page is non-zero
    python3 dev.py images    # local base images for docker compose without a registry (deploy/images.py)
    python3 dev.py ampci ARGS...   # any ampci command inside the project's virtual environment

The virtual environment lives in ``.venv`` next to this file and is reinstalled only when
``pyproject.toml`` changes (a hash stamp is kept inside the venv).  ``AMPCI_NO_BROWSER=1`` also
skips the chromium install (the browser tests then fail unless deselected).  Standard library only.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
PY = VENV / "bin" / "python"
STAMP = VENV / ".ampci-install-stamp"


def _log(msg: str) -> None:
    print(f"[dev] {msg}", file=sys.stderr, flush=True)


def ensure_venv() -> None:
    """Create .venv and install the project with its dev extras when pyproject.toml changed."""
    want = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if STAMP.exists() and STAMP.read_text().strip() == want and PY.exists():
        return
    if not PY.exists():
        _log("creating virtual environment in .venv")
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    _log("installing ampci and its dependencies (first run only; about a minute)")
    subprocess.run([str(PY), "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True)
    subprocess.run([str(PY), "-m", "pip", "install", "-q", "-e", f"{ROOT}[dev]"], check=True)
    STAMP.write_text(want)


def _port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def _wait_port(port: int, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if _port_open(port):
            return True
        time.sleep(0.3)
    return False


def ensure_services() -> None:
    """Start PostgreSQL (5432) and Redis (6379) with the machine's own commands if they are down."""
    if not _port_open(5432):
        _log("PostgreSQL is not running; starting it")
        versions = sorted(os.listdir("/etc/postgresql")) if os.path.isdir("/etc/postgresql") else []
        if versions and shutil.which("pg_ctlcluster"):
            subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", versions[-1], "main", "start"],
                           check=False)
        if not _wait_port(5432):
            _log("warning: PostgreSQL did not come up on 127.0.0.1:5432; its tests will fail")
    if not _port_open(6379):
        _log("Redis is not running; starting it")
        if shutil.which("redis-server"):
            os.makedirs("/var/lib/redis", exist_ok=True)
            os.makedirs("/var/log/redis", exist_ok=True)
            subprocess.run(["redis-server", "--daemonize", "yes", "--bind", "127.0.0.1", "-::1",
                            "--port", "6379", "--save", "", "--appendonly", "no",
                            "--dir", "/var/lib/redis", "--logfile", "/var/log/redis/ci.log"], check=False)
        if not _wait_port(6379):
            _log("warning: Redis did not come up on 127.0.0.1:6379; its tests will fail")


def ensure_browser() -> None:
    """Install Debian's Chromium (for the dashboard's browser tests) when it is missing; root only."""
    if os.path.exists("/usr/bin/chromium"):
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        _log("warning: /usr/bin/chromium is missing and cannot be installed here; browser tests will fail")
        return
    _log("installing Debian's chromium for the browser tests (once per machine)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-q"], check=False, env=env, stdout=subprocess.DEVNULL)
    subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", "chromium", "chromium-driver"],
                   check=False, env=env, stdout=subprocess.DEVNULL)


def wants_browser(pytest_args: list[str], env: dict[str, str]) -> bool:
    """False when the browser tests are deselected (``-m`` with an expression containing ``not browser``)
    or ``AMPCI_NO_BROWSER`` is set to 1/true/yes: then no chromium is installed."""
    return _wants_marker(pytest_args, env, "browser", "AMPCI_NO_BROWSER")


def wants_docker(pytest_args: list[str], env: dict[str, str]) -> bool:
    """False when the deploy test is deselected (``-m`` ... ``not deploy``) or ``AMPCI_NO_DOCKER`` is
    1/true/yes: then no Docker is installed (the deploy test then skips only with AMPCI_NO_DOCKER=1)."""
    return _wants_marker(pytest_args, env, "deploy", "AMPCI_NO_DOCKER")


def _wants_marker(pytest_args: list[str], env: dict[str, str], marker: str, opt_out: str) -> bool:
    if env.get(opt_out, "").strip().lower() in {"1", "true", "yes"}:
        return False
    for i, arg in enumerate(pytest_args):
        expr = None
        if arg == "-m" and i + 1 < len(pytest_args):
            expr = pytest_args[i + 1]
        elif arg.startswith("-m") and arg != "-m":
            expr = arg[2:].lstrip("=")
        if expr is not None and f"not {marker}" in " ".join(expr.split()):
            return False
    return True


DOCKER_PACKAGES = ("docker.io", "docker-compose", "debootstrap")


def ensure_docker() -> None:
    """Install Debian's docker.io, docker-compose and debootstrap (for the deploy test) when missing;
    root only.  The test itself starts dockerd when no daemon answers."""
    if all(shutil.which(tool) for tool in ("dockerd", "docker", "debootstrap")) and (
            shutil.which("docker-compose") or _docker_compose_plugin()):
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        _log("warning: Docker/debootstrap are missing and cannot be installed here; the deploy test will fail "
             "(AMPCI_NO_DOCKER=1 skips it)")
        return
    _log(f"installing {', '.join(DOCKER_PACKAGES)} for the deploy test (once per machine)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-q"], check=False, env=env, stdout=subprocess.DEVNULL)
    subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *DOCKER_PACKAGES],
                   check=False, env=env, stdout=subprocess.DEVNULL)


def _docker_compose_plugin() -> bool:
    if not shutil.which("docker"):
        return False
    return subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0


def exec_ampci(args: list[str], env: dict[str, str]) -> None:
    """Replace this process with ``ampci ARGS`` (run from the repository root): the command keeps this
    process's PID, so a signal sent to ``dev.py`` (Ctrl-C, ``kill PID`` of ``python3 dev.py ampci serve``)
    reaches ``ampci`` itself and nothing is left running.  Never returns."""
    os.chdir(ROOT)
    ampci = str(VENV / "bin" / "ampci")
    os.execve(ampci, [ampci, *args], env)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in {"-h", "--help"}:
        print(__doc__)
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd == "images":  # standard library only: no virtual environment needed
        return subprocess.run([sys.executable, str(ROOT / "deploy" / "images.py"), *rest], cwd=ROOT).returncode
    ensure_venv()
    env = dict(os.environ)
    if cmd == "test":
        ensure_services()
        if wants_browser(rest, env):
            ensure_browser()
        else:
            _log("browser tests deselected or AMPCI_NO_BROWSER=1: not installing chromium")
        if wants_docker(rest, env):
            ensure_docker()
        else:
            _log("deploy test deselected or AMPCI_NO_DOCKER=1: not installing Docker")
        env.setdefault("AMPCI_TEST_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
        env.setdefault("AMPCI_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
        proc = subprocess.run([str(PY), "-m", "pytest", *rest], cwd=ROOT, env=env)
        return proc.returncode
    if cmd == "typecheck":
        return subprocess.run([str(PY), "-m", "mypy", *rest], cwd=ROOT, env=env).returncode
    if cmd == "docs":
        env.setdefault("NO_MKDOCS_2_WARNING", "1")  # Material's notice about MkDocs 2, printed on every build
        return subprocess.run([str(PY), "-m", "mkdocs", "build", "--strict", "--site-dir", str(ROOT / "site"), *rest],
                              cwd=ROOT, env=env).returncode
    if cmd in {"sweep", "ampci"}:
        exec_ampci(["sweep", *rest] if cmd == "sweep" else rest, env)
    print(f"dev.py: unknown command {cmd!r} (expected test, typecheck, docs, sweep, images or ampci)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
