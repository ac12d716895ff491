"""The local pool's way out costs no model time and leaves nothing behind (issue 25): multiprocessing's fork
server is stopped by pid at exit once no worker is up (it held the caller's stdout open through a slow
teardown), a worker stops its zygotes and their fork server by pid when told to stop, and zygotes are
forked from a server whose preloaded heap is frozen (their own collection walks only the pass)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from service.orchestration import scheduler
from service.settings import Settings
from workers.revision.revisions import RevisionCache

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

SERVER_AT_EXIT = textwrap.dedent('''
    import json, multiprocessing.forkserver as mpfs, os, sys
    from service.orchestration import localpool, pool_slots
    slots = [pool_slots.Slot(), pool_slots.Slot()]
    for slot in slots:
        slot.ensure_started()
    server = mpfs._forkserver._forkserver_pid
    busy = localpool.stop_idle_forkserver()  # a worker is up: the server stays
    workers = [slot.proc.pid for slot in slots]
    for slot in slots:
        slot.ask_to_stop()
    for slot in slots:
        slot.stop()
    alive = True
    try:
        os.kill(server, 0)
    except ProcessLookupError:
        alive = False
    print(json.dumps({"server": server, "busy": busy, "alive": alive, "workers": workers}), flush=True)
''')


def _gone(pid: int) -> bool:
    """The process has ended (a zombie whose parent has not reaped it yet has ended too)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_the_fork_server_is_stopped_by_pid_at_exit_once_no_worker_is_up(tmp_path: Path) -> None:
    out_file = tmp_path / "out.json"
    with out_file.open("w") as out:  # not a pipe: the exit is seen at once, not when the last holder closes it
        proc = subprocess.Popen([sys.executable, "-c", SERVER_AT_EXIT], cwd=ROOT, stdout=out,
                                stderr=subprocess.PIPE, text=True)
        _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    said = json.loads(out_file.read_text())
    assert said["busy"] is False and said["alive"] is True  # kept while its workers ran, stopped by none of them
    # the moment the process is gone, so is its fork server (it used to tear numpy and onnx down afterwards,
    # 0.1-0.3 s with this process's stdout and stderr still open) -- and so are the workers, reaped before
    assert _gone(said["server"]), "multiprocessing's fork server outlived the process that started it"
    assert all(_gone(pid) for pid in said["workers"])


def test_a_stopped_worker_takes_its_zygotes_with_it_and_the_exit_their_shared_template(tmp_path: Path) -> None:
    import multiprocessing.forkserver as mpfs

    from service.orchestration import localpool, pool_template

    settings = Settings(data_dir=tmp_path / "data", cache_dir=tmp_path / "cache")
    store = scheduler.open_store(settings)
    key = RevisionCache.from_config(settings.worker_config()).snapshot(ROOT)
    run_id = store.create_run(key, "manual", None, "t", [("conv_net", "fp16", "default", "cpu")])
    pool = scheduler.LocalPool(settings, store, workers=1)
    try:
        pool.submit(store.jobs(run_id))
        run = scheduler.wait_for_run(store, run_id, poll=60, timeout=240, wake=pool.wait_for_change)
        assert run.status == "complete"
        pool.finish()
        (slot,) = pool._slots
        worker = psutil.Process(slot.proc.pid)
        (shared,) = pool_template._TEMPLATE  # the pool's sandbox template: one for all its workers
        template = psutil.Process(shared.proc.pid)
        assert worker.children(recursive=True) == []  # no fork server of its own: the template's
        job_server = mpfs._forkserver._forkserver_pid  # the workers' own fork server: forked by the template too
        assert worker.ppid() == job_server and psutil.Process(job_server).ppid() == template.pid
        zygotes = [p for p in template.children() if p.pid != job_server]  # the revision's zygote ...
        below = zygotes + [c for z in zygotes for c in z.children(recursive=True)]  # ... its next supervisor
        assert len(below) >= 2
    finally:
        pool.close()
    assert not worker.is_running()
    # killed and reaped by the worker on its way out (by pid), not left to notice their pipes closing
    deadline = time.monotonic() + 0.5  # (a SIGKILLed process may take a moment to be gone)
    while not all(_gone(p.pid) for p in below) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert all(_gone(p.pid) for p in below), [p.pid for p in below if not _gone(p.pid)]
    assert template.is_running()  # the template is the pool process's, stopped once no worker is up
    assert localpool.stop_idle_forkserver() is True
    assert _gone(template.pid) and pool_template._TEMPLATE == []
    deadline = time.monotonic() + 0.5
    while not _gone(job_server) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _gone(job_server) and mpfs._forkserver._forkserver_pid is None
    assert {r.status for r in store.results(run_id=run_id)} == {"pass"}


