"""The reference workload timed beside each conversion sample: a fixed amount of the pass's kind of work.

Drift in conversion time is judged against this figure, measured on the same machine in the same moments as the
sample: a fixed number of in-memory parse / walk / serialise passes over the model being converted
(:func:`reference_workload`), cut down to :data:`REFERENCE_BYTES` first (:func:`reference_plan`), so a slower
machine or a busier moment shows in both and a slower pass only in the sample.  A function of the model alone,
never of the pass's revision.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Model bytes the reference workload beside each conversion sample parses, walks and serialises in memory
#: (3-20 ms of one core on the smoke and real models, whatever their size: enough scheduler ticks not to be
#: noise).  A larger model is cut down to this size first (:func:`reference_plan`).
REFERENCE_BYTES = 8 * 2**20
#: At most this many passes over a tiny model (a 6 kB model would otherwise take ~1,400).
REFERENCE_MAX_PASSES = 512
#: What one node weighs in :func:`reference_passes`: parsing, walking and serialising a node costs about what
#: this many bytes of weights do (ppocr_mobile_cls, 566 nodes in 0.6 MB, took ~1 ms a pass; silero_vad's
#: 2.3 MB of mostly weights ~2.7 ms).
REFERENCE_NODE_BYTES = 1536


def reference_passes(model_bytes: int, nodes: int = 0) -> int:
    """How many in-memory passes :func:`reference_workload` makes over a model of ``model_bytes`` with ``nodes``
    nodes (subgraphs' included): enough to process :data:`REFERENCE_BYTES`, a node weighing
    :data:`REFERENCE_NODE_BYTES` (at least one pass, at most :data:`REFERENCE_MAX_PASSES`) -- a function of the
    model alone, so the reference is the same work for every revision of the pass."""
    weight = max(1, model_bytes + REFERENCE_NODE_BYTES * nodes)
    return max(1, min(REFERENCE_MAX_PASSES, -(-REFERENCE_BYTES // weight)))


@dataclass(frozen=True)
class ReferencePlan:
    """What one job's reference workload reads (``source``) and how many passes it makes over it."""

    source: Path
    passes: int


def reference_plan(src: Path, cut: Path) -> ReferencePlan:
    """The reference workload of a job converting ``src``, worked out once, outside the timed samples.

    ``source`` is ``src`` itself when it holds at most :data:`REFERENCE_BYTES`, else a copy written to ``cut``
    whose tensor payloads are kept in file order while they fit in :data:`REFERENCE_BYTES` and dropped after
    (every node, value, attribute, name and shape is kept; only weight bytes go; subgraphs included).
    ``passes`` is :func:`reference_passes` of that source and the model's node count.  A function of the model
    alone.  Why: one pass over a 100 MB model serialised its weights -- 0.3 s per sample, 1.5 s per
    light_resnet50 job, a fifth of the job, timing the memory bus rather than anything a pass does in Python;
    and a model of many small nodes (ppocr_mobile_cls: 566 nodes in 0.6 MB) took ~20 ms per sample, most of
    its job's time outside model work, because its size alone undercounted what walking its nodes costs."""
    import onnx

    data = src.read_bytes()
    model = onnx.load_model_from_string(data)
    nodes = _count_nodes(model.graph)
    if len(data) <= REFERENCE_BYTES:
        return ReferencePlan(src, reference_passes(len(data), nodes))
    kept, full = 0, False
    for tensor in _tensors(model.graph):
        kept += tensor.ByteSize()
        full = full or kept > REFERENCE_BYTES
        if full:
            for name in ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data",
                         "string_data"):
                tensor.ClearField(name)
    out = model.SerializeToString()
    cut.write_bytes(out)
    return ReferencePlan(cut, reference_passes(len(out), nodes))


def _count_nodes(graph: Any) -> int:
    """Nodes of ``graph`` and of every subgraph in it."""
    return sum(1 + sum(_count_nodes(a.g) if a.HasField("g") else 0 for a in n.attribute)
               + sum(_count_nodes(g) for a in n.attribute for g in a.graphs) for n in graph.node)


def _tensors(graph: Any) -> Any:
    """Every tensor of ``graph`` and its subgraphs, in file order: initializers, then each node's tensor
    attributes (a Constant's value, a subgraph's own initializers and nodes).

    The same walk as ``amp_pass.io._tensors`` (which also yields sparse initializers), kept apart on purpose:
    this runs in the worker process, from which zygote fork servers are forked, and that lineage must never
    import this checkout's ``amp_pass`` (a zygote imports the pass of the revision under test:
    :mod:`workers.sandbox.zygotes`)."""
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from _tensors(attr.g)
            for sub in attr.graphs:
                yield from _tensors(sub)


def reference_workload(src: Path, scratch: Path, passes: int | None = None) -> float:
    """Seconds of a conversion-shaped workload that no pass revision changes, timed right after each
    conversion sample so that the conversion-time rule can divide drift out (as latency divides by the fp32
    run).  Shaped like one conversion: read ``src`` once, then ``passes`` times (default:
    :func:`reference_passes` of its size; a job passes its :func:`reference_plan`'s) parse it, walk every node
    and value in Python and serialise it (CPU and memory, what a busy machine slows), and write the result to
    ``scratch`` once (file I/O, as a conversion writes its output once).  A fixed amount of work per model
    whatever the revision; 2-20 ms on the smoke and real models (it was up to ~150 ms, and whole
    seconds under I/O load, when it rewrote the file on every pass: then it timed the file system's write
    latency hundreds of times per sample rather than the machine a conversion runs on)."""
    import onnx

    start = time.perf_counter()
    data = src.read_bytes()
    out = b""
    for _ in range(passes if passes is not None else reference_passes(len(data))):
        model = onnx.load_model_from_string(data)
        producers: dict[str, str] = {}
        for node in model.graph.node:
            for name in node.output:
                producers[name] = node.op_type
            for name in node.input:
                producers.setdefault(name, "")
        for init in model.graph.initializer:
            producers.setdefault(init.name, "initializer")
        out = model.SerializeToString()
    scratch.write_bytes(out)
    return time.perf_counter() - start
