"""Latency of the converted and the fp32 model on the job's target provider.

Both models are timed in the same job, interleaved run by run so drift (thermal, other load)
affects both alike: ``warmup`` untimed runs each, then ``runs`` samples each.  A sample is a *block
minimum*: the fastest of ``k`` runs of that model, the two models' runs alternating within the block
(converted, fp32, converted, fp32, ...).  ``k`` (:func:`block_runs`) is as many pairs as fit in
:data:`BLOCK_BUDGET_MS` of model work, between 1 and :data:`BLOCK_MAX_RUNS`, so a block stays short for
big models (one pair when a pair alone exceeds the budget: the old one-run samples).  The work of a pair is
the warmup's fastest run of each model in CPU time of the timing thread, which other load hardly changes
(wall time does: at load average 15 on two cores a 10 ms model took 124 ms of wall time, and a wall-time
estimate would have cut the block to one run exactly when the load makes blocks matter).

Each block records the least wall time (``samples_ms``, ``fp32_samples_ms``: the latency reported,
``p50_ms``/``p90_ms``/``min_ms`` are percentiles of these block minima, ``runs_per_sample`` says ``k``) and,
where it is the model's work (:func:`cpu_time_measures_work`: CPU provider, one intra-op thread), the least
CPU time of the timing thread (``cpu_samples_ms``, ``fp32_cpu_samples_ms``), which the latency rule prefers.

Why: CI jobs on the same machine come and go in bursts (process start-up, imports, file writes).  One run of
each model caught a burst on one side only often enough that per-run converted/fp32 wall-time ratios spread
0.3-2.9 within one job (light_squeezenet fp16 under 4 job-like load processes on 2 cores), which hid a 20 %
slowdown; block minima of wall time narrowed that only a little at load average 15 (interquartile range
0.79-1.30), CPU-time block minima to 0.97-1.01.  Peak RSS is sampled by a background thread while the
models run.

Jobs on one machine (the embedded pool's worker processes, several Celery workers sharing a cache
dir) time one at a time: :func:`timing_slot` holds an exclusive ``flock`` on a file (:data:`TIMING_LOCK` under
the cache dir) for the timed section, so two jobs' onnxruntime thread pools never compete for the cores while
either is timed (on two cores such overlap swung a 0.2 ms model's converted/fp32 ratio by 2x between A/A jobs).

A converted model that cannot be timed is not a failed job: :func:`latency_error` says why, as information
(:data:`workers.result.LATENCY_UNSUPPORTED`) where the provider lacks the kernels, else the session's error.
"""

from __future__ import annotations

import fcntl
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from workers.measure.runners import SessionRunner
from workers.result import LATENCY_UNSUPPORTED, LatencyStats

_PROC: psutil.Process | None = None
#: Wall-time budget of one block (one stored sample of each model): ``k`` alternating pairs fit in it.
BLOCK_BUDGET_MS = 200.0
#: Most timed runs of each model per block (the fastest of them is the sample).
BLOCK_MAX_RUNS = 5
#: File under the cache dir whose lock makes the jobs of one machine time their models one at a time.
TIMING_LOCK = "timing.lock"


def _this_process() -> psutil.Process:
    """psutil's handle on this process, made once per process (a fork gets its own)."""
    global _PROC
    if _PROC is None or _PROC.pid != os.getpid():
        _PROC = psutil.Process()
    return _PROC


class _RssSampler:
    """Samples this process's RSS every ``interval`` seconds; ``peak_mb`` after ``stop``."""

    def __init__(self, interval: float = 0.005) -> None:
        self._proc = _this_process()
        self._interval = interval
        self._stop = threading.Event()
        self.peak = self._proc.memory_info().rss
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._proc.memory_info().rss)
            self._stop.wait(self._interval)

    def __enter__(self) -> _RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._proc.memory_info().rss)

    @property
    def peak_mb(self) -> float:
        return self.peak / 2**20


def percentile(samples: list[float], q: float) -> float:
    """The ``q``-th percentile (linear interpolation); 0.0 for no samples."""
    return float(np.percentile(np.asarray(samples), q)) if samples else 0.0