FROZEN = textwrap.dedent('''
    import json, sys
    from pathlib import Path
    from workers.sandbox import zygotes
    from workers.revision.convert import convert_in_subprocess
    from workers.zoo.synthetic import synthetic_model_path
    assert zygotes.start_forkserver()
    root, tmp = Path(sys.argv[1]), Path(sys.argv[2])
    src, _ = synthetic_model_path("conv_net", 0, tmp / "cache")
    out = convert_in_subprocess(src, tmp / "o.onnx", tmp / "r.json", "fp16", "default", "cpu", root,
                                timeout_s=120, memory_bytes=2**31)
    z = zygotes.zygote_of(root)
    print(json.dumps({"forked": bool(z and z.forked), "message": out.message}), flush=True)
    zygotes.shutdown()
    zygotes.stop_forkserver()
''')


def test_zygotes_are_forked_from_a_frozen_preloaded_heap(tmp_path: Path) -> None:
    root = tmp_path / "pass"
    (root / "amp_pass").mkdir(parents=True)
    (root / "amp_pass" / "__init__.py").write_text("import gc\nFROZEN = gc.get_freeze_count()\n")
    (root / "amp_pass" / "__main__.py").write_text(
        "import sys\nfrom amp_pass import FROZEN\nsys.exit(f'frozen {FROZEN}')\n")
    proc = subprocess.run([sys.executable, "-c", FROZEN, str(root), str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["forked"] is True
    # numpy, onnx and onnx_ir's objects are frozen before the pass is imported (the pass reports it through
    # its error text: the sandbox lets it write nothing the test could read)
    assert int(out["message"].rsplit("frozen ", 1)[1].split()[0]) > 10_000, out


STOP_SERVER = textwrap.dedent('''
    import json, os
    from workers.sandbox import zygotes
    assert zygotes.start_forkserver()
    first = zygotes._FORKSERVER.pid
    zygotes.stop_forkserver()
    try:
        os.waitpid(first, os.WNOHANG)
        reaped = False
    except ChildProcessError:  # not our child any more: killed and reaped already
        reaped = True
    stopped = zygotes._FORKSERVER is None
    again = zygotes.start_forkserver() and zygotes._FORKSERVER.pid != first
    zygotes.stop_forkserver()
    print(json.dumps({"reaped": reaped, "stopped": stopped, "again": again}), flush=True)
''')


def test_stop_forkserver_kills_and_reaps_the_zygote_fork_server() -> None:
    proc = subprocess.run([sys.executable, "-c", STOP_SERVER], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout) == {"reaped": True, "stopped": True, "again": True}


def test_the_exit_never_waits_for_a_worker_start_in_progress() -> None:
    from service.orchestration import localpool, pool_slots

    done: list[bool] = []
    with pool_slots.SERVER_LOCK:  # as a worker start holds it while the fork server preloads (~1 s)
        waiter = threading.Thread(target=lambda: done.append(localpool.stop_idle_forkserver()), daemon=True)
        waiter.start()
        waiter.join(5)
        assert done == [False], "the exit handler waited for a worker start (an early error exit held up)"
