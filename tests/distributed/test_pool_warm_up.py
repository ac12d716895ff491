"""The embedded sweep starts its workers before it imports anything heavy (issue 25): ``warm_up`` starts
worker subprocesses at once, the next pool adopts them (not new ones), surplus ones are stopped, and the pool
module a worker unpickles its entry point from does not import the database layer."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from service.orchestration import localpool, pool_slots
from service.orchestration.scheduler import LocalPool, open_store
from service.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def test_the_pool_module_imports_neither_the_database_layer_nor_job_code() -> None:
    code = ("import sys, service.orchestration.localpool; "
            "print(sorted(m for m in ('sqlalchemy', 'alembic', 'numpy', 'onnx', 'onnxruntime', "
            "'service.orchestration.jobs', 'service.db') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _wait_started(slot: pool_slots.Slot, seconds: float = 120.0) -> None:
    deadline = time.monotonic() + seconds
    while slot.proc is None:
        assert time.monotonic() < deadline, "warm_up() did not start its worker"
        time.sleep(0.05)


def test_warm_up_starts_workers_that_the_next_pool_adopts_and_stops_the_surplus(tmp_path: Path) -> None:
    localpool.warm_up(2)
    warm = list(pool_slots.WARM)
    assert len(warm) == 2
    for slot in warm:  # started in the background, before any pool exists
        _wait_started(slot)
    assert all(slot.proc.is_alive() for slot in warm)
    settings = Settings(data_dir=tmp_path / "data", cache_dir=tmp_path / "cache")
    pool = LocalPool(settings, open_store(settings), workers=2)
    try:
        pool.prestart(1)  # one job: one worker wanted
        assert pool._slots == warm[:1] and pool_slots.WARM == []  # adopted, not started anew
        surplus = warm[1]
        deadline = time.monotonic() + 30
        while surplus.proc is not None:  # retired: stopped, and never started again
            assert time.monotonic() < deadline, "the surplus warm worker was not stopped"
            time.sleep(0.05)
        assert warm[0].proc is not None and warm[0].proc.is_alive()
    finally:
        pool.close()
    assert warm[0].proc is None
