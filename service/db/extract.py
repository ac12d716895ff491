"""Column values of a ``JobResult`` (what the store indexes, filters and compares on).

NaN errors are stored as +inf (an error that is not a number is worse than any number, and
SQLite cannot store NaN); a NaN cosine is stored as NULL.  The environment fingerprint is the
``fingerprint`` entry of ``result.environment`` when the worker supplies one, otherwise the
first 16 hex digits of the SHA-256 of the environment dict as sorted JSON.

Graph columns hold what the worker *measured* from the converted model (``workers.measure.graph_facts``):
``low_precision_fraction`` is the measured low-precision share of the compute nodes (NULL when the model
has no compute node: not applicable), ``casts_inserted`` the Cast nodes the conversion added.  The pass's
own report figures, the measured compute counts, the conversion-time samples and the painting's
convergence stay in ``data`` (read by ``service.regressions.measured``).

``sample_doc`` is what regression detection reads of ``data`` (:func:`service.regressions.stored.sample_doc`):
every write of a result (both upserts of the store) writes it with ``data``, from the same document, in one
statement, so it is never stale.
"""

from __future__ import annotations

import hashlib
import json
import math

from service.json_types import JsonObject
from service.regressions.stored import sample_doc
from workers.result import JobResult


def _err(x: float | None) -> float | None:
    if x is None:
        return None
    return math.inf if math.isnan(x) else float(x)


def _num(x: float | None) -> float | None:
    if x is None or math.isnan(x):
        return None
    return float(x)


def env_fingerprint(environment: dict[str, str]) -> str | None:
    """Stable fingerprint of an environment dict (None when empty)."""
    if not environment:
        return None
    if environment.get("fingerprint"):
        return str(environment["fingerprint"])[:64]
    text = json.dumps(environment, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def convert_seconds(result: JobResult) -> float | None:
    """Median of the conversion wall times the worker measured (its single time when there are no
    samples; None when the job did not convert or measured nothing)."""
    graph = result.graph
    if graph is None:
        return None
    samples = sorted(float(x) for x in graph.convert_samples_s if isinstance(x, int | float) and x > 0)
    if samples:
        mid = len(samples) // 2
        return samples[mid] if len(samples) % 2 else (samples[mid - 1] + samples[mid]) / 2
    return float(graph.convert_seconds) if graph.convert_seconds > 0 else None


def convert_cpu_seconds(result: JobResult) -> float | None:
    """Median of the conversion process's CPU seconds over the worker's conversion-time samples (None when
    the job did not convert or the worker could not measure them)."""
    graph = result.graph
    if graph is None:
        return None
    samples = sorted(float(x) for x in graph.convert_cpu_s if isinstance(x, int | float) and x >= 0)
    if not samples:
        return None
    mid = len(samples) // 2
    return samples[mid] if len(samples) % 2 else (samples[mid - 1] + samples[mid]) / 2


def result_columns(result: JobResult, data: JsonObject | None = None) -> dict[str, object]:
    """The metric columns of ``results`` for ``result`` (keys match models.Result attributes), its document
    (``data``, a JSON object: ``result.to_dict()``, or ``data`` when the caller has it already) and that
    document's sample summary (``sample_doc``, JSON text)."""
    worst = result.accuracy.worst if result.accuracy is not None else None
    ratio = None
    if worst is not None and worst.baseline_max_abs and worst.baseline_max_abs > 0:
        ratio = _err(worst.max_abs / worst.baseline_max_abs)
    lat, conv, graph = result.latency, result.convergence, result.graph
    return {
        "status": result.status,
        "message": result.message or None,
        "model_sha256": result.model_sha256,
        "cosine": _num(worst.cosine) if worst is not None else None,
        "max_abs": _err(worst.max_abs) if worst is not None else None,
        "error_ratio": ratio,
        "latency_p50_ms": _num(lat.p50_ms) if lat is not None and lat.samples_ms else None,
        "fp32_p50_ms": _num(lat.fp32_p50_ms) if lat is not None and lat.fp32_samples_ms else None,
        "speedup": _num(lat.speedup) if lat is not None and lat.samples_ms else None,
        "low_precision_fraction": _num(graph.low_precision_compute_fraction)
        if graph is not None and graph.low_precision_compute_fraction is not None else None,
        "casts_inserted": graph.casts_inserted if graph is not None else None,
        "final_error": _err(conv.final_error) if conv is not None and conv.steps else None,
        "diverged": conv.diverged if conv is not None and conv.steps else None,
        "convert_s": convert_seconds(result),
        "convert_cpu_s": convert_cpu_seconds(result),
        "pass_iterations": graph.pass_iterations if graph is not None else None,
        "env_fingerprint": env_fingerprint(result.environment),
        "data": (data := data if data is not None else result.to_dict()),
        "sample_doc": sample_doc(data),
    }
