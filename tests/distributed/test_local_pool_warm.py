"""The local pool's workers import once (issue 25): forked from a preloaded server, their conversion
zygotes forked from a preloaded fork server (no fresh interpreter), and a waiter is told of each
finished job instead of sleeping between polls."""

from __future__ import annotations

import multiprocessing.forkserver as mpfs
import time
from pathlib import Path

import psutil
import pytest

from service.orchestration import pool_template, scheduler
from service.settings import Settings
from workers.revision.revisions import RevisionCache

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _tree(pid: int) -> list[psutil.Process]:
    proc = psutil.Process(pid)
    return [proc, *proc.children(recursive=True)]


def _cmdline(p: psutil.Process) -> list[str]:
    """``p``'s command line; [] for one that has ended (a finished sandbox supervisor is reaped as its zygote
    goes on, so it may be a zombie for a moment)."""
    try:
        return p.cmdline()
    except (psutil.ZombieProcess, psutil.NoSuchProcess):
        return []


def test_pool_workers_fork_zygotes_from_a_preloaded_server_and_tell_the_waiter(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", cache_dir=tmp_path / "cache")
    store = scheduler.open_store(settings)
    key = RevisionCache.from_config(settings.worker_config()).snapshot(ROOT)
    run_id = store.create_run(key, "manual", None, "t", [("conv_net", "fp16", "default", "cpu"),
                                                         ("conv_net", "bf16", "default", "cpu")])
    pool = scheduler.LocalPool(settings, store, workers=1)
    pool.prestart(2)
    (slot,) = pool._slots
    deadline = time.monotonic() + 60
    while slot.proc is None:  # started in the background, before any job was submitted
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert slot.proc.is_alive() and store.jobs(run_id)[0].status == "queued"
    try:
        pool.submit(store.jobs(run_id))
        # poll=60: a waiter that slept between polls would return a minute after the last job
        start = time.monotonic()
        run = scheduler.wait_for_run(store, run_id, poll=60, timeout=240, wake=pool.wait_for_change)
        returned = time.monotonic()
        assert run.status == "complete"
        last_done = max(j.finished_at for j in store.jobs(run_id)).timestamp()
        assert returned - start < 60 and time.time() - last_done < 10
        worker = psutil.Process(slot.proc.pid)
        # the worker was forked from multiprocessing's fork server, itself forked from the pool's sandbox
        # template (issue 42: one preload for the workers and the sandboxes), not spawned afresh
        (template,) = pool_template._TEMPLATE
        job_server = mpfs._forkserver._forkserver_pid
        assert worker.ppid() == job_server and psutil.Process(job_server).ppid() == template.proc.pid
        assert "--forkserver" in " ".join(worker.parent().cmdline())
        assert [p for p in _tree(worker.pid) if p.pid != worker.pid] == []  # no fork server of its own
        # the zygotes are the template's (a fresh `_zygote.py --forkserver`, issue 31: never a fork of the
        # worker); a zygote forked from it carries its command line, a fresh zygote has none of `--forkserver`
        zygotes = [p for p in psutil.Process(template.proc.pid).children() if p.pid != job_server]
        tree = zygotes + [c for z in zygotes for c in z.children(recursive=True)]
        fresh = [p for p in tree if any("_zygote.py" in part for part in _cmdline(p))
                 and "--forkserver" not in _cmdline(p)]
        assert not fresh, f"a zygote was started as a fresh interpreter: {[_cmdline(p) for p in fresh]}"
        # the revision's zygote forked from the template, and the conversion's pre-forked supervisor
        assert len([p for p in tree if "--forkserver" in _cmdline(p)]) >= 2, [_cmdline(p) for p in tree]
    finally:
        pool.close()
    assert store.results(run_id=run_id) and {r.status for r in store.results(run_id=run_id)} == {"pass"}
