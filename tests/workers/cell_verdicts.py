"""Verdicts of converted zoo models, measured in-process the way ``workers.jobs.job.run_job`` measures them.

Used by the policy-mutation test: the fp32 reference (optimized onnxruntime session) and its plain rerun
(the noise floor), the converted model under faithful emulation, the zoo entry's tolerance and k-rule
(``workers.measure.metrics.judge``), and graph facts counted from the converted model itself (Cast nodes added,
low-precision compute nodes over every graph), with no use of the pass's own report.  The result is a
``service.regressions.rules.CellSample`` so the service's regression rules judge a change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from service.regressions.rules import CellSample
from workers.jobs.stateful import state_outputs_not_judged
from workers.measure.metrics import compare_outputs, judge
from workers.measure.runners import EmulatedRunner, SessionRunner
from workers.revision.config import WorkerConfig
from workers.zoo.fetch import fetch_entry
from workers.zoo.inputs import make_feeds
from workers.zoo.manifest import ZooEntry

#: Op types counted as compute by this measurement (fixed here, whatever the pass's policy says).
COMPUTE_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm", "Einsum", "LSTM", "GRU", "RNN", "Attention"})
LOW_TYPES = frozenset({onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16})


def all_nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """Every node of ``graph`` and of the graphs nested in its nodes' attributes."""
    out = []
    for node in graph.node:
        out.append(node)
        for attr in node.attribute:
            for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                out.extend(all_nodes(sub))
    return out


def op_types(model: onnx.ModelProto) -> set[str]:
    """Op types of the default domain used anywhere in ``model`` (subgraphs included)."""
    return {n.op_type for n in all_nodes(model.graph) if n.domain in ("", "ai.onnx")}


def model_opset(model: onnx.ModelProto) -> int:
    """The default-domain opset of ``model``."""
    return next(int(i.version) for i in model.opset_import if i.domain in ("", "ai.onnx"))


def _elem_types(model: onnx.ModelProto) -> dict[str, int]:
    inferred = onnx.shape_inference.infer_shapes(model)
    types: dict[str, int] = {}

    def visit(g: onnx.GraphProto) -> None:
        for vi in [*g.input, *g.output, *g.value_info]:
            types[vi.name] = vi.type.tensor_type.elem_type
        for t in g.initializer:
            types[t.name] = t.data_type
        for node in g.node:
            for attr in node.attribute:
                for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                    visit(sub)

    visit(inferred.graph)
    return types


def graph_facts(source: onnx.ModelProto, converted: onnx.ModelProto) -> tuple[float | None, int]:
    """(low-precision fraction of COMPUTE_OPS nodes, or None without any; Cast nodes added)."""
    types = _elem_types(converted)
    compute = [n for n in all_nodes(converted.graph) if n.op_type in COMPUTE_OPS and n.output]
    low = sum(1 for n in compute if types.get(n.output[0]) in LOW_TYPES)
    casts = sum(n.op_type == "Cast" for n in all_nodes(converted.graph)) - \
        sum(n.op_type == "Cast" for n in all_nodes(source.graph))
    return (low / len(compute) if compute else None), casts


@dataclass
class Reference:
    """One zoo entry's fp32 model, feeds, reference outputs and plain (unoptimized) rerun."""

    entry: ZooEntry
    model: onnx.ModelProto
    data: bytes
    feeds: dict[str, np.ndarray]
    ref: dict[str, np.ndarray] = field(default_factory=dict)
    baseline: dict[str, np.ndarray] = field(default_factory=dict)

    @classmethod
    def load(cls, entry: ZooEntry, config: WorkerConfig) -> Reference:
        """Fetch (generate) the entry's model and run the fp32 reference on its zoo inputs."""
        path = Path(fetch_entry(entry, Path(config.cache_dir)).path)
        data = path.read_bytes()
        feeds = make_feeds(entry, entry.seed)
        ref = SessionRunner(data, "cpu")(feeds)
        baseline = SessionRunner(data, "cpu", optimize=False)(feeds)
        return cls(entry, onnx.load_from_string(data), data, feeds, ref, baseline)


@dataclass(frozen=True)
class Measured:
    """A converted model's verdict as the regression rules see it, and why it failed (if it did)."""

    sample: CellSample
    reason: str = ""


def measure(ref: Reference, dtype: str, converted: bytes | None, error: str = "", k: float = 3.0) -> Measured:
    """The verdict of ``converted`` (None: the conversion failed with ``error``) against ``ref``."""
    if converted is None:
        return Measured(CellSample(status="convert_error"), error)
    try:
        model = onnx.load_from_string(converted)
        onnx.checker.check_model(model, full_check=True)
    except Exception as exc:  # noqa: BLE001 - the job calls any checker failure a convert_error
        return Measured(CellSample(status="convert_error"), f"invalid model: {str(exc).splitlines()[0][:200]}")
    try:
        got = EmulatedRunner(converted)(ref.feeds)
    except Exception as exc:  # noqa: BLE001 - as the job: a model that does not run is a convert_error
        return Measured(CellSample(status="convert_error"), f"does not run emulated: {exc}")
    e = ref.entry
    per, worst = compare_outputs(ref.ref, got, ref.baseline, e.task, e.task_outputs)
    skip = state_outputs_not_judged(e, per)
    passed, reason = judge({n: m for n, m in per.items() if n not in skip}, ref.ref, e.tolerance_for(dtype), k)
    fraction, casts = graph_facts(ref.model, model)
    sample = CellSample(status="pass" if passed else "fail_accuracy", max_abs=worst.max_abs, cosine=worst.cosine,
                        low_precision_fraction=fraction, casts_inserted=casts)
    return Measured(sample, reason)
