"""The CPU time of the conversion process is measured beside its wall time, warm (a zygote's child) and cold.

A pass that spends 0.5 s in arithmetic shows it in both; one that sleeps 0.5 s in wall time only.  The
figures reach the stored result paired one to one with the wall-time samples (``GraphFacts.convert_cpu_s``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.workers.fakes import fake_pass
from workers.measure.graph_facts import attach_report
from workers.result import GraphFacts
from workers.revision.convert import convert_in_subprocess
from workers.zoo.synthetic import synthetic_model_path


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
def test_cpu_seconds_of_the_conversion_process_beside_its_wall_time(tmp_path: Path, warm: bool) -> None:
    src, _ = synthetic_model_path("conv_net", 0, tmp_path / "cache")
    got = {}
    for behaviour in ("burn", "sleepy"):
        root = fake_pass(tmp_path / behaviour, behaviour)
        got[behaviour] = convert_in_subprocess(src, tmp_path / f"{behaviour}.onnx", tmp_path / f"{behaviour}.json",
                                               "fp16", "default", "cpu", root, timeout_s=60.0,
                                               memory_bytes=2 * 1024**3, warm=warm, repeats=3,
                                               repeat_budget_s=60.0)
    burn, sleepy = got["burn"], got["sleepy"]
    for out in (burn, sleepy):
        assert out.status == "ok", out
        assert len(out.cpu_samples_s) == len(out.samples_s) == 3
        assert all(w >= 0.5 for w in out.samples_s)  # both take 0.5 s more than nothing, in wall time
    assert all(c >= 0.45 for c in burn.cpu_samples_s), burn.cpu_samples_s  # the arithmetic is CPU time
    # the sleep is not (a warm child counts from its request; a cold one also pays its interpreter start)
    limit = 0.25 if warm else 0.45
    assert all(c < limit for c in sleepy.cpu_samples_s), sleepy.cpu_samples_s
    assert min(b - s for b, s in zip(burn.cpu_samples_s, sleepy.cpu_samples_s, strict=True)) > 0.3
    facts = attach_report(GraphFacts(), burn.report, burn.samples_s, burn.reference_s, burn.cpu_samples_s)
    assert facts.convert_cpu_s == [round(c, 6) for c in burn.cpu_samples_s]
    # unpaired CPU figures are never stored against the wrong samples
    assert attach_report(GraphFacts(), burn.report, burn.samples_s, None, burn.cpu_samples_s[:2]).convert_cpu_s == []


def test_cpu_seconds_have_microsecond_resolution(tmp_path: Path) -> None:
    """``getrusage`` gives the conversion's CPU time in microseconds; ``os.times`` only in clock ticks (10 ms).
    A ~20 ms CPU figure read from ticks would be 0.01 or 0.02 exactly: the conversion-time rule's CPU guard
    compares figures of that size, so every sample being a whole number of ticks means the resolution was lost
    somewhere between the pass's supervisor and the result."""
    src, _ = synthetic_model_path("conv_net", 0, tmp_path / "cache")
    root = fake_pass(tmp_path / "sleepy", "sleepy")
    out = convert_in_subprocess(src, tmp_path / "m.onnx", tmp_path / "m.json", "fp16", "default", "cpu", root,
                                timeout_s=60.0, memory_bytes=2 * 1024**3, warm=True, repeats=4, repeat_budget_s=60.0)
    assert out.status == "ok", out
    assert len(out.cpu_samples_s) == 4 and all(c > 0 for c in out.cpu_samples_s), out.cpu_samples_s
    # each figure is a whole number of 10 ms ticks with odds of about 1e-4 at microsecond resolution
    off_tick = [c for c in out.cpu_samples_s if abs(c * 100 - round(c * 100)) > 1e-6]
    assert off_tick, f"every CPU figure is a whole number of 10 ms ticks: {out.cpu_samples_s}"
    facts = attach_report(GraphFacts(), out.report, out.samples_s, out.reference_s, out.cpu_samples_s)
    assert facts.convert_cpu_s == out.cpu_samples_s  # stored as measured (6 decimals), not rounded to ticks
