"""The latency rule on a busy machine: CPU-time ratios (the work of each model, timed by the worker beside the
wall time of the same blocks) decide when both sides carry them; wall-time ratios otherwise.

The numbers are shaped like what the worker measured under 4 job-like load processes at load average 15 on two
cores: converted/fp32 wall-time ratios of single blocks anywhere in 0.3-2.9, CPU-time ratios within +-3 %.
"""

from __future__ import annotations

import random
import statistics

import pytest

from service.db import Store
from service.regressions.rules import CellSample, latency_rule, pooled, relative_cpu_latency, relative_latency
from service.regressions.thresholds import Thresholds
from tests.service.factories import chain, make_result, migrated_store, run_with

TH = Thresholds()


def _busy(ratio: float, seed: int, n: int = 20, cpu: bool = True) -> CellSample:
    """A job of a model whose converted/fp32 work ratio is ``ratio``: wall time blown up by bursts of other
    load (each block of either model anywhere between 1x and 9x its work), CPU time within +-3 %."""
    rng = random.Random(seed)
    fp32_cpu = [10.0 * (1 + rng.uniform(-0.03, 0.03)) for _ in range(n)]
    conv_cpu = [10.0 * ratio * (1 + rng.uniform(-0.03, 0.03)) for _ in range(n)]
    wall = [c * rng.uniform(1.0, 9.0) for c in conv_cpu]
    fp32_wall = [c * rng.uniform(1.0, 9.0) for c in fp32_cpu]
    return CellSample(status="pass", latency_samples=tuple(wall), fp32_latency_samples=tuple(fp32_wall),
                      cpu_latency_samples=tuple(conv_cpu) if cpu else (),
                      fp32_cpu_latency_samples=tuple(fp32_cpu) if cpu else (), env_fingerprint="e")


def test_cpu_time_ratios_show_a_20_percent_slowdown_that_wall_time_hides() -> None:
    base, new = _busy(1.0, 1), _busy(1.2, 2)
    (f,) = latency_rule(base, new, TH, "m", "fp16")
    assert (f.kind, f.category) == ("latency", "regression")
    assert "CPU time relative to fp32" in f.detail and "x1.2" in f.detail
    cpu_p50s = statistics.median(base.cpu_latency_samples), statistics.median(new.cpu_latency_samples)
    assert f"; CPU {cpu_p50s[0]:.4g} ms -> {cpu_p50s[1]:.4g} ms (" in f.detail  # the work, beside the wall p50s
    assert f.baseline_value == pytest.approx(statistics.median(base.latency_samples))  # p50s stay wall time
    # the same jobs without their CPU samples: wall-time ratios alone are far from significant
    assert latency_rule(_busy(1.0, 1, cpu=False), _busy(1.2, 2, cpu=False), TH, "m", "fp16") == []


def test_load_that_slows_the_wall_time_of_one_model_is_not_a_regression() -> None:
    # the new job's converted model ran while other jobs started (wall x1.5 relative), its work did not change
    rng = random.Random(7)
    fp32 = tuple(10.0 * (1 + rng.uniform(-0.01, 0.01)) for _ in range(20))
    conv = tuple(10.0 * (1 + rng.uniform(-0.01, 0.01)) for _ in range(20))
    base = CellSample(status="pass", latency_samples=conv, fp32_latency_samples=fp32, cpu_latency_samples=conv,
                      fp32_cpu_latency_samples=fp32, env_fingerprint="e")
    new = CellSample(status="pass", latency_samples=tuple(1.5 * x for x in conv), fp32_latency_samples=fp32,
                     cpu_latency_samples=conv, fp32_cpu_latency_samples=fp32, env_fingerprint="e")
    assert latency_rule(base, new, TH, "m", "fp16") == []
    # wall time alone would have accused the pass
    wall_new = CellSample(status="pass", latency_samples=new.latency_samples, fp32_latency_samples=fp32,
                          env_fingerprint="e")
    assert [f.category for f in latency_rule(base, wall_new, TH, "m", "fp16")] == ["regression"]


