"""A small, realistic history seeded through the real store code (create_run, write_result with real
JobResult objects, finish_run, detect_regressions) — shared by the dashboard tests and screenshots.

Main branch: six revisions r0..r5 (a first-parent chain), one ``push`` run each over 3 models x
(fp16, bf16) x (default, conservative) x cpu = 12 cells.  At r5 three cells regress:

- ``conv_small/fp16/default/cpu``: accuracy (pass -> fail_accuracy, max_abs x50);
- ``mlp_small/bf16/conservative/cpu``: latency (all samples x1.5, same environment);
- ``tiny_lstm/fp16/conservative/cpu``: conversion (convert_error).

A feature branch revision ``rf`` (parent r3) has a ``pull_request`` run with baseline r3.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from service.db import Store
from service.orchestration.judge import detect_run
from workers.result import AccuracyReport, GraphFacts, JobResult, LatencyStats, OutputMetrics

MODELS = ("conv_small", "mlp_small", "tiny_lstm")
DTYPES = ("fp16", "bf16")
POLICIES = ("default", "conservative")
TARGET = "cpu"
CELLS = [(m, d, p, TARGET) for m in MODELS for d in DTYPES for p in POLICIES]
ACC_CELL = ("conv_small", "fp16", "default", "cpu")
LAT_CELL = ("mlp_small", "bf16", "conservative", "cpu")
CONV_CELL = ("tiny_lstm", "fp16", "conservative", "cpu")
AUTHORS = ("Ada Lovelace", "Grace Hopper", "Edsger Dijkstra")


def sha(seed: str) -> str:
    """A deterministic 40-hex sha."""
    return hashlib.sha1(seed.encode()).hexdigest()


@dataclass
class Seeded:
    """What was seeded: revision shas (main, oldest first), run ids, the feature run, findings by cell."""

    main_shas: list[str]
    main_runs: list[int]
    feature_sha: str
    feature_run: int
    regressions: dict[tuple[str, str, str, str], int] = field(default_factory=dict)
    kinds: dict[tuple[str, str, str, str], str] = field(default_factory=dict)


def make_result(cell: tuple[str, str, str, str], revision: str, step: int, rng: random.Random, *,
                accuracy_bad: bool = False, slow: bool = False, convert_error: bool = False) -> JobResult:
    """A plausible JobResult for ``cell`` at ``revision`` (``step`` drifts the numbers a little)."""
    model, dtype, policy, target = cell
    if convert_error:
        return JobResult(model=model, dtype=dtype, policy=policy, target=target, status="convert_error",
                         revision=revision, message="AmpPassError: Loop body output dtype mismatch",
                         environment={"fingerprint": "cpu-ci-1"})
    noise = 2e-4 if dtype == "fp16" else 3e-3
    max_abs = noise * (1 + 0.05 * (step % 3)) * (50 if accuracy_bad else 1)
    cosine = 1 - max_abs * 0.02
    base_ms = {"conv_small": 2.0, "mlp_small": 0.6, "tiny_lstm": 1.4}.get(model, 0.5 + len(model) % 7 * 0.3) * (1.1 if policy == "conservative" else 1)
    samples = [round(base_ms * (1.5 if slow else 1) * (1 + rng.uniform(-0.02, 0.02)), 5) for _ in range(15)]
    fp32 = [round(base_ms * 1.35 * (1 + rng.uniform(-0.02, 0.02)), 5) for _ in range(15)]
    p50, f50 = sorted(samples)[7], sorted(fp32)[7]
    worst = OutputMetrics(max_abs=max_abs, mean_abs=max_abs / 10, max_rel=max_abs * 3, cosine=cosine, snr_db=60.0,
                          baseline_max_abs=1e-6)
    casts = 6 + (2 if policy == "conservative" else 0) + (1 if step >= 4 and model == "tiny_lstm" else 0)
    return JobResult(
        model=model, dtype=dtype, policy=policy, target=target,
        status="fail_accuracy" if accuracy_bad else "pass", revision=revision,
        message="accuracy outside tolerance" if accuracy_bad else "", model_sha256=sha(model) + sha(model)[:24],
        accuracy=AccuracyReport(mode="emulation", provider="CPUExecutionProvider", per_output={"y": worst},
                                worst=worst, passed=not accuracy_bad),
        latency=LatencyStats(provider="CPUExecutionProvider", samples_ms=samples, fp32_samples_ms=fp32, p50_ms=p50,
                             p90_ms=sorted(samples)[13], min_ms=min(samples), fp32_p50_ms=f50, speedup=f50 / p50),
        graph=GraphFacts(nodes_total=40, nodes_low=34, casts_inserted=casts, compute_nodes=30, compute_low=28,
                         low_precision_compute_fraction=0.93 if policy == "default" else 0.86),
        environment={"fingerprint": "cpu-ci-1"}, timings={"total_s": 1.5})


def write_all(store: Store, run_id: int, results: Sequence[JobResult], threads: int = 8) -> None:
    """Write results through ``Store.write_result`` from a few threads (each write is its own
    transaction; commits dominate, so threads cut the seeding time), then finish the run."""
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda r: store.write_result(run_id, r), results))
    store.finish_run(run_id)


def seed(store: Store, revisions: int = 6) -> Seeded:
    """Seed the scenario of the module docstring; return what was created."""
    rng = random.Random(8)
    t0 = datetime(2026, 11, 20, 9, 0, tzinfo=UTC)
    shas = [sha(f"main-{i}") for i in range(revisions)]
    runs = []
    last = revisions - 1
    for i, s in enumerate(shas):
        store.upsert_revision(s, parents=[shas[i - 1]] if i else [], branch="main", author=AUTHORS[i % 3],
                              message=f"pass: revision {i} of the cast placement work\n\nbody",
                              committed_at=t0 + timedelta(hours=i))
        run = store.create_run(s, "push", cells=CELLS, meta={"seeded": True})
        write_all(store, run, [make_result(cell, s, i, rng, accuracy_bad=i == last and cell == ACC_CELL,
                                           slow=i == last and cell == LAT_CELL,
                                           convert_error=i == last and cell == CONV_CELL) for cell in CELLS])
        detect_run(store, run)
        runs.append(run)
    feature = sha("feature-1")
    store.upsert_revision(feature, parents=[shas[3]], branch="feature/resize", author="Barbara Liskov",
                          message="Keep Resize scales in fp32", committed_at=t0 + timedelta(hours=3, minutes=30))
    frun = store.create_run(feature, "pull_request", baseline_sha=shas[3], cells=CELLS)
    write_all(store, frun, [make_result(cell, feature, 3, rng) for cell in CELLS])
    detect_run(store, frun)
    out = Seeded(main_shas=shas, main_runs=runs, feature_sha=feature, feature_run=frun)
    for f in store.regressions(run_id=runs[-1], category="regression"):
        out.regressions[f.cell] = f.id
        out.kinds[f.cell] = f.kind
    return out


WIDE_MODELS = tuple(f"model_{i:02d}" for i in range(40))
WIDE_CELLS = [(m, d, p, t) for m in WIDE_MODELS for d in DTYPES for p in POLICIES for t in ("cpu", "cuda", "trt")]


@dataclass
class WideSeeded:
    """The 40 models x 12 columns scenario: two main revisions after ``parent``."""

    shas: list[str]
    runs: list[int]
    states: dict[tuple[str, str, str, str], str]  # expected displayed state of special cells


def seed_wide(store: Store, parent: str, flaky_pattern: str = "model_07/bf16/default/*") -> WideSeeded:
    """40 models x (fp16, bf16) x (default, conservative) x (cpu, cuda, trt) = 480 cells at two
    revisions; the second has accuracy, latency and conversion regressions, an improvement, a
    regression on an allowlisted (flaky) cell, and old failures/errors present at both."""
    from service.regressions.thresholds import Thresholds

    rng = random.Random(40)
    shas = [sha(f"wide-{i}") for i in range(2)]
    acc = {("model_03", "fp16", "default", "cpu"), ("model_21", "bf16", "conservative", "cuda")}
    slow = {("model_12", "fp16", "default", "cuda")}
    conv = {("model_30", "bf16", "default", "trt")}
    flaky = ("model_07", "bf16", "default", "cpu")
    better = ("model_15", "fp16", "conservative", "cpu")
    old_fail = ("model_05", "bf16", "conservative", "trt")
    old_error = ("model_38", "fp16", "default", "trt")
    runs = []
    for i, s in enumerate(shas):
        store.upsert_revision(s, parents=[shas[i - 1] if i else parent], branch="main", author=AUTHORS[i],
                              message=f"pass: widen the matrix ({i})")
        run = store.create_run(s, "push", cells=WIDE_CELLS)
        results = []
        for cell in WIDE_CELLS:
            r = make_result(cell, s, 0, rng, accuracy_bad=(i == 1 and (cell in acc or cell == flaky))
                            or cell == old_fail or (i == 0 and cell == better),
                            slow=i == 1 and cell in slow, convert_error=(i == 1 and cell in conv) or cell == old_error)
            results.append(r)
        write_all(store, run, results)
        detect_run(store, run, Thresholds(flaky_allowlist=(flaky_pattern,)))
        runs.append(run)
    states = {**{c: "reg-accuracy" for c in acc}, **{c: "reg-latency" for c in slow},
              **{c: "reg-conversion" for c in conv}, flaky: "flaky", better: "improved", old_fail: "fail",
              old_error: "error", ("model_00", "fp16", "default", "cpu"): "pass"}
    return WideSeeded(shas=shas, runs=runs, states=states)
