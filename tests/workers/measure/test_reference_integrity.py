"""The fp32 reference cache is verified on use: an entry that fails its checksum is recomputed, and a
consistent but wrong entry is a ``reference_error`` naming it, never a wider tolerance (issue 31)."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.workers.fakes import fake_pass, write_manifest
from workers.jobs.job import run_job
from workers.jobs.spec import JobSpec
from workers.measure import reference as refcache
from workers.measure.reference import ReferenceCache, rerun_mismatch
from workers.result import JobResult
from workers.revision.config import WorkerConfig

MANIFEST = '''
[defaults.tolerance]
fp16 = { atol = 1e-3, rtol = 1e-2 }

[models.conv]
source = { synthetic = "conv_net" }
inputs.x = { shape = [4, 3, 32, 32] }
task = "top1"

[models.rnn]
source = { synthetic = "stateful_rnn" }
inputs.x = { shape = [1, 8] }
inputs.h = { shape = [1, 32], dist = "zeros" }
stateful = { state = { h = "h_new" }, steps = 12, cap = 0.5 }
'''


def test_entries_that_fail_their_checksum_are_deleted_and_recomputed(tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    cache = ReferenceCache(tmp_path)
    arrays = {"ref/y": np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4), "ref/i": np.arange(3),
              "baseline/y": np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)}
    path = cache.put("k", arrays)
    got = cache.get("k")
    assert got is not None and all(np.array_equal(got[k], v) for k, v in arrays.items())

    def tampered(how: str) -> None:
        cache.put("k", arrays)
        with np.load(path) as data:
            stored = {k: data[k] for k in data.files}
        if how == "scaled":  # x1000 with the stored checksum kept
            stored["ref/y"] = stored["ref/y"] * np.float32(1000)
            np.savez(path, **stored)
        elif how == "truncated":
            path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        else:  # no checksum at all (an old entry, or one written by hand)
            np.savez(path, **arrays)

    for how, logged in (("scaled", "fails its checksum"), ("truncated", "unreadable"), ("bare", "has no checksum")):
        tampered(how)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="workers.measure.reference"):
            assert cache.get("k") is None, how
        assert not path.exists(), how
        (record,) = caplog.records
        assert record.getMessage().startswith(f"reference cache entry {path} {logged}"), how
    tampered("scaled")
    again, hit = cache.get_or_compute("k", lambda: arrays)
    assert not hit and np.array_equal(again["ref/y"], arrays["ref/y"]) and cache.get("k") is not None


def test_rerun_must_reproduce_the_cached_outputs_within_a_few_ulps() -> None:
    y = np.linspace(-3, 3, 50, dtype=np.float32)
    ulp = np.spacing(np.float32(3))
    assert rerun_mismatch({"y": y, "i": np.arange(2)}, {"y": y.copy(), "i": np.arange(2)}) is None
    assert rerun_mismatch({"y": y + 4 * ulp}, {"y": y}) is None
    assert "max |cached - rerun|" in str(rerun_mismatch({"y": y + 8 * ulp}, {"y": y}))
    assert "max |cached - rerun|" in str(rerun_mismatch({"y": y * 1000}, {"y": y}))
    assert "values differ" in str(rerun_mismatch({"i": np.arange(2) + 1}, {"i": np.arange(2)}))
    nan = y.copy()
    nan[3] = np.nan
    assert "NaN" in str(rerun_mismatch({"y": nan}, {"y": y}))
    assert rerun_mismatch({"y": nan}, {"y": nan.copy()}) is None
    assert "float64" in str(rerun_mismatch({"y": y.astype(np.float64)}, {"y": y}))
    assert "outputs" in str(rerun_mismatch({"y": y, "z": y}, {"y": y}))


@pytest.fixture(scope="module")
def first_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, JobResult]]:
    """One honest job per model, filling a cache that each test copies."""
    root = tmp_path_factory.mktemp("first")
    zoo = write_manifest(root / "zoo.toml", MANIFEST)
    naive = fake_pass(root / "naive", "naive_fp16")
    results = {m: run_job(JobSpec(model=m, dtype="fp16", pass_root=naive, zoo_path=zoo), _settings(root / "cache"))
               for m in ("conv", "rnn")}
    for r in results.values():
        assert r.status == "pass" and r.timings["reference_cached"] == 0.0, r.message
    return root, results


def _settings(cache: Path) -> WorkerConfig:
    return WorkerConfig(cache_dir=cache, latency_runs=2, latency_warmup=1, convert_timeout=120.0)


def _copy(first: Path, tmp_path: Path) -> tuple[Path, WorkerConfig, ReferenceCache]:
    shutil.copytree(first / "cache", tmp_path / "cache")
    return first / "zoo.toml", _settings(tmp_path / "cache"), ReferenceCache(tmp_path / "cache" / "reference")


def _entry(cache: ReferenceCache, result: JobResult, kind: str) -> tuple[str, Path]:
    """The key and file of the one ``kind`` entry of ``result``'s model."""
    (path,) = cache.root.rglob(f"{str(result.model_sha256)[:16]}-{kind}-*.npz")
    return path.stem, path


