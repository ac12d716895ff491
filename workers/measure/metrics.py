"""Error metrics of converted-model outputs against fp32, and the pass/fail rule.

Pure numpy.  :func:`compare_outputs` fills one :class:`~workers.result.OutputMetrics` per output
and the worst over outputs; :func:`judge` applies the tolerance rule and says why it failed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from workers.result import OutputMetrics
from workers.tolerance import Tolerance  # defined without numpy for the zoo manifest; re-exported here

#: Relative errors divide by max(|ref|, REL_FLOOR * max|ref|, 1e-12) so near-zeros do not dominate.
REL_FLOOR = 1e-3


def _f64(a: np.ndarray) -> np.ndarray:
    return np.asarray(a).astype(np.float64, copy=False)


def output_metrics(ref: np.ndarray, got: np.ndarray, baseline: np.ndarray | None = None) -> OutputMetrics:
    """Metrics of ``got`` against ``ref`` (same shape); ``baseline`` is a plain fp32 rerun, if any.

    NaN/Inf in ``got`` are counted and excluded from the finite-error metrics, but any NaN/Inf
    where ``ref`` is finite makes ``max_abs``/``max_rel`` infinite, so a judgement never misses it.
    """
    r, g = _f64(ref), _f64(got)
    if r.shape != g.shape:
        raise ValueError(f"shape mismatch: reference {r.shape}, converted {g.shape}")
    nan_count = int(np.isnan(g).sum())
    inf_count = int(np.isinf(g).sum())
    if r.size == 0:
        return OutputMetrics(nan_count=nan_count, inf_count=inf_count)
    both = np.isfinite(r) & np.isfinite(g)
    new_nonfinite = bool((np.isfinite(r) & ~np.isfinite(g)).any())
    diff = np.abs(r - g)[both]
    rs, gs = r[both], g[both]
    scale = float(np.abs(rs).max()) if rs.size else 0.0
    denom = np.maximum(np.abs(rs), max(REL_FLOOR * scale, 1e-12))
    max_abs = float(diff.max()) if diff.size else 0.0
    max_rel = float((diff / denom).max()) if diff.size else 0.0
    if new_nonfinite:
        max_abs = max_rel = math.inf
    return OutputMetrics(
        max_abs=max_abs,
        mean_abs=float(diff.mean()) if diff.size else 0.0,
        max_rel=max_rel,
        cosine=_cosine(rs, gs) if not new_nonfinite else -1.0,
        snr_db=_snr_db(rs, diff) if not new_nonfinite else -math.inf,
        nan_count=nan_count,
        inf_count=inf_count,
        baseline_max_abs=(float(np.abs(_f64(baseline) - r)[np.isfinite(r)].max())
                          if baseline is not None and r.size else 0.0),
    )


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 and nb == 0.0:
        return 1.0
    if na == 0.0 or nb == 0.0:
        return 0.0
    return float(np.clip(np.dot(a.ravel(), b.ravel()) / (na * nb), -1.0, 1.0))


def _snr_db(ref: np.ndarray, diff: np.ndarray) -> float:
    signal = float(np.sum(ref * ref))
    noise = float(np.sum(diff * diff))
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def top1_agreement(ref: np.ndarray, got: np.ndarray, axis: int = -1) -> float:
    """Fraction of rows whose argmax over ``axis`` agrees (classifier task metric)."""
    r = np.argmax(_f64(ref), axis=axis)
    g = np.argmax(np.nan_to_num(_f64(got), nan=-np.inf), axis=axis)
    return float(np.mean(r == g))


TASK_METRICS = {"top1": top1_agreement}


def compare_outputs(ref: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray],
                    baseline: Mapping[str, np.ndarray] | None = None,
                    task: str | None = None, task_outputs: tuple[str, ...] = (),
                    ) -> tuple[dict[str, OutputMetrics], OutputMetrics]:
    """Per-output metrics (for every output in ``ref``) and the worst over outputs.

    "Worst" takes the max of errors/counts, the min of cosine/SNR/task metric, and the largest
    baseline error.  A task metric is computed for ``task_outputs`` (all outputs when empty).
    """
    if task is not None and task not in TASK_METRICS:
        raise ValueError(f"unknown task metric {task!r}; known: {', '.join(TASK_METRICS)}")
    per: dict[str, OutputMetrics] = {}
    for name, r in ref.items():
        if name not in got:
            raise ValueError(f"converted model has no output {name!r}")
        m = output_metrics(r, got[name], None if baseline is None else baseline.get(name))
        if task is not None and (not task_outputs or name in task_outputs):
            m.task_metric = TASK_METRICS[task](r, got[name])
            m.task_metric_name = task
        per[name] = m
    return per, worst_of(per.values())


def worst_of(metrics) -> OutputMetrics:  # noqa: ANN001 - any iterable of OutputMetrics
    """The worst value of each field over ``metrics`` (see :func:`compare_outputs`)."""
    ms = list(metrics)
    if not ms:
        return OutputMetrics()
    tasks = [m.task_metric for m in ms if m.task_metric is not None]
    names = [m.task_metric_name for m in ms if m.task_metric_name]
    return OutputMetrics(
        max_abs=max(m.max_abs for m in ms), mean_abs=max(m.mean_abs for m in ms),
        max_rel=max(m.max_rel for m in ms), cosine=min(m.cosine for m in ms),
        snr_db=min(m.snr_db for m in ms), nan_count=sum(m.nan_count for m in ms),
        inf_count=sum(m.inf_count for m in ms), baseline_max_abs=max(m.baseline_max_abs for m in ms),
        task_metric=min(tasks) if tasks else None, task_metric_name=names[0] if names else None,
    )


def _scale(ref: np.ndarray) -> float:
    scale = float(np.nanmax(np.abs(_f64(ref)))) if np.asarray(ref).size else 0.0
    return scale if math.isfinite(scale) else 0.0


def limits(per: Mapping[str, OutputMetrics], ref: Mapping[str, np.ndarray], tol: Tolerance,
           k: float) -> dict[str, dict[str, float]]:
    """The limit each judged figure of each output is held to by :func:`judge` (same numbers): ``max_abs``
    (k x fp32 rerun noise + atol + rtol x max|ref|), ``min_cosine`` (outputs of more than one element) and
    ``task_min`` (when the output has the task metric and the tolerance a minimum)."""
    out: dict[str, dict[str, float]] = {}
    for name, m in per.items():
        got = {"max_abs": k * m.baseline_max_abs + tol.atol + tol.rtol * _scale(ref[name])}
        if np.asarray(ref[name]).size > 1:
            got["min_cosine"] = tol.min_cosine
        if tol.task_min is not None and m.task_metric is not None:
            got["task_min"] = tol.task_min
        out[name] = got
    return out


def judge(per: Mapping[str, OutputMetrics], ref: Mapping[str, np.ndarray], tol: Tolerance,
          k: float) -> tuple[bool, str]:
    """Apply :class:`Tolerance` with factor ``k`` to every output; return (passed, reason of first failure)."""
    for name, m in per.items():
        scale = _scale(ref[name])
        bound = k * m.baseline_max_abs + tol.atol + tol.rtol * scale
        if not math.isfinite(m.max_abs):
            return False, f"{name}: NaN/Inf where fp32 is finite (nan={m.nan_count}, inf={m.inf_count})"
        if m.max_abs > bound:
            return False, (f"{name}: max abs error {m.max_abs:.3g} > {k:g} x fp32 rerun noise "
                           f"{m.baseline_max_abs:.3g} + atol {tol.atol:g} + rtol {tol.rtol:g} x {scale:.3g}")
        if np.asarray(ref[name]).size > 1 and m.cosine < tol.min_cosine:
            return False, f"{name}: cosine similarity {m.cosine:.6f} < {tol.min_cosine}"
        if tol.task_min is not None and m.task_metric is not None and m.task_metric < tol.task_min:
            return False, f"{name}: {m.task_metric_name} {m.task_metric:.3f} < {tol.task_min}"
    return True, ""
