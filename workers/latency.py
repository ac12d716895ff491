"""Latency of the converted and the fp32 model on the job's target provider.

Both models are timed in the same job, interleaved run by run so drift (thermal, other load)
affects both alike: ``warmup`` untimed runs each, then ``runs`` timed runs each.  Peak RSS is
sampled by a background thread while the models run.

Jobs on one machine (the embedded pool's worker processes, several Celery workers sharing a cache
dir) time one at a time: :func:`timing_slot` holds an exclusive ``flock`` on a file for the timed
section, so two jobs' onnxruntime thread pools never compete for the cores while either is timed (on
two cores such overlap swung a 0.2 ms model's converted/fp32 ratio by 2x between A/A jobs).
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import psutil

from workers.result import LatencyStats
from workers.runners import SessionRunner

_PROC: psutil.Process | None = None


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


def measure_latency(converted: SessionRunner, fp32: SessionRunner, feeds: Mapping[str, np.ndarray],
                    runs: int, warmup: int, lock_file: Path | None = None) -> LatencyStats:
    """Time both runners (see module doc) inside the timing slot of ``lock_file``; raises SessionError if a
    run fails."""
    conv_feeds, fp32_feeds = converted.adapt(feeds), fp32.adapt(feeds)
    samples: list[float] = []
    fp32_samples: list[float] = []
    with timing_slot(lock_file), _RssSampler() as rss:
        for _ in range(max(0, warmup)):
            converted(conv_feeds)
            fp32(fp32_feeds)
        for _ in range(max(1, runs)):
            samples.append(_timed(converted, conv_feeds))
            fp32_samples.append(_timed(fp32, fp32_feeds))
    p50, fp50 = percentile(samples, 50), percentile(fp32_samples, 50)
    return LatencyStats(
        provider=converted.provider, samples_ms=samples, fp32_samples_ms=fp32_samples,
        p50_ms=p50, p90_ms=percentile(samples, 90), min_ms=min(samples), fp32_p50_ms=fp50,
        speedup=(fp50 / p50) if p50 > 0 else 0.0, peak_rss_mb=rss.peak_mb, peak_device_mb=None)


def _timed(runner: SessionRunner, feeds: Mapping[str, np.ndarray]) -> float:
    """Milliseconds of one raw session run (counted as model execution on the runner's clock)."""
    with runner.clock.executing():
        t0 = time.perf_counter()
        runner.session.run(None, dict(feeds))
        elapsed = time.perf_counter() - t0
    return elapsed * 1000.0
