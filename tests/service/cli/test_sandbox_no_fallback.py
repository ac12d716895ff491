"""``ampci serve``/``ampci worker`` never fall back to best-effort (issue 40): on a machine that cannot make the
sandbox's namespaces (here: root without ``CAP_SYS_ADMIN``, as in a default container) they refuse to start with
one line whether ``AMPCI_SANDBOX`` is unset or ``auto``; only ``best-effort`` by name runs the pass without
namespaces."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from service.cli.sandbox_check import require_sandbox_by_default

ROOT = Path(__file__).resolve().parents[3]
no_sys_admin = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                                  reason="dropping CAP_SYS_ADMIN from a child needs root and setpriv")


@pytest.mark.parametrize("value,mode", [(None, "require"), ("auto", "require"), ("AUTO", "require"),
                                        ("require", "require"), ("best-effort", "best-effort")])
def test_serve_and_worker_take_require_unless_best_effort_is_named(monkeypatch: pytest.MonkeyPatch,
                                                                   value: str | None, mode: str) -> None:
    if value is None:
        monkeypatch.delenv("AMPCI_SANDBOX", raising=False)
    else:
        monkeypatch.setenv("AMPCI_SANDBOX", value)
    assert require_sandbox_by_default() == mode and os.environ["AMPCI_SANDBOX"] == mode


@no_sys_admin
@pytest.mark.parametrize("value", [None, "auto"], ids=["unset", "auto"])
@pytest.mark.parametrize("command", ["worker", "serve"])
def test_without_namespaces_serve_and_worker_refuse_rather_than_fall_back(tmp_path: Path, value: str | None,
                                                                          command: str,
                                                                          request: pytest.FixtureRequest) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMPCI_")}
    env.update(AMPCI_DATA_DIR=str(tmp_path / "data"), AMPCI_CACHE_DIR=str(tmp_path / "cache"),
               AMPCI_INSECURE_DEV="1")
    if command == "worker":  # it checks its broker first: a live one
        env["AMPCI_BROKER_URL"] = request.getfixturevalue("redis_url")
    if value is not None:
        env["AMPCI_SANDBOX"] = value
    argv = [command] if command == "worker" else [command, "--port", "0", "--no-migrate"]
    proc = subprocess.run(["setpriv", "--bounding-set=-sys_admin", "--inh-caps=-sys_admin", sys.executable, "-m",
                           "service.cli.main", *argv], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "AMPCI_SANDBOX=require but the pass sandbox cannot be made here" in lines[0], lines