def test_cpu_samples_on_one_side_only_compare_wall_time() -> None:
    # a baseline stored before the worker timed CPU: wall-time ratios, as before
    base = _busy(1.0, 3, cpu=False)
    new = _busy(1.0, 4)
    assert relative_cpu_latency(base) == () and relative_cpu_latency(new)
    rng = random.Random(5)
    quiet = CellSample(status="pass", latency_samples=tuple(10 * (1 + rng.uniform(-0.01, 0.01)) for _ in range(20)),
                       fp32_latency_samples=tuple(10 * (1 + rng.uniform(-0.01, 0.01)) for _ in range(20)),
                       env_fingerprint="e")
    slow = CellSample(status="pass", latency_samples=tuple(13 * (1 + rng.uniform(-0.01, 0.01)) for _ in range(20)),
                      fp32_latency_samples=tuple(10 * (1 + rng.uniform(-0.01, 0.01)) for _ in range(20)),
                      cpu_latency_samples=tuple(10.0 for _ in range(20)),
                      fp32_cpu_latency_samples=tuple(10.0 for _ in range(20)), env_fingerprint="e")
    (f,) = latency_rule(quiet, slow, TH, "m", "fp16")
    assert "x1.30 relative to fp32" in f.detail and "CPU" not in f.detail
    # unpaired CPU lists are no CPU samples
    assert relative_cpu_latency(CellSample(status="pass", cpu_latency_samples=(1.0, 2.0),
                                           fp32_cpu_latency_samples=(1.0,))) == ()


def test_the_floor_is_checked_on_the_work_not_on_the_load_inflated_wall_time() -> None:
    # a 0.2 ms model whose work grows 20 % (+0.04 ms: under the 0.05 ms floor) while load inflates its wall
    # time 50x: the change at the baseline's CPU p50 stays under the floor
    fp32 = tuple(0.2 * (1 + 0.001 * i) for i in range(20))
    base = CellSample(status="pass", latency_samples=tuple(50 * x for x in fp32), fp32_latency_samples=tuple(
        50 * x for x in fp32), cpu_latency_samples=fp32, fp32_cpu_latency_samples=fp32, env_fingerprint="e")
    new = CellSample(status="pass", latency_samples=tuple(60 * x for x in fp32), fp32_latency_samples=tuple(
        50 * x for x in fp32), cpu_latency_samples=tuple(1.2 * x for x in fp32), fp32_cpu_latency_samples=fp32,
        env_fingerprint="e")
    assert latency_rule(base, new, TH, "m", "fp16") == []
    bigger = Thresholds.from_mapping({"latency_floor_ms": 0.01})
    assert [f.category for f in latency_rule(base, new, bigger, "m", "fp16")] == ["regression"]


def test_pooling_keeps_cpu_samples_and_their_run_medians() -> None:
    # five baseline jobs whose CPU ratios swing 0.95-1.08 between runs, each tight within
    runs = []
    for i, m in enumerate((1.0, 0.95, 0.98, 1.04, 1.08)):
        rng = random.Random(i)
        fp32 = tuple(10 * (1 + rng.uniform(-0.005, 0.005)) for _ in range(20))
        conv = tuple(10 * m * (1 + rng.uniform(-0.005, 0.005)) for _ in range(20))
        runs.append(CellSample(status="pass", latency_samples=conv, fp32_latency_samples=fp32,
                               cpu_latency_samples=conv, fp32_cpu_latency_samples=fp32, env_fingerprint="e"))
    base = pooled(runs[0], runs[1:])
    assert len(base.cpu_latency_samples) == len(base.fp32_cpu_latency_samples) == 100
    assert base.run_medians_cpu == pytest.approx((1.0, 0.95, 0.98, 1.04, 1.08), rel=0.01)
    rng = random.Random(50)
    fp32 = tuple(10 * (1 + rng.uniform(-0.005, 0.005)) for _ in range(20))
    inside = tuple(10 * 1.075 * (1 + rng.uniform(-0.005, 0.005)) for _ in range(20))
    # a ratio limit of x1.05 isolates the range rule: beyond the pooled median by that much, p tiny
    low = Thresholds.from_mapping({"latency_ratio": 1.05})
    new = CellSample(status="pass", latency_samples=inside, fp32_latency_samples=fp32, cpu_latency_samples=inside,
                     fp32_cpu_latency_samples=fp32, env_fingerprint="e")
    assert statistics.median(relative_cpu_latency(new)) / statistics.median(relative_cpu_latency(base)) > 1.05
    assert latency_rule(base, new, low, "m", "fp16") == []  # inside the baseline jobs' own CPU spread
    assert [f.category for f in latency_rule(runs[0], new, low, "m", "fp16")] == ["regression"]
    # one pooled result without CPU samples: none pooled, the rule falls back to wall time
    mixed = pooled(runs[0], [*runs[1:], CellSample(status="pass", latency_samples=inside, fp32_latency_samples=fp32,
                                                    env_fingerprint="e")])
    assert mixed.cpu_latency_samples == () and mixed.run_medians_cpu == () and len(mixed.run_medians) == 6
    assert relative_latency(mixed)


