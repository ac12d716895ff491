"""The result of one job, as one typed object with a stable, versioned JSON form.

This module is the contract between the workers (which fill it) and the service (which stores,
compares and shows it).  It imports nothing heavy (no onnx, no onnxruntime) so the service layer
may import it.  ``JobResult.from_json(r.to_json()) == r`` holds for every result.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

SCHEMA_VERSION = 1

#: Statuses a job can end with.  ``pass`` is the only fully green one.
STATUSES: tuple[str, ...] = (
    "pass",             # converted, accurate, converged
    "fail_accuracy",    # converted, but accuracy outside tolerance
    "diverged",         # stateful/loop model whose error grows without bound
    "convert_error",    # the pass raised / produced an invalid model
    "timeout",          # conversion (or the job) exceeded its time limit
    "crash",            # conversion subprocess died (signal, memory limit)
    "bad_model",        # model file missing / corrupt / not ONNX
    "bad_spec",         # zoo entry wrong (input names/shapes/dtypes) or unknown dtype/policy
    "reference_error",  # the fp32 model itself failed to run
    "crashed",          # poison job: the worker died on it max_attempts times (set by the service)
    "error",            # ampci's or the machine's failure, not the pass's (message: "infrastructure: ...")
    "unmeasured",       # the cell could not be run here (no device for its target): nothing was measured
)
GOOD_STATUSES = frozenset({"pass"})
CONVERSION_OK_STATUSES = frozenset({"pass", "fail_accuracy", "diverged"})
#: The result status of a job that ampci or the machine failed (the sandbox could not be made or could not import
#: the pass's dependencies, a cache unreadable, a worker error): not a result of the pass.
INFRA_ERROR = "error"
#: The result status of a cell that could not run where it was sent (a ``cuda`` cell on a worker without a usable
#: CUDA device): nothing was measured.
UNMEASURED = "unmeasured"
#: Statuses that are not results of the pass (ampci's or the machine's failures, cells not run, poison jobs whose
#: worker died): never a baseline, never a known failure, never a flip of a flaky lineage, never green.
NOT_OF_THE_PASS = frozenset({INFRA_ERROR, UNMEASURED, "crashed"})
#: Prefix of the message of an :data:`INFRA_ERROR` result.
INFRA_PREFIX = "infrastructure: "

#: Unit of the step errors in a :class:`ConvergenceStats` this code produces: ``max|diff| / max(1, max|fp32|)``.
CONVERGENCE_ERROR_UNIT = "relative"
#: Unit of convergence results stored before ``error_unit`` existed: plain ``max|diff|``.
LEGACY_CONVERGENCE_ERROR_UNIT = "absolute"
CONVERGENCE_ERROR_UNITS = (LEGACY_CONVERGENCE_ERROR_UNIT, CONVERGENCE_ERROR_UNIT)

#: ``GraphFacts.source``: counted by the worker from the converted model / copied from the pass report (legacy).
GRAPH_FACTS_MEASURED = "measured"
GRAPH_FACTS_REPORT = "report"


@dataclass
class OutputMetrics:
    """Error of one output (or the worst over outputs) of the converted model against fp32."""

    max_abs: float = 0.0
    mean_abs: float = 0.0
    max_rel: float = 0.0
    cosine: float = 1.0
    snr_db: float = float("inf")
    nan_count: int = 0
    inf_count: int = 0
    baseline_max_abs: float = 0.0  # error of a plain fp32 rerun (noise floor for the k-rule)
    task_metric: float | None = None  # e.g. top-1 agreement for classifiers
    task_metric_name: str | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OutputMetrics:
        """Inverse of ``asdict``; unknown keys (written by a newer worker) are ignored, missing ones default."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass
class AccuracyReport:
    """Accuracy of one execution mode (``emulation`` on CPU, ``cuda`` on a real GPU)."""

    mode: str  # "emulation" | "cuda"
    provider: str
    per_output: dict[str, OutputMetrics] = field(default_factory=dict)
    worst: OutputMetrics = field(default_factory=OutputMetrics)
    passed: bool = True
    reason: str = ""
    # outputs measured (in per_output and worst) but not held to the tolerance, with why
    # (a stateful model's state outputs are judged by the convergence check)
    not_judged: dict[str, str] = field(default_factory=dict)
    # the limit each judged output's figures were held to (workers.measure.metrics.limits): output -> {"max_abs",
    # "min_cosine", "task_min"}; empty in results stored before it was recorded
    limits: dict[str, dict[str, float]] = field(default_factory=dict)


#: Prefix of a ``LatencyStats.error`` that is information, not a problem: the provider has no kernels for the
#: dtype (onnxruntime's CPU provider and bf16), so latency is measured elsewhere (CUDA workers).
LATENCY_UNSUPPORTED = "unsupported here: "


