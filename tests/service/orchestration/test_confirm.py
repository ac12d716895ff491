"""Confirm before you accuse: the paired decision, and the run lifecycle around a confirmation run.

The decision (:func:`service.regressions.confirm.paired_verdict`) is pure; the lifecycle runs on the real
database (SQLite and PostgreSQL) through :func:`service.orchestration.jobs.finish_if_complete`, with a
stand-in for the worker that timed the pairs (its measurements are the test's input).
"""

from __future__ import annotations

import random

import pytest

from service.db import Store
from service.orchestration.confirm_run import confirmation_cost
from service.orchestration.jobs import finish_if_complete
from service.regressions.confirm import paired_verdict
from service.regressions.paired import min_pairs
from service.regressions.rules import CellSample, conversion_time_rule, latency_rule, pooled
from service.regressions.thresholds import Thresholds
from tests.service.factories import chain, make_result

TH = Thresholds()
CELL = ("tiny_mlp", "fp16", "default", "cpu")
OTHER = ("conv_net", "fp16", "default", "cpu")


def drifting(n: int, seed: int = 0) -> list[float]:
    """Per-pair machine speed factors: load that comes and goes between pairs (x1 .. x2)."""
    rng = random.Random(seed)
    return [1 + rng.random() for _ in range(n)]


def test_a_slowdown_timed_interleaved_is_confirmed_through_drift_that_fools_an_unpaired_test() -> None:
    speed = drifting(8)
    base = [1.0 * s for s in speed]
    cand = [1.2 * s * (1 + 0.01 * (-1) ** i) for i, s in enumerate(speed)]  # +20 %, 1 % jitter
    v = paired_verdict("latency", base, cand, TH, "ms")
    assert v.confirmed and v.ratio == pytest.approx(1.2, rel=0.02) and v.p_value < TH.confirm_p
    assert v.detail.startswith("confirmed by 8 interleaved pairs")
    # the same drift without a change: dismissed, although the raw samples differ by up to x2
    same = [1.0 * s * (1 + 0.01 * (-1) ** i) for i, s in enumerate(speed)]
    v = paired_verdict("latency", base, same, TH, "ms")
    assert not v.confirmed and v.detail.startswith("dismissed by 8 interleaved pairs")


def test_each_condition_of_a_confirmation_is_needed() -> None:
    base = [0.30 + 0.001 * i for i in range(8)]
    slow = [b + 0.5 for b in base]
    assert paired_verdict("conversion_time", base, slow, TH, "s").confirmed
    # below the ratio limit (x1.20 for conversion time), though every pair is slower
    assert not paired_verdict("conversion_time", [5.0] * 8, [5.5 + 0.001 * i for i in range(8)], TH, "s").confirmed
    # below the floor (0.1 s), though x1.5
    assert not paired_verdict("conversion_time", [0.1] * 8, [0.15 + 0.001 * i for i in range(8)], TH, "s").confirmed
    # one pair of eight against: p = 2/256 still < 0.01; two against: not significant
    mixed = [b * (0.5 if i == 0 else 3.0) for i, b in enumerate(base)]
    assert paired_verdict("conversion_time", base, mixed, TH, "s").confirmed
    mixed2 = [b * (0.5 if i < 2 else 3.0) for i, b in enumerate(base)]
    v = paired_verdict("conversion_time", base, mixed2, TH, "s")
    assert not v.confirmed and v.p_value > TH.confirm_p
    # nothing timed on both sides
    assert not paired_verdict("latency", [0.0] * 8, [1.0] * 8, TH, "ms").confirmed
    with pytest.raises(ValueError):
        paired_verdict("accuracy", base, slow, TH, "")


def test_fewer_pairs_than_min_pairs_can_never_confirm() -> None:
    assert min_pairs(0.01) == 7 and min_pairs(0.002) == 9 and min_pairs(0.5) == 2
    base = [1.0] * 6
    huge = [10.0 + i for i in range(6)]
    assert not paired_verdict("latency", base, huge, TH, "ms").confirmed  # 6 pairs: smallest p = 1/64
    assert paired_verdict("latency", [1.0] * 7, [10.0 + i for i in range(7)], TH, "ms").confirmed


def slow_conversion(seed: int, seconds: float) -> object:
    r = make_result(CELL, seed=seed)
    assert r.graph is not None
    rng = random.Random(seed)
    r.graph.convert_samples_s = [seconds * (1 + rng.uniform(-0.01, 0.01)) for _ in range(5)]
    return r


