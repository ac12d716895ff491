"""Know before you run (issue 39): ``ampci serve``/``worker`` refuse to start, and embedded ``sweep``/``check``
stop before their first job, with one line, where the sandbox canary fails (``/healthz``:
``tests/service/api/test_healthz_sandbox.py``).

The canary is made to fail for real: a sandbox whose process limit (``AMPCI_SANDBOX_MAX_PROCS=1``) leaves its
pass process no conversion to fork."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from workers.sandbox import policy as sb

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.skipif(sb.full_sandbox_error(sb.SandboxPolicy()) is not None,
                                reason=f"no full sandbox here: {sb.full_sandbox_error(sb.SandboxPolicy())}")
LINE = ("ampci: error: the pass sandbox failed its canary conversion (error): infrastructure: the pass sandbox "
        "could not be made")


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMPCI_")}
    env.update(AMPCI_DATA_DIR=str(tmp_path / "data"), AMPCI_CACHE_DIR=str(tmp_path / "cache"),
               AMPCI_SANDBOX="require", AMPCI_SANDBOX_MAX_PROCS="1", **extra)
    return env


def _ampci(tmp_path: Path, *argv: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "service.cli.main", *argv], cwd=ROOT, env=_env(tmp_path, **extra),
                          capture_output=True, text=True, timeout=300)


@pytest.mark.redis
def test_worker_refuses_to_start_in_one_line(tmp_path: Path, redis_url: str) -> None:
    proc = _ampci(tmp_path, "worker", AMPCI_BROKER_URL=redis_url)
    assert proc.returncode == 3, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(LINE), lines


def test_embedded_serve_refuses_to_start_in_one_line(tmp_path: Path) -> None:
    proc = _ampci(tmp_path, "serve", "--port", "0", AMPCI_INSECURE_DEV="1")
    assert proc.returncode == 3, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(LINE), lines


@pytest.mark.parametrize("argv", [["sweep"], ["check", "conv_net"]], ids=["sweep", "check"])
def test_embedded_commands_stop_before_the_first_job(tmp_path: Path, argv: list[str]) -> None:
    proc = _ampci(tmp_path, *argv)
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(LINE), proc.stderr
    assert "run 1:" not in proc.stderr  # nothing was dispatched
