"""Latency samples are block minima (:mod:`workers.measure.latency`): each stored sample of each model is the fastest of
``k`` runs alternating with the other model's, so a burst of other load that slows one side of one run does not
reach the converted/fp32 ratio; ``k`` fits the block in its time budget (one pair for a big model).

The runners here are fakes whose ``session.run`` advances a scripted clock (the real one would make the
assertions depend on this busy machine): every run's duration is given, so the block minima are exact.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator, Mapping
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import workers.measure.latency as latency
from workers.measure.latency import block_runs, cpu_time_measures_work, fastest_alternating, measure_latency
from workers.result import JobResult, LatencyStats
from workers.timing import JobClock


class _Clock:
    """Wall and process CPU clocks that only move when a fake model runs: a run of ``d`` ms of work takes
    ``d * contention`` ms of wall time (other load keeps it off the cores for the rest)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.cpu = 0.0
        self.contention = 1.0

    def perf_counter(self) -> float:
        return self.now

    def thread_time(self) -> float:
        return self.cpu


class _Runner:
    """A runner whose every run takes the next duration (ms) of ``durations`` on ``clock``."""

    def __init__(self, clock: _Clock, durations: Iterator[float], provider: str = "CPUExecutionProvider",
                 threads: int = 1) -> None:
        self.provider = provider
        self.clock = JobClock()
        self.runs = 0
        self._durations = durations
        self._time = clock
        options = SimpleNamespace(intra_op_num_threads=threads)
        self.session = SimpleNamespace(run=self._run, get_session_options=lambda: options)

    def adapt(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(feeds)

    def _run(self, _names: Any, _feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        self.runs += 1
        work = next(self._durations) / 1000.0
        self._time.now += work * self._time.contention
        self._time.cpu += work
        return []


def _bursty(base_ms: float, burst_every: int, phase: int) -> Iterator[float]:
    """``base_ms`` per run, except every ``burst_every``-th run (from ``phase``), which other load slows 3x."""
    i = 0
    while True:
        yield base_ms * 3 if (i - phase) % burst_every == 0 else base_ms
        i += 1


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    c = _Clock()
    monkeypatch.setattr(latency, "time", SimpleNamespace(perf_counter=c.perf_counter, thread_time=c.thread_time))
    return c


def test_block_minima_keep_bursts_out_of_the_ratio(clock: _Clock) -> None:
    # the converted model costs 12 ms, fp32 10 ms; bursts slow one side's run at a time, never both at once
    conv = _Runner(clock, _bursty(12.0, 3, 1))
    fp32 = _Runner(clock, _bursty(10.0, 4, 2))
    stats = measure_latency(conv, fp32, {}, runs=20, warmup=3)  # type: ignore[arg-type]
    k = block_runs(22.0)
    assert stats.runs_per_sample == k == 5
    assert len(stats.samples_ms) == len(stats.fp32_samples_ms) == 20
    ratios = [a / b for a, b in zip(stats.samples_ms, stats.fp32_samples_ms, strict=True)]
    assert ratios == pytest.approx([1.2] * 20)  # one run per sample: 0.4 .. 3.6
    assert stats.p50_ms == pytest.approx(12.0) and stats.fp32_p50_ms == pytest.approx(10.0)
    assert stats.p90_ms == pytest.approx(12.0) and stats.min_ms == pytest.approx(12.0)
    assert stats.speedup == pytest.approx(10.0 / 12.0)
    assert conv.runs == fp32.runs == 3 + 20 * k  # warmup pairs, then k alternating runs per sample


def test_a_big_model_gets_one_run_per_sample(clock: _Clock) -> None:
    conv = _Runner(clock, iter(lambda: 150.0, None))
    fp32 = _Runner(clock, iter(lambda: 120.0, None))
    stats = measure_latency(conv, fp32, {}, runs=4, warmup=2)  # type: ignore[arg-type]
    assert stats.runs_per_sample == 1 and len(stats.samples_ms) == 4
    assert conv.runs == fp32.runs == 2 + 4  # the block never grows past its budget for a big model


def test_the_block_size_comes_from_the_warmups_fastest_pair(clock: _Clock) -> None:
    # the first warmup run is slow (session start-up): the estimate takes the fastest of each side
    conv = _Runner(clock, iter([500.0, 40.0, 40.0, *[40.0] * 100]))
    fp32 = _Runner(clock, iter([500.0, 30.0, 30.0, *[30.0] * 100]))
    stats = measure_latency(conv, fp32, {}, runs=3, warmup=3)  # type: ignore[arg-type]
    assert stats.runs_per_sample == 2  # 200 ms budget // 70 ms pair
    # warmup 0 still times one pair for the estimate
    conv0 = _Runner(clock, iter(lambda: 1.0, None))
    fp320 = _Runner(clock, iter(lambda: 1.0, None))
    assert measure_latency(conv0, fp320, {}, runs=2, warmup=0).runs_per_sample == latency.BLOCK_MAX_RUNS  # type: ignore[arg-type]
    assert conv0.runs == 1 + 2 * latency.BLOCK_MAX_RUNS


def test_load_that_stretches_wall_time_does_not_shrink_the_block(clock: _Clock) -> None:
    # a 10 ms + 10 ms pair that other load stretches to 170 ms each: the block is sized by the work (CPU time)
    clock.contention = 17.0
    conv = _Runner(clock, iter(lambda: 10.0, None))
    fp32 = _Runner(clock, iter(lambda: 10.0, None))
    stats = measure_latency(conv, fp32, {}, runs=2, warmup=2)  # type: ignore[arg-type]
    assert stats.runs_per_sample == latency.BLOCK_MAX_RUNS
    assert stats.samples_ms == pytest.approx([170.0, 170.0])  # the latency reported is wall time
    assert stats.cpu_samples_ms == stats.fp32_cpu_samples_ms == pytest.approx([10.0, 10.0])  # and the work


def test_cpu_samples_only_where_cpu_time_is_the_models_work(clock: _Clock) -> None:
    clock.contention = 3.0
    for conv, fp32 in ((_Runner(clock, iter(lambda: 1.0, None), threads=0), _Runner(clock, iter(lambda: 1.0, None))),
                       (_Runner(clock, iter(lambda: 1.0, None), provider="CUDAExecutionProvider"),
                        _Runner(clock, iter(lambda: 1.0, None), provider="CUDAExecutionProvider"))):
        stats = measure_latency(conv, fp32, {}, runs=3, warmup=1)  # type: ignore[arg-type]
        assert stats.samples_ms == pytest.approx([3.0] * 3)
        assert stats.cpu_samples_ms == [] and stats.fp32_cpu_samples_ms == []
    assert cpu_time_measures_work(_Runner(clock, iter(lambda: 1.0, None)))  # type: ignore[arg-type]


@pytest.mark.parametrize(("pair_ms", "want"), [(0.2, 5), (22.0, 5), (50.0, 4), (70.0, 2), (199.0, 1), (900.0, 1),
                                               (0.0, 5), (float("nan"), 5)])
def test_block_runs_fit_the_budget(pair_ms: float, want: int) -> None:
    assert block_runs(pair_ms) == want


def test_fastest_alternating_alternates_and_keeps_each_sides_fastest() -> None:
    calls: list[str] = []
    a = iter([(5.0, 1.0), (3.0, 2.0), (4.0, 0.5)])
    b = iter([(1.0, 9.0), (9.0, 1.0), (2.0, 3.0)])

    def run_a() -> tuple[float, float]:
        calls.append("a")
        return next(a)

    def run_b() -> tuple[float, float]:
        calls.append("b")
        return next(b)

    # each component's own minimum (the least wall time and the least CPU time need not be the same run)
    assert fastest_alternating([run_a, run_b], 3) == [(3.0, 0.5), (1.0, 1.0)]
    assert calls == ["a", "b"] * 3
    assert fastest_alternating([lambda: (7.0,)], 0) == [(7.0,)]  # at least one round


def test_block_fields_round_trip_and_old_results_read_as_one_run_without_cpu() -> None:
    r = JobResult(model="m", dtype="fp16", policy="default", target="cpu", status="pass",
                  latency=LatencyStats(provider="CPUExecutionProvider", samples_ms=[1.0], runs_per_sample=4,
                                       cpu_samples_ms=[0.9], fp32_cpu_samples_ms=[0.8]))
    d = r.to_dict()
    back = JobResult.from_dict(d).latency
    assert back is not None and (back.runs_per_sample, back.cpu_samples_ms, back.fp32_cpu_samples_ms) == (4, [0.9], [0.8])
    for key in ("runs_per_sample", "cpu_samples_ms", "fp32_cpu_samples_ms"):
        del d["latency"][key]  # stored before blocks and CPU time existed
    old = JobResult.from_dict(d).latency
    assert old is not None and (old.runs_per_sample, old.cpu_samples_ms, old.fp32_cpu_samples_ms) == (1, [], [])


def test_block_minima_of_a_real_session_are_positive_and_ordered() -> None:
    """The real clock and onnxruntime: every sample positive, p50 <= p90, min the smallest sample."""
    from onnx import TensorProto, helper

    from workers.measure.runners import SessionRunner

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "tiny",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    conv, fp32 = SessionRunner(model, "cpu", intra_op_threads=1), SessionRunner(model, "cpu", intra_op_threads=1)
    stats = measure_latency(conv, fp32, {"x": np.ones((1, 4), np.float32)}, runs=6, warmup=2)
    assert stats.runs_per_sample == latency.BLOCK_MAX_RUNS  # a tiny model: the most runs per block
    assert len(stats.cpu_samples_ms) == len(stats.fp32_cpu_samples_ms) == 6 and min(stats.cpu_samples_ms) > 0
    assert min(stats.samples_ms) > 0 and stats.min_ms == min(stats.samples_ms)
    assert stats.p50_ms == pytest.approx(statistics.median(stats.samples_ms)) and stats.p50_ms <= stats.p90_ms