@pytest.fixture
def store(db_url: str) -> Store:
    s = migrated_store(db_url)
    yield s
    s.dispose()


def test_detection_reads_the_stored_cpu_samples(store: Store) -> None:
    shas = chain(store, 2)

    def result(ratio: float, seed: int):  # noqa: ANN202 - a JobResult
        r = make_result(latency_ms=2.0, env="e", seed=seed)
        busy = _busy(ratio, seed)
        assert r.latency is not None
        r.latency.samples_ms, r.latency.fp32_samples_ms = list(busy.latency_samples), list(busy.fp32_latency_samples)
        r.latency.cpu_samples_ms = list(busy.cpu_latency_samples)
        r.latency.fp32_cpu_samples_ms = list(busy.fp32_cpu_latency_samples)
        return r

    run_with(store, shas[0], [result(1.0, 1)])
    slow = run_with(store, shas[1], [result(1.2, 2)])
    (reg,) = store.regressions(run_id=slow)
    assert reg.kind == "latency" and "CPU time relative to fp32" in reg.detail


def test_a_ratio_moved_only_by_the_fp32_reference_is_no_finding() -> None:
    # run (a) of bench_verdicts: a tiny fp32 model (12 us of CPU) took 29 us with other jobs thrashing the caches,
    # while the unchanged converted model went 0.84 -> 0.94 ms: the ratio halved, the model did not get faster
    rng = random.Random(11)

    def job(conv_ms: float, fp32_ms: float) -> CellSample:
        conv = tuple(conv_ms * (1 + rng.uniform(-0.02, 0.02)) for _ in range(20))
        fp32 = tuple(fp32_ms * (1 + rng.uniform(-0.02, 0.02)) for _ in range(20))
        return CellSample(status="pass", latency_samples=conv, fp32_latency_samples=fp32, cpu_latency_samples=conv,
                          fp32_cpu_latency_samples=fp32, env_fingerprint="e")

    quiet, busy = job(0.84, 0.012), job(0.94, 0.029)
    assert statistics.median(relative_cpu_latency(busy)) / statistics.median(relative_cpu_latency(quiet)) < 0.5
    assert latency_rule(quiet, busy, TH, "m", "fp16") == []   # no improvement
    assert latency_rule(job(0.94, 0.029), job(0.84, 0.012), TH, "m", "fp16") == []  # and the reverse: no regression
    # bench_verdicts (c), no added load: an unchanged 0.80 ms model read x0.90 relative, its own CPU p50 x0.9994
    assert latency_rule(job(0.8015, 0.0100), job(0.8010, 0.0111), TH, "m", "fp16") == []
    # for an improvement its own CPU p50 must drop by more than half the margin (1 / sqrt(1.10) = x0.953):
    # x0.98 is not enough, x0.90 is; a regression needs only the direction (its confirmation times the models)
    assert latency_rule(job(1.0, 0.05), job(0.98, 0.058), TH, "m", "fp16") == []
    assert [f.category for f in latency_rule(job(1.0, 0.05), job(0.90, 0.058), TH, "m", "fp16")] == ["improvement"]
    assert [f.category for f in latency_rule(job(1.0, 0.05), job(1.02, 0.042), TH, "m", "fp16")] == ["regression"]
    # a real slowdown of the converted model still fires when its fp32 reference also got slower
    (f,) = latency_rule(quiet, job(1.30, 0.014), TH, "m", "fp16")
    assert f.category == "regression"

