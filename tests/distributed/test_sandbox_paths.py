"""A hostile pass revision swept through the local pool and through a real Celery worker (issue 31).

The worker runs with a deployment's secrets in its environment and real PostgreSQL and Redis beside it; the pass
tries to read them, to connect to PostgreSQL and Redis, to write into the cache and data directories, and to
leave a daemon.  Every attempt fails, the job ends ``convert_error`` with a redacted message, and nothing of it
is left running.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from service.orchestration import scheduler
from service.settings import Settings
from tests.distributed.conftest import git
from tests.distributed.procs import ROOT
from tests.workers.hostile import FAKE_TOKEN, findings, hostile_pass, processes_with
from workers.revision.revisions import RevisionCache
from workers.sandbox import policy as sb

pytestmark = [pytest.mark.slow, pytest.mark.skipif(sb.full_sandbox_error(sb.SandboxPolicy()) is not None,
                                                    reason="no full sandbox on this machine")]
SECRETS = {"AMPCI_WEBHOOK_SECRET": "whsec-pool-0123456789", "AMPCI_API_TOKEN": "api-pool-0123456789",
           "AMPCI_GITHUB_TOKEN": "ghs_" + "Q" * 36}


@pytest.fixture
def host_socket() -> Iterator[Path]:
    """A unix socket a host process listens on, by path, in a world-writable directory outside ``/run``,
    ``/var/run`` and ``/tmp`` (which the sandbox covers): only the system-call filter keeps the pass from it."""
    where = Path(tempfile.mkdtemp(prefix="ampci-hostile-", dir="/var/tmp"))
    where.chmod(0o777)
    path = where / "s"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    path.chmod(0o777)
    server.listen(16)
    try:
        yield path
    finally:
        server.close()
        shutil.rmtree(where, ignore_errors=True)


def _check(message: str, victims: list[Path], mark: str) -> None:
    got = findings(message)
    assert got["ampci_env"] == [] and got["connected"] == [] and got["wrote"] == [], got
    assert got["sockets_inherited"] == 0 and got["pids_seen"] <= 3, got
    # round 2 (issue 40): no keyring key, no host socket by path, nothing of ampci's directories, no descriptor but
    # its stdio, no way to gain privileges
    assert got.get("add_key") is not True and got["unix_connected"] == [] and got["listed"] == [], got
    assert got["fds"] <= 3 and got["no_new_privs"] == "1", got
    assert all(v.read_text() == "clean\n" for v in victims if v.exists())
    assert FAKE_TOKEN not in message and not any(v in message for v in SECRETS.values())
    deadline = time.monotonic() + 5
    while processes_with(mark) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_with(mark) == []


def test_hostile_pass_through_the_local_pool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            host_socket: Path) -> None:
    for k, v in SECRETS.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("AMPCI_SANDBOX", "require")
    settings = Settings.from_env({"AMPCI_DATA_DIR": str(tmp_path / "data"), "AMPCI_CACHE_DIR": str(tmp_path / "cache"),
                                  "AMPCI_SANDBOX": "require", **SECRETS})
    (tmp_path / "data").mkdir()
    (tmp_path / "cache").mkdir()
    victims = [tmp_path / "data" / "victim.txt", tmp_path / "cache" / "victim.txt"]
    for v in victims:
        v.write_text("clean\n")
    mark = "4244.7"
    tree = hostile_pass(tmp_path / "tree", [5432, 6379], victims, mark, unix_paths=[host_socket])
    store = scheduler.open_store(settings)
    key = RevisionCache.from_config(settings.worker_config()).snapshot(tree)
    run_id = store.create_run(key, "manual", None, "t", [("conv_net", "fp16", "default", "cpu")])
    pool = scheduler.LocalPool(settings, store, workers=1)
    try:
        pool.submit(store.jobs(run_id))
        run = scheduler.wait_for_run(store, run_id, poll=60, timeout=240, wake=pool.wait_for_change)
    finally:
        pool.close()
    assert run.status == "complete"
    (result,) = store.results(run_id=run_id)
    assert result.status == "convert_error", result.message
    _check(result.message, victims, mark)


def test_hostile_pass_through_a_celery_worker(tmp_path: Path, cluster_env: dict[str, str], start_worker,
                                             host_socket: Path) -> None:
    repo = tmp_path / "hostile-repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "README").write_text("base\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    cache, data = Path(cluster_env["AMPCI_CACHE_DIR"]), Path(cluster_env["AMPCI_DATA_DIR"])
    cache.mkdir(parents=True, exist_ok=True)
    data.mkdir(parents=True, exist_ok=True)
    victims = [cache / "victim.txt", data / "victim.txt"]
    for v in victims:
        v.write_text("clean\n")
    mark = "4245.3"
    redis_port = int(cluster_env["AMPCI_BROKER_URL"].rsplit(":", 1)[1].split("/")[0])
    hostile_pass(repo, [5432, 6379, redis_port], victims, mark, unix_paths=[host_socket])
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "hostile")
    sweep = tmp_path / "one.toml"
    sweep.write_text('name = "one"\nmodels = ["conv_net"]\ndtypes = ["fp16"]\npolicies = ["default"]\n'
                     'targets = ["cpu"]\nrepeats = 6\n')
    env = {**cluster_env, **SECRETS, "AMPCI_PASS_REPO": str(repo), "AMPCI_JOB_TIMEOUT": "120s"}
    worker = start_worker("hostile", queues="cpu", extra_env=env, use_cli=True)
    worker.wait_ready()
    proc = subprocess.run([sys.executable, "-m", "service.cli.main", "sweep", "--config", str(sweep), "--revision",
                           "main", "--no-baseline-run", "--json", "--timeout", "240"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    run_id = json.loads(proc.stdout)["run"]["id"]
    eng = sa.create_engine(env["AMPCI_DATABASE_URL"])
    with eng.connect() as c:
        rows = c.execute(sa.text("select status, data from results where run_id = :r"), {"r": run_id}).all()
    eng.dispose()
    assert len(rows) == 1 and rows[0].status == "convert_error"
    data_ = rows[0].data if isinstance(rows[0].data, dict) else json.loads(rows[0].data)
    _check(data_["message"], victims, mark)