def make_run(store: Store, revision: str, results: list, confirm_pairs: int, baseline: str | None = None) -> int:
    run_id = store.create_run(revision, "push", baseline_sha=baseline, cells=[r.cell for r in results],
                              meta={"confirm_pairs": confirm_pairs})
    for job, r in zip(store.jobs(run_id), sorted(results, key=lambda r: r.cell), strict=True):
        store.write_result(run_id, r, job_id=job.id)
        store.mark_job(job.id, "done")
    return run_id


class StandInWorker:
    """Dispatch of a confirmation run: records it; ``work`` then answers its jobs with the given pairs
    (what :mod:`workers.jobs.confirm` would have timed), as a worker delivering them would."""

    def __init__(self, store: Store, pairs: dict[str, tuple[list[float], list[float]]]) -> None:
        self.store, self.pairs, self.sent = store, pairs, []

    def __call__(self, run_id: int) -> None:
        self.sent.append(run_id)

    def work(self) -> None:
        for run_id in self.sent:
            run = self.store.get_run(run_id)
            for job in self.store.jobs(run_id):
                confirm = run.meta["options"]["|".join(job.cell)]["confirm"]
                r = make_result(job.cell)
                r.latency = r.graph = r.accuracy = None
                r.confirmation = {"pairs": confirm["pairs"], "kinds": {
                    k: {"baseline": self.pairs[k][0], "candidate": self.pairs[k][1], "unit": "s"}
                    for k in confirm["kinds"]}}
                r.timings = {"total_s": 3.5}
                self.store.write_result(run_id, r, job_id=job.id)
                self.store.mark_job(job.id, "done")
            finish_if_complete(self.store, run_id, dispatch=self)


@pytest.mark.parametrize("confirmed", [True, False])
def test_a_suspected_regression_holds_its_run_open_until_the_confirmation_run_decides(
        store: Store, confirmed: bool) -> None:
    a, b = chain(store, 2)
    make_run(store, a, [slow_conversion(1, 0.3), make_result(OTHER, seed=1)], confirm_pairs=8)
    finish_if_complete(store, store.list_runs()[0].id)
    run_id = make_run(store, b, [slow_conversion(2, 0.9), make_result(OTHER, seed=2)], confirm_pairs=8)
    base = [0.3 + 0.001 * i for i in range(8)]
    worker = StandInWorker(store, {"conversion_time": (base, [x + (0.6 if confirmed else 0.0) for x in base])})

    assert finish_if_complete(store, run_id, dispatch=worker) is False  # confirming: not finished
    (reg,) = store.regressions(run_id=run_id)
    assert (reg.kind, reg.category, reg.state) == ("conversion_time", "regression", "suspected")
    assert store.get_run(run_id).status in ("queued", "running") and store.get_run(run_id).finished_at is None
    assert finish_if_complete(store, run_id, dispatch=worker) is False  # idempotent: one confirmation run
    (confirm_id,) = worker.sent
    confirm_run = store.get_run(confirm_id)
    assert confirm_run.trigger == "confirm" and confirm_run.meta["confirms"] == run_id
    assert [j.cell for j in store.jobs(confirm_id)] == [CELL]  # only the suspected cell
    assert confirm_run.meta["options"]["|".join(CELL)]["confirm"] == {"baseline": a, "kinds": ["conversion_time"],
                                                                       "pairs": 8}
    worker.work()  # the confirmation run's last job finishes it, and then its parent

    (reg,) = store.regressions(run_id=run_id)
    assert reg.state == ("open" if confirmed else "dismissed") and reg.state_by == "ampci-confirm"
    assert reg.state_note.startswith(("confirmed" if confirmed else "dismissed") + " by 8 interleaved pairs")
    assert store.get_run(run_id).status == "complete"
    assert store.run_summary(run_id).regressions == ({"conversion_time": 1} if confirmed else {})
    assert store.regressions(run_id=confirm_id) == []
    assert confirmation_cost(store, run_id) == {"runs": 1, "cells": 1, "job_seconds": 3.5}
    assert finish_if_complete(store, run_id, dispatch=worker) is True and len(worker.sent) == 1
    assert store.regressions(run_id=run_id)[0].state == reg.state  # re-detection keeps the verdict


def test_a_failed_confirmation_keeps_the_regression_and_says_why(store: Store) -> None:
    a, b = chain(store, 2)
    make_run(store, a, [slow_conversion(1, 0.3)], confirm_pairs=8)
    run_id = make_run(store, b, [slow_conversion(2, 0.9)], confirm_pairs=8)
    sent: list[int] = []
    assert finish_if_complete(store, run_id, dispatch=sent.append) is False
    for job in store.jobs(sent[0]):
        store.write_result(sent[0], make_result(job.cell, status="convert_error"), job_id=job.id)
        store.mark_job(job.id, "done")
    assert finish_if_complete(store, sent[0], dispatch=sent.append) is True
    (reg,) = store.regressions(run_id=run_id)
    assert reg.state == "open" and reg.state_note.startswith("not confirmed: the confirmation job ended convert_error")
    assert store.get_run(run_id).status == "complete"


