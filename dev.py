#!/usr/bin/env python3
"""Bootstrap entry point for a fresh machine that has only python3.

    python3 dev.py sweep     # install into .venv if needed, then run the embedded smoke sweep
    python3 dev.py test      # install into .venv if needed, start PostgreSQL/Redis if down, run pytest
                             # (as root with apt-get: also installs Debian's chromium for the browser tests)
    python3 dev.py test -m "not browser"   # the same without the browser tests: installs no chromium
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
    if env.get("AMPCI_NO_BROWSER", "").strip().lower() in {"1", "true", "yes"}:
        return False
    for i, arg in enumerate(pytest_args):
        expr = None
        if arg == "-m" and i + 1 < len(pytest_args):
            expr = pytest_args[i + 1]
        elif arg.startswith("-m") and arg != "-m":
            expr = arg[2:].lstrip("=")
        if expr is not None and "not browser" in " ".join(expr.split()):
            return False
    return True


def main(argv: list[str]) -> int:
    if not argv or argv[0] in {"-h", "--help"}:
        print(__doc__)
        return 0
    cmd, rest = argv[0], argv[1:]
    ensure_venv()
    env = dict(os.environ)
    if cmd == "test":
        ensure_services()
        if wants_browser(rest, env):
            ensure_browser()
        else:
            _log("browser tests deselected or AMPCI_NO_BROWSER=1: not installing chromium")
        env.setdefault("AMPCI_TEST_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
        env.setdefault("AMPCI_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
        proc = subprocess.run([str(PY), "-m", "pytest", *rest], cwd=ROOT, env=env)
        return proc.returncode
    if cmd == "sweep":
        return subprocess.run([str(VENV / "bin" / "ampci"), "sweep", *rest], cwd=ROOT, env=env).returncode
    if cmd == "ampci":
        return subprocess.run([str(VENV / "bin" / "ampci"), *rest], cwd=ROOT, env=env).returncode
    print(f"dev.py: unknown command {cmd!r} (expected test, sweep or ampci)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
