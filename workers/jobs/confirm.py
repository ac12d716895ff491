"""Confirmation job: time a cell at the baseline and at the candidate revision, interleaved, on one worker.

A timing finding (latency, conversion time) compares two jobs that ran at different times, possibly under
different machine load.  :func:`confirm_cell` measures both revisions *in the same job*, alternating
(pair ``i`` runs baseline then candidate for even ``i``, candidate then baseline for odd ``i``, so neither
side always goes first), the way ``asv run --interleave-processes`` alternates commits.  Whatever slows the
machine during a pair slows both of its samples; the service decides with a paired test on the per-pair
ratios (:mod:`service.regressions.confirm`).

Guarantees: ``pairs`` pairs per timing kind asked for (``conversion_time``: one conversion per side per pair,
each a fresh child of that revision's zygote; ``latency``: per pair, :data:`LATENCY_RUNS_PER_PAIR` runs of
each side's converted model alternating run by run, the fastest of each side, in CPU time of the timing
thread on one-thread CPU sessions (wall time otherwise), inside the machine's timing slot); every failure
ends as :class:`ConfirmError` with a one-line message (the caller turns it into a job status); it imports nothing from ``service``.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workers.jobs.spec import target_kind
from workers.measure.latency import (
    TIMING_LOCK,
    cpu_time_measures_work,
    fastest_alternating,
    timed_run,
    timing_slot,
)
from workers.revision.config import WorkerConfig
from workers.revision.convert import convert_in_subprocess
from workers.zoo.fetch import fetch_entry
from workers.zoo.inputs import make_feeds
from workers.zoo.manifest import load_zoo

#: The timing kinds a confirmation job can measure (the rules' timing kinds).
CONFIRMABLE = ("latency", "conversion_time")
#: Timed runs of each side per latency pair, alternating run by run (each side's fastest is the pair's sample).
LATENCY_RUNS_PER_PAIR = 7


class ConfirmError(Exception):
    """The confirmation could not measure: ``status`` is the job status to report, the message says why."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status


def confirm_cell(cell: tuple[str, str, str, str], roots: dict[str, Path], kinds: list[str], pairs: int,
                 config: WorkerConfig, zoo_path: Path | None = None) -> dict[str, Any]:
    """Measure ``kinds`` of ``cell`` with the pass at ``roots["baseline"]`` and ``roots["candidate"]``
    interleaved (see module doc).  Returns ``{"pairs": n, "kinds": {kind: {"baseline": [...], "candidate":
    [...], "unit": "s"|"ms"}}, "seconds": wall}``; raises :class:`ConfirmError`."""
    model, dtype, policy, target = cell
    unknown = [k for k in kinds if k not in CONFIRMABLE]
    if unknown or not kinds:
        raise ConfirmError("bad_spec", f"cannot confirm kinds {unknown or kinds}; expected some of {CONFIRMABLE}")
    if policy == "auto":
        raise ConfirmError("bad_spec", "policy auto is not confirmed by interleaving (its search is not timed)")
    start = time.perf_counter()
    try:
        entry = load_zoo(zoo_path, config.data_dir).get(model)
        src = fetch_entry(entry, Path(config.cache_dir)).path
    except Exception as exc:  # noqa: BLE001 - zoo and fetch errors of several types
        raise ConfirmError("bad_model", f"cannot fetch {model}: {exc}") from None
    n = max(1, int(pairs))
    out: dict[str, Any] = {"pairs": n, "kinds": {}}
    with tempfile.TemporaryDirectory(prefix="ampci-confirm-") as tmp:
        tmpdir = Path(tmp)
        converted: dict[str, Path] = {}

        def convert(side: str, i: int) -> float:
            dst, report = tmpdir / f"{side}-{i}.onnx", tmpdir / f"{side}-{i}.json"
            got = convert_in_subprocess(src, dst, report, dtype, policy, target_kind(target), roots[side],
                                        config.convert_timeout, config.convert_memory,
                                        sandbox=config.sandbox_policy())
            if got.status != "ok":
                raise ConfirmError(got.status, f"{side} revision: {got.message}")
            converted.setdefault(side, dst)
            return got.wall_s

        sides = ("baseline", "candidate")
        if "conversion_time" in kinds:
            samples: dict[str, list[float]] = {s: [] for s in sides}
            for i in range(n):
                for side in sides if i % 2 == 0 else sides[::-1]:
                    samples[side].append(round(convert(side, i), 6))
            out["kinds"]["conversion_time"] = {**samples, "unit": "s"}
        if "latency" in kinds:
            for side in sides:
                if side not in converted:
                    convert(side, 0)
            out["kinds"]["latency"] = _latency_pairs(converted, entry, target, n, config)
    out["seconds"] = round(time.perf_counter() - start, 3)
    return out


def _latency_pairs(converted: dict[str, Path], entry: Any, target: str, n: int,
                   config: WorkerConfig) -> dict[str, Any]:
    """``n`` interleaved latency pairs of the two converted models, each side's the fastest of
    :data:`LATENCY_RUNS_PER_PAIR` runs alternating with the other side's: in CPU ms of the timing thread
    where that is the model's work (:func:`workers.measure.latency.cpu_time_measures_work`; unit ``ms of CPU``: what
    other load on the machine does not inflate), else wall ms (unit ``ms``)."""
    from workers.measure.runners import SessionRunner
    from workers.measure.sessions import SessionError, cuda_usable
    from workers.timing import JobClock

    kind = target_kind(target)
    if kind == "cuda" and not cuda_usable():
        raise ConfirmError("bad_spec", "no usable CUDA device on this worker")
    feeds = make_feeds(entry, entry.seed)
    clock = JobClock()
    try:
        runners = {side: SessionRunner(path.read_bytes(), kind, clock, intra_op_threads=config.latency_threads)
                   for side, path in converted.items()}
        adapted = {side: r.adapt(feeds) for side, r in runners.items()}
        samples: dict[str, list[float]] = {s: [] for s in runners}
        sides = ("baseline", "candidate")
        with_cpu = all(cpu_time_measures_work(r) for r in runners.values())
        with timing_slot(Path(config.cache_dir) / TIMING_LOCK):
            for side in sides:
                for _ in range(max(1, config.latency_warmup)):
                    runners[side].session.run(None, adapted[side])

            def timed(side: str) -> Callable[[], tuple[float, float]]:
                return lambda: timed_run(runners[side].session, adapted[side])

            for i in range(n):
                order = sides if i % 2 == 0 else sides[::-1]
                # the fastest of each side's alternating runs: what the model costs, least disturbed by other
                # load (the same block minima as a job's samples, workers.measure.latency.fastest_alternating)
                for side, (wall_ms, cpu_ms) in zip(order, fastest_alternating([timed(s) for s in order],
                                                                               LATENCY_RUNS_PER_PAIR), strict=True):
                    samples[side].append(round(cpu_ms if with_cpu else wall_ms, 6))
    except SessionError as exc:
        raise ConfirmError("crash", f"converted model not timed: {exc}") from None
    return {**samples, "unit": "ms of CPU" if with_cpu else "ms"}