def test_without_confirmation_a_timing_regression_is_open_at_once(store: Store) -> None:
    a, b = chain(store, 2)
    make_run(store, a, [slow_conversion(1, 0.3)], confirm_pairs=0)
    run_id = make_run(store, b, [slow_conversion(2, 0.9)], confirm_pairs=0)
    assert finish_if_complete(store, run_id, dispatch=lambda _: pytest.fail("nothing to confirm")) is True
    (reg,) = store.regressions(run_id=run_id)
    assert reg.state == "open" and reg.state_note is None


def conversion(seconds: list[float], reference: list[float] | None = None) -> CellSample:
    return CellSample(status="pass", env_fingerprint="env-a", convert_samples=tuple(seconds),
                      convert_reference=tuple(reference or ()))


def test_conversion_time_divides_out_a_machine_slowed_between_the_two_jobs() -> None:
    """Job-like load that came between the parent's job and the child's slows the conversion and the reference
    workload timed beside it alike: no finding; a slower pass slows the conversion only: a finding."""
    base = conversion([0.250, 0.252, 0.248, 0.251, 0.249], [0.050, 0.051, 0.049, 0.050, 0.050])
    busy = conversion([0.370, 0.366, 0.372, 0.368, 0.371], [0.074, 0.073, 0.075, 0.074, 0.074])
    assert conversion_time_rule(base, busy, TH, "m", "fp16") == []
    # without references (results stored before them) the wall times alone decide, as before
    assert [f.category for f in conversion_time_rule(conversion(list(base.convert_samples)),
                                                     conversion(list(busy.convert_samples)), TH, "m", "fp16")] == \
        ["regression"]
    slow = conversion([0.750, 0.752, 0.748, 0.751, 0.749], [0.050, 0.051, 0.049, 0.050, 0.050])
    (f,) = conversion_time_rule(base, slow, TH, "m", "fp16")
    assert f.category == "regression" and "relative" not in f.detail  # the machine did not drift
    # a slower pass on a busy machine: still a finding (x3 against x1.48 of the machine), judged relative to it
    slow_busy = conversion([1.11, 1.12, 1.10, 1.11, 1.11], [0.074, 0.073, 0.075, 0.074, 0.074])
    (f,) = conversion_time_rule(base, slow_busy, TH, "m", "fp16")
    assert f.category == "regression" and "x3.00 relative to the reference workload" in f.detail
    # a reference that jitters (+-30 %) but did not drift never hides a slower pass
    noisy = conversion([0.10, 0.098, 0.086, 0.137, 0.123], [0.020, 0.026, 0.015, 0.021, 0.019])
    slower = conversion([0.71, 0.69, 0.79, 0.82, 0.72], [0.014, 0.025, 0.021, 0.019, 0.026])
    assert [f.category for f in conversion_time_rule(noisy, slower, TH, "m", "fp16")] == ["regression"]
    # references pool with their samples
    pooled_base = pooled(base, [conversion([0.25] * 5, [0.05] * 5)])
    assert len(pooled_base.convert_reference) == len(pooled_base.convert_samples) == 10
    assert pooled(base, [conversion([0.25] * 5)]).convert_reference == ()  # one result without: none paired


def test_a_nightly_change_point_is_not_suspected_it_has_no_single_baseline_revision(store: Store) -> None:
    """The nightly latency test compares a series of nights (consecutive violations), not two revisions: there
    is no baseline revision to time interleaved, so its finding is open at once, even when confirming."""
    from service.orchestration.judge import detect_run

    (rev,) = chain(store, 1)

    def night(ms: float, seed: int) -> int:
        run_id = store.create_run(rev, "nightly", cells=[CELL], meta={"confirm_pairs": 8})
        store.write_result(run_id, make_result(CELL, latency_ms=ms, seed=seed))
        store.finish_run(run_id)
        detect_run(store, run_id)
        return run_id

    for i, ms in enumerate([2.0, 2.02, 1.98, 2.01, 1.99, 2.0, 2.03, 1.97, 2.0, 2.01]):
        night(ms, i)
    night(2.6, 20)
    (reg,) = store.regressions(run_id=night(2.62, 21))
    assert (reg.kind, reg.baseline_sha, reg.state) == ("latency", None, "open")


