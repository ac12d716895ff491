"""``ampci sweep`` (embedded mode) adopts the jobs of local runs whose owner process is gone, as
``ampci serve`` and ``ampci reconcile --resume`` do, and never those of a live owner.

Real processes throughout: a first ``ampci sweep`` is SIGKILLed (with its worker subprocesses, by its
process group) while a job runs; a second ``ampci sweep`` on the same SQLite database finishes the dead
sweep's run besides its own, and leaves alone a run owned by a live process (a ``sleep`` started here).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from service.db import models as m
from service.orchestration import orphans, scheduler
from service.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
SWEEP = """name = "adopt"
models = ["conv_net"]
dtypes = ["fp16", "bf16"]
policies = ["default"]
targets = ["cpu"]
repeats = 6
"""


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMPCI_")}
    env.update(AMPCI_DATA_DIR=str(tmp_path / "data"), AMPCI_CACHE_DIR=str(tmp_path / "cache"),
               AMPCI_JOB_TIMEOUT="120")
    return env


def _sweep(tmp_path: Path, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as fh:
        return subprocess.Popen([sys.executable, "-m", "service.cli.main", "sweep", "--config",
                                 str(tmp_path / "adopt.toml"), "--no-baseline-run", "--workers", "1", "--json"],
                                cwd=ROOT, env=_env(tmp_path), stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _owner(store: Any, run_id: int) -> Any:
    return orphans.owner_of(store, run_id)


def test_a_sweep_adopts_a_killed_sweeps_jobs_but_never_a_live_owners(tmp_path: Path) -> None:
    (tmp_path / "adopt.toml").write_text(SWEEP)
    settings = Settings(data_dir=tmp_path / "data", cache_dir=tmp_path / "cache")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        first = _sweep(tmp_path, tmp_path / "first.log")
        procs.append(first)
        deadline = time.monotonic() + 180
        store = None
        while True:  # until the first sweep's run exists and one of its jobs runs
            assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            assert time.monotonic() < deadline, (tmp_path / "first.log").read_text()[-3000:]
            if (tmp_path / "data").is_dir() and store is None:
                try:
                    store = scheduler.open_store(settings)
                except Exception:  # noqa: BLE001 - created by the sweep meanwhile
                    store = None
            runs = store.list_runs(limit=5) if store is not None else []
            if runs and any(j.status == "running" for j in store.jobs(runs[0].id)):
                break
            time.sleep(0.1)
        dead_run = runs[0].id
        assert _owner(store, dead_run)["pid"] == first.pid  # it recorded itself as the owner
        os.killpg(first.pid, signal.SIGKILL)  # the sweep and its worker subprocesses, no clean-up at all
        first.wait(30)
        assert {j.status for j in store.jobs(dead_run)} == {"running", "queued"}

        # a run owned by a live process of this host (its jobs must never be taken)
        sleeper = subprocess.Popen(["sleep", "600"])
        procs.append(sleeper)
        live_run = store.create_run(runs[0].revision_sha, "manual", None, "adopt",
                                    [("conv_net", "fp16", "default", "cpu")], dispatch="local")
        with store.transaction() as conn:
            conn.execute(m.Run.__table__.update().where(m.Run.__table__.c.id == live_run).values(
                local_owner={"host": socket.gethostname(), "pid": sleeper.pid,
                             "start": orphans._start_time(sleeper.pid)}))

        second = _sweep(tmp_path, tmp_path / "second.log")
        procs.append(second)
        rc = second.wait(400)
        log = (tmp_path / "second.log").read_text()
        assert rc == 0, log[-3000:]
        assert f"adopted run {dead_run}:" in log and "owner" in log and "dead" in log
        out = json.loads(log[log.index("{\n"):])
        assert out["adopted_runs"] == [dead_run]
        own_run = out["run"]["id"]
        assert own_run not in (dead_run, live_run)

        jobs = store.jobs(dead_run)  # finished by the second sweep, each job once more at most
        assert {j.status for j in jobs} == {"done"}, jobs
        assert sorted(j.attempts for j in jobs) == [1, 2]  # the killed attempt counts
        assert store.get_run(dead_run).finished_at is not None
        assert _owner(store, dead_run)["pid"] == second.pid
        assert {j.status for j in store.jobs(own_run)} == {"done"}

        assert [j.status for j in store.jobs(live_run)] == ["queued"]  # the live owner's run is untouched
        assert _owner(store, live_run)["pid"] == sleeper.pid
        assert "Traceback" not in log
        store.dispose()
    finally:
        for proc in procs:  # ours only, by pid (a sweep with its session's worker subprocesses)
            if proc.poll() is None:
                if proc.args[0] == sys.executable:
                    os.killpg(proc.pid, signal.SIGKILL)
                else:
                    proc.kill()
                proc.wait(30)


def test_interrupting_a_sweep_hands_adopted_runs_back_instead_of_cancelling_them(tmp_path: Path) -> None:
    """Ctrl-C (``LocalPool.cancel``) ends the sweep's own run but leaves an adopted run's jobs ``queued``
    and released, for the next process."""
    from workers.revision.revisions import RevisionCache

    settings = Settings(data_dir=tmp_path / "data", cache_dir=tmp_path / "cache")
    store = scheduler.open_store(settings)
    key = RevisionCache.from_config(settings.worker_config()).snapshot(ROOT)
    cells = [("conv_net", "fp16", "default", "cpu"), ("conv_net", "bf16", "default", "cpu")]
    own, adopted = (store.create_run(key, "manual", None, "adopt", cells, dispatch="local") for _ in range(2))
    pool = scheduler.LocalPool(settings, store, workers=1)
    try:
        pool.submit(store.jobs(own))
        pool.submit(store.jobs(adopted))
        pool.hand_back_on_cancel([adopted])
        assert pool.adopted_runs == {adopted}
        deadline = time.monotonic() + 90
        while not any(j.status == "running" for j in store.jobs(own)):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        pool.cancel()
    finally:
        pool.close()
    assert {j.status for j in store.jobs(own)} <= {"cancelled", "done"}
    assert store.get_run(own).finished_at is not None
    assert {(j.status, j.attempts) for j in store.jobs(adopted)} == {("queued", 0)}
    assert _owner(store, adopted) is None  # released: the next sweep or serve resumes it
    assert store.get_run(adopted).finished_at is None
    store.dispose()
