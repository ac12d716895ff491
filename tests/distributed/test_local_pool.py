"""The embedded default: `ampci sweep` with no broker and no database, and the LocalPool's guarantees."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from service.orchestration import scheduler
from service.settings import Settings
from workers.revision.revisions import RevisionCache

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def test_embedded_smoke_sweep_from_the_cli(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMPCI_")}
    env.update(AMPCI_DATA_DIR=str(tmp_path / "data"), AMPCI_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-m", "service.cli.main", "sweep", "--json", "--workers", "2",
                           "--no-baseline-run"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    planned = scheduler.load_sweep(sweep="smoke").expand(scheduler.zoo_catalog())
    assert out["run"]["status"] == "complete" and out["summary"]["cells"] == len(planned)
    # a fresh database: nothing to compare with, and the output says so instead of "no regressions"
    assert out["comparison"]["compared"] == 0 and out["comparison"]["cells"] == len(planned)
    assert out["comparison"]["message"].startswith("no baseline results yet: first run")
    db = tmp_path / "data" / "ampci.sqlite3"  # created and migrated on first use
    with sqlite3.connect(db) as c:
        rows = c.execute("select model, dtype, status from results where run_id = ?", (out["run"]["id"],)).fetchall()
    assert sorted((m, d) for m, d, _ in rows) == sorted((c.model, c.dtype) for c in planned)
    assert {s for _, _, s in rows} == {"pass"}
    # the service side never imported onnxruntime: jobs ran in worker subprocesses
    assert "local pool" in proc.stderr


def _pool_run(tmp_path: Path, **settings_kw: Any) -> tuple[Any, Settings, int, Any]:
    settings = Settings(data_dir=tmp_path / "data", cache_dir=tmp_path / "cache", **settings_kw)
    store = scheduler.open_store(settings)
    key = RevisionCache.from_config(settings.worker_config()).snapshot(ROOT)
    run_id = store.create_run(key, "manual", None, "t", [("conv_net", "fp16", "default", "cpu")])
    pool = scheduler.LocalPool(settings, store, workers=1)
    pool.submit(store.jobs(run_id))
    return store, settings, run_id, pool


def test_worker_subprocess_killed_mid_job_is_retried(tmp_path: Path) -> None:
    store, settings, run_id, pool = _pool_run(tmp_path, max_attempts=2)
    try:
        deadline = time.monotonic() + 60
        while not (pool._slots and pool._slots[0].proc is not None and store.jobs(run_id)[0].status == "running"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        os.kill(pool._slots[0].proc.pid, signal.SIGKILL)
        run = scheduler.wait_for_run(store, run_id, timeout=120)
    finally:
        pool.close()
    (job,) = store.jobs(run_id)
    assert job.attempts == 2 and job.status == "done" and run.status == "complete"
    assert store.results(run_id=run_id)[0].status == "pass"


def test_job_past_its_time_limit_gets_a_timeout_result(tmp_path: Path) -> None:
    store, settings, run_id, pool = _pool_run(tmp_path, job_timeout=0.2)
    try:
        scheduler.wait_for_run(store, run_id, timeout=60)
    finally:
        pool.close()
    (result,) = store.results(run_id=run_id)
    assert result.status == "timeout" and "exceeded" in (result.message or "")
    assert all(s.proc is None for s in pool._slots)  # the runaway subprocess was killed


def test_cancel_stops_the_subprocesses_and_cancels_what_is_left(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", cache_dir=tmp_path / "cache")
    store = scheduler.open_store(settings)
    key = RevisionCache.from_config(settings.worker_config()).snapshot(ROOT)
    run_id = store.create_run(key, "manual", None, "t", [("conv_net", "fp16", "default", "cpu"),
                                                         ("conv_net", "bf16", "default", "cpu")])
    pool = scheduler.LocalPool(settings, store, workers=1)
    pool.submit(store.jobs(run_id))
    deadline = time.monotonic() + 60
    # "running" is stored before the slot spawns its subprocess: wait for both
    while not (any(j.status == "running" for j in store.jobs(run_id)) and pool._slots
               and pool._slots[0].proc is not None):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    child = pool._slots[0].proc
    pool.cancel()
    assert child is not None and not child.is_alive()
    assert {j.status for j in store.jobs(run_id)} <= {"cancelled", "done"}
    assert "cancelled" in {j.status for j in store.jobs(run_id)}
    assert store.get_run(run_id).finished_at is not None
