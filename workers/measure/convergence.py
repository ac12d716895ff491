"""Convergence of stateful and Loop models: does the converted model's error stay bounded over time?

Stateful models (state outputs fed back as inputs) are rolled forward T steps in fp32 and in the
converted precision from the same inputs, each feeding back its own state; Loop models expose one
row per iteration in a scan output and are run once with trip count T.

The error at step t is the largest over outputs of ``max|fp32 - converted| / max(1, max|fp32|)`` at
that step: relative to the output's magnitude, absolute for outputs within [-1, 1].  The result says
so (``ConvergenceStats.error_unit == "relative"``): results stored before this definition measured
plain ``max|diff|`` (``absolute``), and the service never compares errors across units.  A state that
itself grows (silero VAD's LSTM cell state counts up to 64 over 64 steps of noise) with a constant
relative error is then a flat curve, not a "growing" one; an error that grows faster than the state
(a lost leak, an accumulating bias) still rises.

:func:`judge_errors` calls a curve *diverged* when an error is non-finite, when one exceeds the
cap, or when the last half of the curve grows steadily: a least-squares line over the last half
rises by more than ``GROWTH`` of that half's mean error, with correlation above ``MIN_CORR`` (so a
bounded, noisy error curve never counts, and linear or faster growth always does).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np

from workers.result import CONVERGENCE_ERROR_UNIT, ConvergenceStats
from workers.zoo.inputs import make_feeds
from workers.zoo.manifest import ZooEntry

GROWTH = 0.5
MIN_CORR = 0.9
FLOOR = 1e-6  # curves whose errors stay below this are numerically identical: never diverged by slope
#: The unit of :func:`step_error` (``max|diff| / max(1, max|fp32|)``), recorded in every result.
ERROR_UNIT = CONVERGENCE_ERROR_UNIT

Runner = Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]


def step_error(ref: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray]) -> float:
    """Largest ``max|ref - got| / max(1, max|ref|)`` over all outputs, over positions where both are
    finite (inf when ``got`` is non-finite where ``ref`` is not)."""
    worst = 0.0
    for name, r in ref.items():
        r64 = np.asarray(r, np.float64)
        g64 = np.asarray(got[name], np.float64)
        bad = np.isfinite(r64) & ~np.isfinite(g64)
        if bad.any():
            return math.inf
        both = np.isfinite(r64) & np.isfinite(g64)
        if both.any():
            scale = max(1.0, float(np.abs(r64[both]).max()))
            worst = max(worst, float(np.abs(r64[both] - g64[both]).max()) / scale)
    return worst


def step_errors(ref_steps: list[Mapping[str, np.ndarray]], got_steps: list[Mapping[str, np.ndarray]],
                ) -> list[float]:
    """``[step_error(r, g) for r, g in zip(ref_steps, got_steps)]``, computed over all steps at once."""
    if len(ref_steps) != len(got_steps):
        raise ValueError(f"{len(ref_steps)} reference steps but {len(got_steps)} converted steps")
    if not ref_steps:
        return []
    worst = np.zeros(len(ref_steps), np.float64)
    for name in ref_steps[0]:
        try:
            r64 = np.stack([np.asarray(r[name], np.float64) for r in ref_steps])
            g64 = np.stack([np.asarray(g[name], np.float64) for g in got_steps])
        except ValueError:  # shapes vary over steps: one step at a time
            return [step_error(r, g) for r, g in zip(ref_steps, got_steps, strict=True)]
        r64, g64 = r64.reshape(len(ref_steps), -1), g64.reshape(len(ref_steps), -1)
        if r64.shape != g64.shape:  # broadcasting differs per step: keep the per-step definition
            return [step_error(r, g) for r, g in zip(ref_steps, got_steps, strict=True)]
        fin_r, fin_g = np.isfinite(r64), np.isfinite(g64)
        both = fin_r & fin_g
        r0 = np.where(both, r64, 0.0)
        diff = np.abs(r0 - np.where(both, g64, 0.0))
        if diff.shape[1]:
            worst = np.maximum(worst, diff.max(axis=1) / np.maximum(1.0, np.abs(r0).max(axis=1)))
        worst[(fin_r & ~fin_g).any(axis=1)] = math.inf
    return [float(x) for x in worst]


def judge_errors(errors: list[float], cap: float) -> ConvergenceStats:
    """Statistics and the diverged verdict for an error curve of :func:`step_error` values (see module
    doc); the stats carry their unit, :data:`ERROR_UNIT`."""
    e = np.asarray(errors, np.float64)
    stats = ConvergenceStats(steps=len(errors), step_errors=[float(x) for x in errors], error_unit=ERROR_UNIT)
    if not len(e):
        return stats
    finite = np.isfinite(e)
    stats.final_error = float(e[-1])
    stats.max_error = float(e.max()) if finite.all() else math.inf
    if not finite.all():
        first = int(np.argmin(finite))
        stats.diverged, stats.reason = True, f"non-finite error from step {first}"
        return stats
    half = e[len(e) // 2:]
    if len(half) >= 4:
        t = np.arange(len(half), dtype=np.float64)
        slope = float(np.polyfit(t, half, 1)[0])
        stats.slope = slope
        mean = float(half.mean())
        corr = float(np.corrcoef(t, half)[0, 1]) if half.std() > 0 else 0.0
        growth = slope * (len(half) - 1) / mean if mean > 0 else 0.0
        if mean > FLOOR and growth > GROWTH and corr > MIN_CORR:
            stats.diverged = True
            stats.reason = (f"error grows steadily over the last {len(half)} steps: +{growth:.0%} of its mean "
                            f"(slope {slope:.3g}/step, r={corr:.2f}); final {stats.final_error:.3g}")
    if stats.max_error > cap:
        step = int(np.argmax(e > cap))
        stats.diverged = True
        stats.reason = f"step error {e[step]:.3g} at step {step} exceeds the cap {cap:g}" + (
            f"; {stats.reason}" if stats.reason else "")
    return stats


def rollout(run: Runner, entry: ZooEntry, seed: int, steps: int) -> list[dict[str, np.ndarray]]:
    """Outputs of ``steps`` steps of a stateful entry, feeding each state output back as its input."""
    assert entry.stateful is not None
    state_map = entry.stateful.state
    feeds = make_feeds(entry, seed, step=0)
    outputs: list[dict[str, np.ndarray]] = []
    for step in range(steps):
        if step:
            fresh = make_feeds(entry, seed, step=step)
            feeds = {k: v for k, v in fresh.items() if k not in state_map}
            for inp, out in state_map.items():
                feeds[inp] = outputs[-1][out].astype(fresh[inp].dtype)
        outputs.append(run(feeds))
    return outputs


def stateful_convergence(ref_steps: list[dict[str, np.ndarray]], conv: Runner, entry: ZooEntry, seed: int,
                         ) -> ConvergenceStats:
    """Roll the converted model forward as many steps as ``ref_steps`` (the fp32 rollout) and judge."""
    assert entry.stateful is not None
    got = rollout(conv, entry, seed, len(ref_steps))
    return judge_errors(step_errors(ref_steps, got), entry.stateful.cap)


def loop_feeds(entry: ZooEntry, seed: int, steps: int) -> dict[str, np.ndarray]:
    """The entry's feeds with its Loop trip-count input set to ``steps``."""
    assert entry.loop is not None
    feeds = make_feeds(entry, seed)
    trip = entry.loop.trip_input
    if trip not in feeds:
        raise KeyError(f"loop trip input {trip!r} is not among the entry's inputs")
    feeds[trip] = np.full_like(feeds[trip], steps)
    return feeds


def loop_convergence(ref_out: Mapping[str, np.ndarray], got_out: Mapping[str, np.ndarray],
                     entry: ZooEntry) -> ConvergenceStats:
    """Judge the per-iteration rows of the Loop's scan output (fp32 ``ref_out`` vs converted ``got_out``)."""
    assert entry.loop is not None
    name = entry.loop.output
    ref, got = np.asarray(ref_out[name]), np.asarray(got_out[name])
    errors = [step_error({name: ref[i]}, {name: got[i]}) for i in range(ref.shape[0])]
    return judge_errors(errors, entry.loop.cap)