@contextmanager
def timing_slot(lock_file: Path | None) -> Iterator[None]:
    """Hold the machine's timing slot (an exclusive ``flock`` on ``lock_file``, created if needed) for the
    ``with`` block; no lock when ``lock_file`` is None.  Released when the block ends or the process dies."""
    if lock_file is None:
        yield
        return
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def block_runs(pair_ms: float, budget_ms: float = BLOCK_BUDGET_MS, max_runs: int = BLOCK_MAX_RUNS) -> int:
    """Runs of each model per block: as many pairs of ``pair_ms`` (one run of each model) as fit in
    ``budget_ms``, at least 1 and at most ``max_runs`` (``max_runs`` for a pair of unknown or zero length)."""
    if not pair_ms > 0:
        return max(1, max_runs)
    return max(1, min(max_runs, int(budget_ms // pair_ms)))


def fastest_alternating(timed: Sequence[Callable[[], tuple[float, ...]]], k: int) -> list[tuple[float, ...]]:
    """Calls the ``timed`` functions in order, ``k`` rounds (a, b, a, b, ...; at least one), and returns each
    one's fastest result, component by component (e.g. the least wall time and the least CPU time): the block
    minima of every side, all taken over the same window."""
    best: list[tuple[float, ...] | None] = [None] * len(timed)
    for _ in range(max(1, k)):
        for i, fn in enumerate(timed):
            got = fn()
            prev = best[i]
            best[i] = got if prev is None else tuple(min(a, b) for a, b in zip(prev, got, strict=True))
    return [b for b in best if b is not None]


def cpu_time_measures_work(runner: SessionRunner) -> bool:
    """True when the calling thread's CPU time is the work of a run of ``runner``: the CPU provider with one
    intra-op thread (onnxruntime then computes in the calling thread).  Not for CUDA (the work is on the
    device) nor thread pools (other threads work, and spin)."""
    if runner.provider != "CPUExecutionProvider":
        return False
    try:
        return int(runner.session.get_session_options().intra_op_num_threads) == 1
    except (AttributeError, TypeError, ValueError):
        return False


def measure_latency(converted: SessionRunner, fp32: SessionRunner, feeds: Mapping[str, np.ndarray],
                    runs: int, warmup: int, lock_file: Path | None = None,
                    budget_ms: float = BLOCK_BUDGET_MS, max_block: int = BLOCK_MAX_RUNS) -> LatencyStats:
    """``runs`` block minima of each runner (see module doc; blocks of :func:`block_runs` of the warmup's
    fastest pair in CPU ms, ``budget_ms`` and ``max_block``; at least one warmup pair runs for that estimate)
    inside the timing slot of ``lock_file``: wall ms always, thread CPU ms of the same blocks when
    :func:`cpu_time_measures_work` for both runners (else those lists stay empty); raises SessionError if a
    run fails."""
    conv_feeds, fp32_feeds = converted.adapt(feeds), fp32.adapt(feeds)
    with_cpu = cpu_time_measures_work(converted) and cpu_time_measures_work(fp32)
    blocks: list[list[tuple[float, ...]]] = []
    pair = (lambda: _timed(converted, conv_feeds), lambda: _timed(fp32, fp32_feeds))
    with timing_slot(lock_file), _RssSampler() as rss:
        warm: tuple[list[float], list[float]] = ([], [])
        for _ in range(max(1, warmup)):
            warm[0].append(pair[0]()[1])
            warm[1].append(pair[1]()[1])
        k = block_runs(min(warm[0]) + min(warm[1]), budget_ms, max_block)
        for _ in range(max(1, runs)):
            blocks.append(fastest_alternating(pair, k))
    samples = [b[0][0] for b in blocks]
    fp32_samples = [b[1][0] for b in blocks]
    p50, fp50 = percentile(samples, 50), percentile(fp32_samples, 50)
    return LatencyStats(
        provider=converted.provider, samples_ms=samples, fp32_samples_ms=fp32_samples,
        p50_ms=p50, p90_ms=percentile(samples, 90), min_ms=min(samples), fp32_p50_ms=fp50,
        speedup=(fp50 / p50) if p50 > 0 else 0.0, peak_rss_mb=rss.peak_mb, peak_device_mb=None,
        runs_per_sample=k, cpu_samples_ms=[b[0][1] for b in blocks] if with_cpu else [],
        fp32_cpu_samples_ms=[b[1][1] for b in blocks] if with_cpu else [])


def timed_run(session: Any, feeds: Mapping[str, np.ndarray]) -> tuple[float, float]:
    """``(wall ms, calling thread's CPU ms)`` of one raw ``session.run``."""
    w0, c0 = time.perf_counter(), time.thread_time()
    session.run(None, dict(feeds))
    return (time.perf_counter() - w0) * 1000.0, (time.thread_time() - c0) * 1000.0


def _timed(runner: SessionRunner, feeds: Mapping[str, np.ndarray]) -> tuple[float, float]:
    """:func:`timed_run` of ``runner``'s session (counted as model execution on the runner's clock).  The CPU
    time estimates the model's work when :func:`cpu_time_measures_work` (waiting for the cores under other
    load inflates wall time, not CPU time; at load average 15 on two cores a run of 8.5 ms of CPU took 124 ms
    of wall time, and per-run converted/fp32 ratios spread 0.26-2.7 in wall time, 0.82-1.21 in CPU time)."""
    with runner.clock.executing():
        return timed_run(runner.session, feeds)


def latency_error(exc: BaseException, target: str, dtype: str) -> str:
    """Why the converted model was not timed.  onnxruntime's CPU provider has no bf16 kernels for most ops
    (NOT_IMPLEMENTED): that is information (:data:`workers.result.LATENCY_UNSUPPORTED`), said once, not a
    failure of the model; anything else is the session's error."""
    text = str(exc)
    if target == "cpu" and dtype == "bf16" and "NOT_IMPLEMENTED" in text:
        ops = sorted(set(re.findall(r"implementation for (\w+)\(", text)))
        first = f" (first missing: {', '.join(ops)})" if ops else ""
        return (f"{LATENCY_UNSUPPORTED}onnxruntime's CPU provider has no bf16 kernels for these ops{first}; "
                "bf16 latency is measured on CUDA workers (--target cuda)")
    return f"converted model not timed: {text}"
