"""A job's target may be a queue of a device kind (``cuda-a100``, ``cpu-fast``), as sweeps and
``AMPCI_EXTRA_QUEUES`` name them: the job runs for that kind and the cell keeps the queue name."""

from __future__ import annotations

from pathlib import Path

from tests.workers.fakes import fake_pass, write_manifest
from tests.workers.jobs.test_job import MANIFEST
from workers.jobs.job import run_job
from workers.jobs.spec import JobSpec, target_kind
from workers.revision.config import WorkerConfig


def test_target_kind() -> None:
    assert [target_kind(t) for t in ("cpu", "cuda", "cuda-a100", "cpu-fast")] == ["cpu", "cuda", "cuda", "cpu"]


def test_a_queue_target_runs_as_its_kind(tmp_path: Path) -> None:
    config = WorkerConfig(cache_dir=tmp_path / "cache", latency_runs=2, latency_warmup=1, convert_repeats=1)
    zoo = write_manifest(tmp_path / "zoo.toml", MANIFEST)
    root = fake_pass(tmp_path / "naive", "naive_fp16")
    r = run_job(JobSpec(model="conv", dtype="fp16", target="cpu-fast", pass_root=root, zoo_path=zoo), config)
    assert (r.status, r.target) == ("pass", "cpu-fast"), r.message
    assert r.latency is not None and r.latency.provider == "CPUExecutionProvider" and r.latency.samples_ms
    bad = run_job(JobSpec(model="conv", dtype="fp16", target="tpu-v5", pass_root=root, zoo_path=zoo), config)
    assert bad.status == "bad_spec" and "unknown target 'tpu-v5'" in bad.message