@dataclass
class LatencyStats:
    """Latency of the converted and fp32 models on the job's target provider, in milliseconds.

    Each sample (``samples_ms[i]``, ``fp32_samples_ms[i]``) is the fastest of ``runs_per_sample`` runs of that
    model, the two models' runs alternating within the block (:func:`workers.measure.latency.measure_latency`), so
    ``p50_ms``/``p90_ms``/``min_ms``/``fp32_p50_ms`` are percentiles of those block minima (wall time); results
    stored before blocks existed have one run per sample (the default)."""

    provider: str
    samples_ms: list[float] = field(default_factory=list)
    fp32_samples_ms: list[float] = field(default_factory=list)
    p50_ms: float = 0.0
    p90_ms: float = 0.0
    min_ms: float = 0.0
    fp32_p50_ms: float = 0.0
    speedup: float = 0.0  # fp32 p50 / converted p50
    peak_rss_mb: float | None = None
    peak_device_mb: float | None = None
    error: str = ""  # why latency could not be measured (e.g. no kernels for the dtype); samples empty
    runs_per_sample: int = 1  # timed runs of each model per stored sample (the sample is their fastest)
    # the same blocks' least CPU time of the timing thread (ms), paired with samples_ms / fp32_samples_ms; empty
    # where CPU time is not the model's work (CUDA, intra-op thread pools) and in results stored before
    cpu_samples_ms: list[float] = field(default_factory=list)
    fp32_cpu_samples_ms: list[float] = field(default_factory=list)


@dataclass
class ConvergenceStats:
    """Error per step of a stateful (or Loop) model rolled forward in fp32 and converted precision.

    ``error_unit`` names what the errors measure: ``relative`` (what this code computes) is
    ``max|diff| / max(1, max|fp32|)`` of the outputs at a step (see ``workers.measure.convergence``);
    ``absolute`` is plain ``max|diff|``, the unit of results written before the field existed
    (:meth:`JobResult.from_dict` reads a convergence result without it as ``absolute``).  Errors in
    different units are not comparable."""

    steps: int = 0
    step_errors: list[float] = field(default_factory=list)
    final_error: float = 0.0
    max_error: float = 0.0
    slope: float = 0.0
    diverged: bool = False
    reason: str = ""
    error_unit: str = CONVERGENCE_ERROR_UNIT

    def __post_init__(self) -> None:
        if self.error_unit not in CONVERGENCE_ERROR_UNITS:
            raise ValueError(f"unknown convergence error unit {self.error_unit!r}; "
                             f"expected one of {', '.join(CONVERGENCE_ERROR_UNITS)}")


@dataclass
class GraphFacts:
    """Facts of the converted model.  ``source == "measured"``: every count is measured by the worker
    from the converted file itself (:func:`workers.measure.graph_facts.measure_graph`, compute ops of version
    ``compute_ops_version``), the figures verdicts use.  ``source == "report"``: a result stored before
    that, whose counts are the pass's own report (read back as such; compare with care).

    ``low_precision_compute_fraction`` is None when there is no compute node ("not applicable").
    ``casts_inserted``/``casts_removed``: net Cast/CastLike nodes added/removed against the original.
    What the pass says about itself is information only: ``kept_fp32`` (its reasons for each node
    kept fp32), ``pass_report`` (its own counts and compute fraction), ``pass_iterations`` and
    ``pass_converged`` (its painting fixpoint; None when the report does not say).
    ``convert_seconds``/``convert_samples_s``: wall time of the conversion subprocess as the worker
    timed it, first conversion and every repeat (see ``WorkerConfig.convert_repeats``)."""

    nodes_total: int = 0
    nodes_low: int = 0
    casts_inserted: int = 0
    casts_removed: int = 0
    compute_nodes: int = 0
    compute_low: int = 0
    low_precision_compute_fraction: float | None = None
    kept_fp32: list[dict[str, str]] = field(default_factory=list)  # {node, op_type, graph, reason}: the pass's
    convert_seconds: float = 0.0
    source: str = GRAPH_FACTS_MEASURED
    compute_ops_version: str | None = None
    compute_by_op: dict[str, dict[str, int]] = field(default_factory=dict)  # {op: {"total": n, "low": k}}
    casts_total: int = 0
    casts_original: int = 0
    nodes_kept_fp32: int = 0
    kept_fp32_by_op: dict[str, int] = field(default_factory=dict)
    untyped_nodes: int = 0
    graphs: int = 0
    pass_report: dict[str, Any] = field(default_factory=dict)
    pass_iterations: int | None = None
    pass_converged: bool | None = None
    convert_samples_s: list[float] = field(default_factory=list)
    # the reference workload timed right after each conversion sample (workers.revision.timing_reference.reference_workload)
    convert_reference_s: list[float] = field(default_factory=list)
    # user + system CPU seconds of the conversion process in each sample of convert_samples_s (paired one to
    # one; empty when the worker could not measure it: the conversion-time rule then has wall time only)
    convert_cpu_s: list[float] = field(default_factory=list)

    @property
    def measured(self) -> bool:
        """True when the counts were measured from the converted model (not copied from the report)."""
        return self.source == GRAPH_FACTS_MEASURED

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GraphFacts:
        """Inverse of ``asdict``; unknown keys ignored.  A dict without ``source`` predates measured
        facts: its counts are the pass report's (``source = "report"``), and its fraction is None when
        it had no compute node (the report said 1.0 for nothing)."""
        known = {f.name for f in fields(cls)}
        d = {k: v for k, v in data.items() if k in known}
        if "source" not in d:
            d["source"] = GRAPH_FACTS_REPORT
            if not d.get("compute_nodes"):
                d["low_precision_compute_fraction"] = None
        return cls(**d)


