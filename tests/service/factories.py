"""Builders of real ``workers.result.JobResult`` objects and small seeded stores for the service tests."""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

from service.db import Store
from service.db.migrate import upgrade
from service.orchestration.judge import detect_run, record_verdict
from workers.result import (
    AccuracyReport,
    ConvergenceStats,
    GraphFacts,
    JobResult,
    LatencyStats,
    OutputMetrics,
)

CELL = ("tiny_mlp", "fp16", "default", "cpu")


def sha(n: int) -> str:
    """A deterministic 40-hex sha for commit number ``n``."""
    return f"{n:08x}" + "c0ffee" * 5 + "ab"


def make_result(cell: tuple[str, str, str, str] = CELL, status: str = "pass", max_abs: float = 1e-3,
                cosine: float = 0.9999, latency_ms: float | None = 2.0, env: str = "env-a",
                lp_fraction: float = 0.9, casts: int = 4, diverged: bool | None = None, final_error: float = 1e-4,
                seed: int = 0, samples: int = 20, fp32_ms: float = 3.6) -> JobResult:
    """A complete JobResult built through the real dataclasses (latency samples jittered ±1 %; the fp32
    model, which no pass revision changes, timed at ``fp32_ms`` beside them)."""
    model, dtype, policy, target = cell
    converted = status in ("pass", "fail_accuracy", "diverged")
    rng = random.Random(seed)
    latency = None
    if converted and latency_ms is not None:
        s = [latency_ms * (1 + rng.uniform(-0.01, 0.01)) for _ in range(samples)]
        f = [fp32_ms * (1 + rng.uniform(-0.01, 0.01)) for _ in range(samples)]
        p50 = sorted(s)[len(s) // 2]
        latency = LatencyStats(provider="CPUExecutionProvider", samples_ms=s, fp32_samples_ms=f, p50_ms=p50,
                               p90_ms=max(s), min_ms=min(s), fp32_p50_ms=sorted(f)[len(f) // 2],
                               speedup=sorted(f)[len(f) // 2] / p50)
    worst = OutputMetrics(max_abs=max_abs, mean_abs=max_abs / 10, max_rel=max_abs * 5, cosine=cosine,
                          snr_db=60.0, baseline_max_abs=1e-6)
    return JobResult(
        model=model, dtype=dtype, policy=policy, target=target, status=status,
        message="" if converted else f"{status}: boom",
        accuracy=AccuracyReport(mode="emulation", provider="CPUExecutionProvider", per_output={"y": worst},
                                worst=worst, passed=status == "pass") if converted else None,
        latency=latency,
        convergence=ConvergenceStats(steps=8, step_errors=[final_error] * 8, final_error=final_error,
                                     max_error=final_error, diverged=bool(diverged))
        if converted and diverged is not None else None,
        graph=GraphFacts(nodes_total=20, nodes_low=18, casts_inserted=casts, compute_nodes=10,
                         compute_low=int(lp_fraction * 10), low_precision_compute_fraction=lp_fraction)
        if converted else None,
        environment={"fingerprint": env, "onnxruntime": "1.20"}, timings={"total_s": 1.0})


class Clock:
    """A deterministic clock advancing one minute per call, from 2026-11-01 00:00 UTC."""

    def __init__(self, start: datetime = datetime(2026, 11, 1, tzinfo=UTC)) -> None:
        self.t = start

    def __call__(self) -> datetime:
        self.t += timedelta(minutes=1)
        return self.t


def migrated_store(url: str, clock: Clock | None = None) -> Store:
    """A Store on a freshly upgraded database."""
    upgrade(url)
    return Store.from_url(url, clock=clock or Clock())


def chain(store: Store, n: int, branch: str = "main", start: int = 0) -> list[str]:
    """Record a linear history of ``n`` commits (first parent = previous); return their shas."""
    shas: list[str] = []
    for i in range(start, start + n):
        store.upsert_revision(sha(i), [shas[-1]] if shas else ([sha(start - 1)] if start else []), branch,
                              "dev <dev@example.com>", f"commit {i}",
                              datetime(2026, 10, 1, tzinfo=UTC) + timedelta(hours=i))
        shas.append(sha(i))
    return shas


def run_with(store: Store, revision: str, results: list[JobResult], trigger: str = "push",
             baseline: str | None = None, detect: bool = True) -> int:
    """Create a run of the results' cells, write them, finish it and (by default) detect and record its
    verdict."""
    run_id = store.create_run(revision, trigger, baseline_sha=baseline, cells=[r.cell for r in results])
    for r in results:
        store.write_result(run_id, r)
    store.finish_run(run_id)
    if detect:
        detect_run(store, run_id)
        record_verdict(store, run_id)  # as the finisher does: what the lists of runs show
    return run_id


def cells(n: int) -> Iterator[tuple[str, str, str, str]]:
    """``n`` distinct cells."""
    for i in range(n):
        yield (f"model_{i // 4:03d}", ("fp16", "bf16")[i % 2], ("default", "aggressive")[(i // 2) % 2], "cpu")
