"""Wall-clock bookkeeping of one job: phases, and how much of it was model execution.

Model execution is time spent inside onnxruntime (session creation, runs and release) plus the
pass's own conversion time as it reports it; everything else (subprocess start, cache fetch,
loading, checker, emulation rewrite, metrics, bookkeeping) is overhead.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


class JobClock:
    """Accumulates ``<phase>_s`` timings and model-execution seconds for one job."""

    def __init__(self) -> None:
        self._start = time.perf_counter()
        self.timings: dict[str, float] = {}
        self.exec_s = 0.0

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Add the block's wall time to ``timings[name + '_s']``."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            key = f"{name}_s"
            self.timings[key] = self.timings.get(key, 0.0) + time.perf_counter() - t0

    @contextmanager
    def executing(self) -> Iterator[None]:
        """Count the block as model execution."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.exec_s += time.perf_counter() - t0

    def add_exec(self, seconds: float) -> None:
        """Count ``seconds`` measured elsewhere (e.g. reported by the pass) as model execution."""
        self.exec_s += max(0.0, seconds)

    def finish(self) -> dict[str, float]:
        """All timings plus ``exec_s``, ``overhead_s``, ``total_s`` and ``overhead_fraction``."""
        total = time.perf_counter() - self._start
        out = dict(self.timings)
        out["exec_s"] = self.exec_s
        out["total_s"] = total
        out["overhead_s"] = max(0.0, total - self.exec_s)
        out["overhead_fraction"] = out["overhead_s"] / total if total > 0 else 0.0
        return out