def _job(model: str, zoo: Path, settings: WorkerConfig, root: Path) -> JobResult:
    return run_job(JobSpec(model=model, dtype="fp16", pass_root=root, zoo_path=zoo), settings)


@pytest.mark.parametrize("how", ["scaled", "truncated"])
def test_a_changed_reference_entry_is_recomputed(first_run: tuple[Path, dict[str, JobResult]], tmp_path: Path,
                                                 how: str) -> None:
    first, results = first_run
    zoo, settings, cache = _copy(first, tmp_path)
    _, path = _entry(cache, results["conv"], "outputs")
    if how == "scaled":  # what the attacker's pass did: every reference output x1000, the checksum left as it was
        with np.load(path) as data:
            stored = {k: data[k] * 1000 if k.startswith("ref/") else data[k] for k in data.files}
        np.savez(path, **stored)
    else:
        path.write_bytes(path.read_bytes()[:200])
    r = _job("conv", zoo, settings, first / "naive")
    assert r.status == "pass" and r.timings["reference_cached"] == 0.0, r.message
    assert r.accuracy is not None and results["conv"].accuracy is not None
    assert r.accuracy.worst.max_abs == results["conv"].accuracy.worst.max_abs


@pytest.mark.parametrize("group", ["ref", "baseline"])
def test_a_consistent_but_wrong_reference_is_a_reference_error_naming_the_entry(
        first_run: tuple[Path, dict[str, JobResult]], tmp_path: Path, group: str) -> None:
    """An entry rewritten with its checksum recomputed passes the checksum: a fresh fp32 run catches it.
    A scaled baseline would widen the bound as much as a scaled reference: here an inaccurate pass would
    pass with it."""
    first, results = first_run
    zoo, settings, cache = _copy(first, tmp_path)
    key, path = _entry(cache, results["conv"], "outputs")
    arrays = cache.get(key)
    assert arrays is not None
    cache.put(key, {k: v * 1000 if k.startswith(f"{group}/") and v.dtype.kind == "f" else v
                    for k, v in arrays.items()})
    r = _job("conv", zoo, settings, fake_pass(tmp_path / "perturb", "perturb"))
    assert r.status == "reference_error", r.message
    what = {"ref": "fp32 rerun does not reproduce the cached reference", "baseline":
            "unoptimized fp32 rerun does not reproduce the cached baseline"}[group]
    assert r.message.startswith(f"{what} at {path}: "), r.message
    assert r.accuracy is None


def test_a_cached_reference_is_used_when_the_rerun_reproduces_it(first_run: tuple[Path, dict[str, JobResult]],
                                                                 tmp_path: Path) -> None:
    first, results = first_run
    zoo, settings, _ = _copy(first, tmp_path)
    r = _job("conv", zoo, settings, first / "naive")
    assert r.status == "pass" and r.timings["reference_cached"] == 1.0, r.message
    assert r.accuracy is not None and results["conv"].accuracy is not None
    assert r.accuracy.worst.max_abs == results["conv"].accuracy.worst.max_abs


def test_a_consistent_but_wrong_rollout_is_a_reference_error(first_run: tuple[Path, dict[str, JobResult]],
                                                             tmp_path: Path) -> None:
    first, results = first_run
    zoo, settings, cache = _copy(first, tmp_path)
    key, path = _entry(cache, results["rnn"], "rollout")
    arrays = cache.get(key)
    assert arrays is not None
    cache.put(key, {k: v * np.float32(1.5) for k, v in arrays.items()})
    r = _job("rnn", zoo, settings, first / "naive")
    assert r.status == "reference_error", r.message
    assert r.message.startswith(f"fp32 rerun does not reproduce the cached reference (step 0) at {path}: ")
    assert refcache.CHECKSUM not in r.message