def latency(ms: float, fp32_ms: float, n: int = 20, seed: int = 0) -> CellSample:
    rng = random.Random(seed)
    jitter = [1 + rng.uniform(-0.01, 0.01) for _ in range(n)]
    return CellSample(status="pass", env_fingerprint="env-a", latency_samples=tuple(ms * j for j in jitter),
                      fp32_latency_samples=tuple(fp32_ms * (1 + rng.uniform(-0.01, 0.01)) for _ in range(n)))


def test_a_slower_model_on_a_machine_that_got_faster_is_still_a_latency_regression() -> None:
    """The floor is checked on the relative change at the baseline's p50: the child's job ran while the machine
    was faster (raw p50 14.2 -> 8.3 ms), yet its model is 20 % slower relative to fp32 (observed in the bench)."""
    base, new = latency(14.18, 13.62, seed=1), latency(8.33, 6.93, seed=2)
    (f,) = latency_rule(base, new, TH, "m", "fp16")
    assert f.category == "regression" and "ms -> 8.3" in f.detail and "(x1.15 relative to fp32" in f.detail
    # and the reverse: a machine slower during the child's job makes no regression of an unchanged model
    assert latency_rule(latency(8.3, 6.9, seed=3), latency(14.1, 11.7, seed=4), TH, "m", "fp16") == []
    # microseconds stay timer noise: x1.5 of a 0.05 ms model moves its p50 by 0.025 ms (floor 0.05)
    assert latency_rule(latency(0.05, 0.05, seed=5), latency(0.15, 0.1, seed=6), TH, "m", "fp16") == []


def spread_latency(cell: tuple[str, str, str, str], scale: float, seed: int) -> object:
    """A result whose converted/fp32 latency ratios spread widely (a busy machine): 20 samples, x0.5 .. x1.5."""
    from workers.result import LatencyStats

    r = make_result(cell, seed=seed)
    rng = random.Random(seed)
    fp32 = [10.0 * (1 + rng.uniform(-0.3, 0.3)) for _ in range(20)]
    conv = [f * scale * (0.5 + i / 19) for i, f in enumerate(fp32)]
    rng.shuffle(conv)
    r.latency = LatencyStats(provider="CPUExecutionProvider", samples_ms=conv, fp32_samples_ms=fp32,
                             p50_ms=sorted(conv)[10], p90_ms=max(conv), min_ms=min(conv),
                             fp32_p50_ms=sorted(fp32)[10], speedup=1.0)
    return r


@pytest.mark.parametrize("pairs", [8, 0])
def test_timing_regressions_are_screened_at_suspect_p_when_a_confirmation_will_judge_them(
        store: Store, pairs: int) -> None:
    """On a busy machine a 20 % slower model gave p = 0.007 (limit 0.002): with confirmation it is suspected
    (p < suspect_p, 0.05) and the interleaved pairs decide; without, the strict limit stands."""
    from service.orchestration.judge import detect_run
    from service.regressions.rules import relative_latency
    from service.regressions.stats import mann_whitney_p

    a, b = chain(store, 2)
    base, slow = spread_latency(CELL, 1.0, 1), spread_latency(CELL, 1.25, 2)
    rel = [relative_latency(CellSample("pass", latency_samples=tuple(r.latency.samples_ms),
                                       fp32_latency_samples=tuple(r.latency.fp32_samples_ms))) for r in (base, slow)]
    p = mann_whitney_p(rel[1], rel[0], "greater")
    assert TH.latency_p < p < TH.suspect_p  # the case: significant when screened only
    for sha, r in ((a, base), (b, slow)):
        run_id = store.create_run(sha, "push", cells=[CELL], meta={"confirm_pairs": pairs})
        store.write_result(run_id, r)
        store.finish_run(run_id)
        detect_run(store, run_id)
    found = [(f.kind, f.state) for f in store.regressions(run_id=run_id)]
    assert found == ([("latency", "suspected")] if pairs else [])
    # an improvement is never screened loosely: it is not confirmed
    fast = spread_latency(CELL, 0.76, 3)
    rel_fast = relative_latency(CellSample("pass", latency_samples=tuple(fast.latency.samples_ms),
                                           fp32_latency_samples=tuple(fast.latency.fp32_samples_ms)))
    assert TH.latency_p < mann_whitney_p(rel_fast, rel[0], "less") < TH.suspect_p
    run_id = store.create_run(sha, "push", baseline_sha=a, cells=[CELL], meta={"confirm_pairs": pairs})
    store.write_result(run_id, fast)
    store.finish_run(run_id)
    detect_run(store, run_id)
    assert [f for f in store.regressions(run_id=run_id) if f.kind == "latency"] == []
