"""Jobs of one machine time their models one at a time (an flock under the cache dir), so concurrent jobs'
thread pools never compete while either is timed."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from tests.workers.fakes import fake_pass, write_manifest
from tests.workers.jobs.test_job import MANIFEST
from workers.jobs.job import run_job
from workers.jobs.spec import JobSpec
from workers.measure.latency import TIMING_LOCK, timing_slot
from workers.revision.config import WorkerConfig

HOLD = ("import fcntl, sys, time, pathlib; p = pathlib.Path(sys.argv[1]); p.parent.mkdir(parents=True, exist_ok=True)\n"
        "f = open(p, 'a+'); fcntl.flock(f, fcntl.LOCK_EX); pathlib.Path(sys.argv[2]).touch(); time.sleep(float(sys.argv[3]))")


def _hold(lock: Path, ready: Path, seconds: float) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(lock), str(ready), str(seconds)])
    deadline = time.monotonic() + 30
    while not ready.exists():
        assert time.monotonic() < deadline and proc.poll() is None, "lock holder did not start"
        time.sleep(0.02)
    return proc


def test_timing_slot_waits_for_another_process(tmp_path: Path) -> None:
    lock = tmp_path / "slot.lock"
    holder = _hold(lock, tmp_path / "ready", 1.0)
    try:
        t0 = time.monotonic()
        with timing_slot(lock):
            waited = time.monotonic() - t0
    finally:
        holder.wait(timeout=30)
    assert waited > 0.5
    with timing_slot(None):  # no lock file: no waiting
        pass


def test_a_job_times_its_models_only_in_the_slot(tmp_path: Path) -> None:
    config = WorkerConfig(cache_dir=tmp_path / "cache", latency_runs=2, latency_warmup=1, convert_timeout=120.0,
                          convert_repeats=1)
    zoo = write_manifest(tmp_path / "zoo.toml", MANIFEST)
    root = fake_pass(tmp_path / "naive", "naive_fp16")
    run_job(JobSpec(model="conv", dtype="fp16", pass_root=root, zoo_path=zoo), config)  # warm caches
    holder = _hold(config.cache_dir / TIMING_LOCK, tmp_path / "ready", 4.0)
    try:
        r = run_job(JobSpec(model="conv", dtype="fp16", pass_root=root, zoo_path=zoo), config)
    finally:
        holder.wait(timeout=30)
    assert r.status == "pass", r.message
    assert r.latency is not None and len(r.latency.samples_ms) == 2
    # the latency phase (a few ms of model runs) waited for the holder; the phases before it did not
    assert r.timings["latency_s"] > 1.0, r.timings
    assert r.timings["accuracy_s"] < 1.0, r.timings


def test_timed_sessions_use_the_configured_thread_count(tmp_path: Path) -> None:
    """Latency sessions run with ``latency_threads`` intra-op threads (default 1), recorded in the result."""
    from workers.measure.runners import SessionRunner

    zoo = write_manifest(tmp_path / "zoo.toml", MANIFEST)
    root = fake_pass(tmp_path / "naive", "naive_fp16")
    made: list[int] = []
    original = SessionRunner.__init__

    def spy(self, model, target, clock=None, optimize=True, intra_op_threads=0):  # type: ignore[no-untyped-def]
        original(self, model, target, clock, optimize, intra_op_threads)
        made.append(int(self.session.get_session_options().intra_op_num_threads))

    SessionRunner.__init__ = spy  # type: ignore[method-assign]
    try:
        for threads in (1, 0):
            made.clear()
            config = WorkerConfig(cache_dir=tmp_path / f"c{threads}", latency_runs=2, latency_warmup=1,
                                  convert_repeats=1, latency_threads=threads)
            r = run_job(JobSpec(model="conv", dtype="fp16", pass_root=root, zoo_path=zoo), config)
            assert r.status == "pass" and r.latency is not None and r.latency.samples_ms
            assert r.environment["threads"].startswith(f"intra={threads or 'default'}")
            if threads:
                assert made.count(threads) >= 2  # the converted and the fp32 session that are timed
            else:
                assert set(made) == {0}  # onnxruntime's default pool everywhere
    finally:
        SessionRunner.__init__ = original  # type: ignore[method-assign]