@dataclass
class JobResult:
    """Everything one job measured.  Stable JSON via :meth:`to_json` / :meth:`from_json`."""

    model: str
    dtype: str
    policy: str
    target: str
    status: str
    revision: str | None = None
    message: str = ""
    model_sha256: str | None = None
    accuracy: AccuracyReport | None = None        # faithful emulation (always, when converted)
    accuracy_cuda: AccuracyReport | None = None   # real CUDA provider, when a usable GPU exists
    latency: LatencyStats | None = None
    convergence: ConvergenceStats | None = None
    graph: GraphFacts | None = None
    environment: dict[str, str] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)  # convert_s, reference_s, ..., overhead_s, total_s
    # the feeds, by input name: shape, dtype, values (how made), note (where the spec came from);
    # empty in results from before it was recorded
    inputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    # a confirmation job's interleaved timings (workers.jobs.confirm.confirm_cell); None for every other job
    confirmation: dict[str, Any] | None = None
    # the last lines the pass wrote on stderr when its conversion failed (bounded, credentials redacted:
    # workers.revision.convert.stderr_tail); empty otherwise and in results from before it was recorded
    stderr_tail: str = ""
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown job status {self.status!r}; expected one of {', '.join(STATUSES)}")

    @property
    def cell(self) -> tuple[str, str, str, str]:
        """(model, dtype, policy, target)."""
        return (self.model, self.dtype, self.policy, self.target)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (non-finite floats encoded as strings "inf", "-inf", "nan")."""
        return _encode(asdict(self))

    def to_json(self) -> str:
        """Stable JSON text (sorted keys)."""
        return json.dumps(self.to_dict(), sort_keys=True, allow_nan=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobResult:
        """Inverse of :meth:`to_dict`; unknown keys are ignored, missing optional parts are None (a
        convergence part without ``error_unit`` predates it and is ``absolute``)."""
        d = dict(data)
        for key in ("accuracy", "accuracy_cuda", "latency", "convergence", "graph", "timings"):
            d[key] = _decode(d.get(key))
        version = d.get("schema_version", SCHEMA_VERSION)
        if version > SCHEMA_VERSION:
            raise ValueError(f"result schema version {version} is newer than this code ({SCHEMA_VERSION})")

        def acc(x: Any) -> AccuracyReport | None:
            if x is None:
                return None
            return AccuracyReport(
                mode=x["mode"], provider=x["provider"],
                per_output={k: OutputMetrics.from_dict(v) for k, v in x.get("per_output", {}).items()},
                worst=OutputMetrics.from_dict(x.get("worst", {})), passed=x.get("passed", True),
                reason=x.get("reason", ""), not_judged=dict(x.get("not_judged", {})),
                limits={k: dict(v) for k, v in x.get("limits", {}).items()})

        return cls(
            model=d["model"], dtype=d["dtype"], policy=d["policy"], target=d["target"],
            status=d["status"], revision=d.get("revision"), message=d.get("message", ""),
            model_sha256=d.get("model_sha256"),
            accuracy=acc(d.get("accuracy")), accuracy_cuda=acc(d.get("accuracy_cuda")),
            latency=LatencyStats(**d["latency"]) if d.get("latency") else None,
            convergence=ConvergenceStats(**{"error_unit": LEGACY_CONVERGENCE_ERROR_UNIT, **d["convergence"]})
            if d.get("convergence") else None,
            graph=GraphFacts.from_dict(d["graph"]) if d.get("graph") else None,
            environment=dict(d.get("environment") or {}), timings=dict(d.get("timings") or {}),
            inputs={k: dict(v) for k, v in (d.get("inputs") or {}).items()},
            confirmation=dict(d["confirmation"]) if isinstance(d.get("confirmation"), dict) else None,
            stderr_tail=str(d.get("stderr_tail") or ""),
            schema_version=SCHEMA_VERSION,
        )

    @classmethod
    def from_json(cls, text: str) -> JobResult:
        """Parse :meth:`to_json` output."""
        return cls.from_dict(json.loads(text))


def _encode(obj: Any) -> Any:
    if isinstance(obj, float):
        if obj != obj:
            return "nan"
        if obj in (float("inf"), float("-inf")):
            return "inf" if obj > 0 else "-inf"
        return obj
    if isinstance(obj, dict):
        return {k: _encode(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_encode(v) for v in obj]
    return obj


_SPECIAL = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf")}


def _decode(obj: Any) -> Any:
    if isinstance(obj, str) and obj in _SPECIAL:
        return _SPECIAL[obj]
    if isinstance(obj, dict):
        return {k: _decode(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_decode(v) for v in obj]
    return obj
