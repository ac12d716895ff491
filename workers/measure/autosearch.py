"""Accuracy-guided fallback search (policy ``auto``): the fewest fp32 nodes that meet a tolerance.

:func:`auto_search` starts from the default painting and measures it with faithful emulation
(:mod:`workers.measure.emulation`) against the fp32 model on the given inputs.  If the tolerance is not met:

1. **Sensitivity** (:mod:`workers.measure.sensitivity`).  One emulated run exposes every main-graph value;
   each candidate node (a node the default painting runs low) is scored by its *local error jump*:
   the relative L2 error of its output minus the largest error of its inputs (a node whose output
   turns inf first scores highest).  Nodes the calibration rules flag for their own outputs
   (overflow, underflow) or reductions score above all others; nodes inside If/Loop/Scan bodies take the score of their
   top-level control-flow node.
2. **Galloping + bisection** over the ranking (as Polygraphy's ``debug precision`` bisects, but
   over a sensitivity order instead of the raw topological order): force the top 1, 2, 4... nodes
   to fp32 until the tolerance is met, then bisect down to the smallest prefix that meets it.
3. **Pruning** (delta debugging): drop the least sensitive half of the chosen set, then single
   nodes, whenever the rest still meets the tolerance.

Every candidate is converted in memory (``AmpPass`` with ``force_fp32`` node keys on a model
prepared once; nothing is written to disk), emulated and run.  Guarantees: deterministic for the
same model, inputs, options and machine (no time budget, stable tie-breaks); at most ``max_steps``
evaluations; the result is never less accurate than the default painting (if the tolerance cannot
be met, the most accurate evaluated set is returned, and ``met`` is False).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
from onnx import helper

from amp_pass import AmpPass, ConversionOptions, ConversionResult
from amp_pass.calibration import (
    FORCED_REASON,
    calibration_decisions,
    graph_scopes,
    low_node_keys,
)
from amp_pass.converter import default_opset, gc_paused
from amp_pass.options import DTYPES
from amp_pass.policy import load_policy
from amp_pass.prepare import prepare_model
from workers.measure.calibrate import Calibration, collect_ranges
from workers.measure.emulation import EmulatedSession
from workers.measure.metrics import output_metrics
from workers.measure.sensitivity import sensitivity
from workers.measure.sessions import make_session, run_session
from workers.result import OutputMetrics

DEFAULT_TOLERANCE = {"fp16": "cosine=0.9995", "bf16": "cosine=0.995"}
_FLAGGED = 1e300  # score of calibration-flagged nodes: above any measured jump


class ToleranceError(ValueError):
    """A malformed ``--tolerance`` string (a user error)."""

    exit_code = 2


@dataclass(frozen=True)
class Tolerance:
    """What "accurate enough" means: every float output, on every input set, must satisfy all bounds.

    ``cosine``/``snr_db`` are lower bounds, ``max_abs``/``max_rel`` upper bounds (None: unchecked);
    ``output_max_abs`` bounds the max abs error of named outputs (``max_abs[NAME]=x``; a job passes its
    own acceptance rule this way: k x fp32 rerun noise + atol + rtol x max|ref| per judged output); a
    NaN/Inf the fp32 model does not produce always fails.  Cosine is skipped for 1-element outputs.
    """

    cosine: float | None = 0.9995
    snr_db: float | None = None
    max_abs: float | None = None
    max_rel: float | None = None
    output_max_abs: tuple[tuple[str, float], ...] = ()

    @classmethod
    def parse(cls, text: str) -> Tolerance:
        """``"cosine=0.9995,max_abs=1e-2"`` -> Tolerance; ToleranceError naming the bad part."""
        values: dict[str, float | None] = {"cosine": None}
        named: dict[str, float] = {}
        for part in (p.strip() for p in text.split(",") if p.strip()):
            key, sep, raw = part.partition("=")
            key = key.strip()
            output = key[len("max_abs["):-1] if key.startswith("max_abs[") and key.endswith("]") else None
            if not sep or (output is None and key not in ("cosine", "snr_db", "max_abs", "max_rel")) or output == "":
                raise ToleranceError(f"bad tolerance {part!r}: use cosine=, snr_db=, max_abs=, max_rel= "
                                     "or max_abs[OUTPUT]=")
            try:
                value = float(raw)
            except ValueError:
                raise ToleranceError(f"bad tolerance {part!r}: {raw!r} is not a number") from None
            if output is not None:
                named[output] = value
            else:
                values[key] = value
        if all(v is None for v in values.values()) and not named:
            raise ToleranceError(f"empty tolerance {text!r}")
        return cls(**values, output_max_abs=tuple(sorted(named.items())))  # type: ignore[arg-type]

    def meets(self, metrics: Sequence[tuple[OutputMetrics, int]], names: Sequence[str] = ()) -> bool:
        """Whether every (metrics, element count) pair is within the bounds; ``names`` (parallel to
        ``metrics``) says which output each pair measures, for ``output_max_abs``."""
        bounds = dict(self.output_max_abs)
        for i, (m, size) in enumerate(metrics):
            if not math.isfinite(m.max_abs):
                return False
            bound = bounds.get(names[i]) if i < len(names) else None
            if bound is not None and not m.max_abs <= bound:
                return False
            if self.cosine is not None and size > 1 and not m.cosine >= self.cosine:
                return False
            if self.snr_db is not None and not m.snr_db >= self.snr_db:
                return False
            if self.max_abs is not None and not m.max_abs <= self.max_abs:
                return False
            if self.max_rel is not None and not m.max_rel <= self.max_rel:
                return False
        return True

    def __str__(self) -> str:
        plain = [f"{k}={v:g}" for k, v in dataclasses.asdict(self).items() if v is not None and k != "output_max_abs"]
        return ",".join(plain + [f"max_abs[{n}]={v:g}" for n, v in self.output_max_abs])


@dataclass
class Evaluation:
    """One candidate set measured: worst metrics over outputs and inputs, and the verdict."""

    forced: frozenset[str]
    met: bool
    cosine: float
    max_abs: float
    snr_db: float
    compute_low: int = 0
    compute_nodes: int = 0
    seconds: float = 0.0

    def error_key(self) -> tuple[float, float]:
        """Smaller is more accurate (cosine first, then max abs error)."""
        return (-self.cosine if math.isfinite(self.cosine) else math.inf, self.max_abs)


@dataclass
class SearchStep:
    """One evaluation of the search, for the report."""

    step: int
    phase: str
    forced: int
    met: bool
    cosine: float
    max_abs: float
    seconds: float


@dataclass
class SearchResult:
    """The chosen fp32 set, how it was found, and the converted model."""

    tolerance: str
    met: bool
    forced: list[str]
    reasons: dict[str, str]
    candidates: int
    default: Evaluation
    final: Evaluation
    steps: list[SearchStep] = field(default_factory=list)
    seconds: float = 0.0
    result: ConversionResult | None = None
    calibration: Calibration | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-able summary (the ``auto`` section of the report)."""
        def ev(e: Evaluation) -> dict[str, Any]:
            return {"met": e.met, "cosine": _num(e.cosine), "max_abs": _num(e.max_abs), "snr_db": _num(e.snr_db),
                    "compute_low": e.compute_low, "compute_nodes": e.compute_nodes}
        return {"tolerance": self.tolerance, "met": self.met, "candidates": self.candidates,
                "forced_fp32": [{"node": k, "reason": self.reasons.get(k, "")} for k in self.forced],
                "default": ev(self.default), "final": ev(self.final), "steps": [dataclasses.asdict(s) for s in
                                                                                 self.steps],
                "evaluations": len(self.steps), "seconds": round(self.seconds, 3)}


def _num(x: float) -> float | str:
    return x if math.isfinite(x) else str(x)


class Evaluator:
    """Converts a candidate set in memory, emulates it and compares it with fp32 (results cached)."""

    def __init__(self, model: onnx.ModelProto, feeds_list: Sequence[Mapping[str, np.ndarray]],
                 options: ConversionOptions, tolerance: Tolerance, reference: Sequence[Mapping[str, np.ndarray]]
                 ) -> None:
        # checked, inlined, opset-planned and typed once, exactly as convert_model would; reused by every step
        prepared = prepare_model(model, options.check_input, options.opset_planner())
        self.prepared = ir.serde.serialize_model(prepared.model)
        self.prep_info = prepared
        self.options = dataclasses.replace(options, check_input=False)
        self.feeds_list, self.tolerance, self.reference = feeds_list, tolerance, reference
        self.float_outputs = [o.name for o in model.graph.output if o.type.tensor_type.elem_type
                              == onnx.TensorProto.FLOAT]
        self.cache: dict[frozenset[str], Evaluation] = {}
        self.steps: list[SearchStep] = []

    def convert(self, forced: frozenset[str]) -> ConversionResult:
        """The conversion with ``forced`` node keys kept fp32 (the prepared model is not prepared again)."""
        start = time.perf_counter()
        with gc_paused():
            work = ir.serde.deserialize_model(self.prepared)
            report = AmpPass(dataclasses.replace(self.options, force_fp32=forced)).call(work)
            model = ir.serde.serialize_model(work)
        info = self.prep_info  # what convert_model records about preparation
        report.functions_inlined += info.inlined
        if info.opset_in is not None:
            report.opset_in = info.opset_in
        report.notes.extend(info.notes)
        report.seconds = time.perf_counter() - start
        return ConversionResult(model=model, report=report)

    def evaluate(self, forced: frozenset[str], phase: str, expose: Sequence[str] = ()
                 ) -> tuple[Evaluation, dict[str, np.ndarray]]:
        """Measure ``forced`` (cached unless ``expose`` asks for intermediate values of feed set 0)."""
        if forced in self.cache and not expose:
            return self.cache[forced], {}
        start = time.perf_counter()
        result = self.convert(forced)
        session = EmulatedSession(result.model)
        if expose:  # intermediate values are exposed on the emulated (all-fp32) model
            emu = session.model
            have = {o.name for o in emu.graph.output}
            made = {o for n in result.model.graph.node for o in n.output if o}
            emu.graph.output.extend(helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None)
                                    for n in expose if n not in have and n in made)
            session.session = make_session(emu, "cpu", optimize=False)
        per: list[tuple[OutputMetrics, int]] = []
        exposed: dict[str, np.ndarray] = {}
        for i, (feeds, ref) in enumerate(zip(self.feeds_list, self.reference, strict=True)):
            got = session.run(feeds)
            if i == 0 and expose:
                exposed = {n: got[n] for n in expose if n in got}
            per.extend((output_metrics(ref[n], got[n]), int(np.size(ref[n]))) for n in self.float_outputs)
        names = self.float_outputs * len(self.feeds_list)
        ev = Evaluation(forced, self.tolerance.meets(per, names), min((m.cosine for m, s in per if s > 1), default=1.0),
                        max((m.max_abs for m, _ in per), default=0.0), min((m.snr_db for m, _ in per), default=math.inf),
                        result.report.compute_low, result.report.compute_nodes, time.perf_counter() - start)
        self.cache[forced] = ev
        self.steps.append(SearchStep(len(self.steps) + 1, phase, len(forced), ev.met, _round(ev.cosine),
                                     _round(ev.max_abs), round(ev.seconds, 3)))
        return ev, exposed


def _round(x: float) -> float:
    return float(f"{x:.8g}") if math.isfinite(x) else x


def reference_outputs(model: onnx.ModelProto, feeds_list: Sequence[Mapping[str, np.ndarray]]
                      ) -> list[dict[str, np.ndarray]]:
    """The fp32 model's outputs on each feed set (CPU provider, optimizations off)."""
    session = make_session(model, "cpu", optimize=False)
    names = {i.name for i in session.get_inputs()}
    return [run_session(session, {k: v for k, v in f.items() if k in names}) for f in feeds_list]


def auto_search(model: onnx.ModelProto, feeds_list: Sequence[Mapping[str, np.ndarray]],
                options: ConversionOptions | None = None, tolerance: Tolerance | None = None,
                max_steps: int = 16, calibration: Calibration | None = None,
                thresholds: Mapping[str, float] | None = None) -> SearchResult:
    """Find a small set of nodes to keep fp32 so that the conversion meets ``tolerance``.

    ``options.policy`` is the starting painting (``default`` when given ``auto``).  See the module
    docstring for the method and guarantees.  ``calibration`` (from :func:`collect_ranges` with
    ``keep_arrays=True`` on the same feeds) is measured only when the default misses the tolerance,
    with ``thresholds`` for the calibration rules.
    """
    start = time.perf_counter()
    options = options or ConversionOptions()
    if options.policy == "auto":
        options = dataclasses.replace(options, policy="default")
    low = DTYPES[options.dtype]
    tolerance = tolerance or Tolerance.parse(DEFAULT_TOLERANCE[options.dtype])
    reference = [dict(calibration.arrays)] if calibration and len(feeds_list) == 1 and calibration.arrays else []
    if not reference or any(o.name not in reference[0] for o in model.graph.output):
        reference = reference_outputs(model, feeds_list)
    ev = Evaluator(model, feeds_list, options, tolerance, reference)
    ir_model = ir.serde.deserialize_model(ev.prepared)
    opset = default_opset(ir_model)
    policy = load_policy(options.policy, options.target, opset)
    candidates = low_node_keys(ir_model.graph, policy, opset, low, options)
    default, _ = ev.evaluate(frozenset(), "default")
    chosen: frozenset[str] = frozenset()
    reasons: dict[str, str] = {}
    flagged: dict[str, str] = {}
    if not default.met and candidates:
        if calibration is None or not calibration.arrays:
            calibration = collect_ranges(model, feeds_list, keep_arrays=True, **(thresholds or {}))
        _, keys = graph_scopes(ir_model.graph)
        flagged = {keys[n]: why for n, (why, _) in
                   calibration_decisions(ir_model.graph, calibration.ranges, low).items()}
        _, got = ev.evaluate(frozenset(), "sensitivity", expose=list(calibration.arrays))
        scores = sensitivity(ev.prepared, calibration.arrays, got) if got else {}
        order = {k: i for i, k in enumerate(candidates)}

        def score(k: str) -> float:
            """Nodes whose own output breaks the dtype first (their readers follow them by taint)."""
            why = flagged.get(k)
            return _FLAGGED if why is not None and not why.startswith("calibration: input") else scores.get(k, 0.0)

        ranked = sorted(candidates, key=lambda k: (-score(k), order[k]))
        chosen = _bisect(ev, ranked, max_steps)
        chosen = _prune(ev, chosen, ranked, max_steps)
        for k in sorted(chosen, key=ranked.index):
            reasons[k] = flagged.get(k) or f"search: local error jump {scores.get(k, 0.0):.3g} " \
                                            f"(rank {ranked.index(k) + 1} of {len(ranked)})"
    if not ev.cache[chosen].met:  # tolerance unreachable: keep the most accurate set measured
        chosen = min(ev.cache.values(), key=lambda e: (e.error_key(), len(e.forced), sorted(e.forced))).forced
        reasons = {k: reasons.get(k) or flagged.get(k) or "search: most accurate set measured" for k in chosen}
    final = ev.cache[chosen]
    result = ev.convert(chosen)
    result.report.policy = "auto"
    for kept in result.report.kept_fp32:  # name the search's reason instead of the generic one
        key = kept.reason.partition(f"{FORCED_REASON}: ")[2]
        if kept.reason.startswith(FORCED_REASON) and key in reasons:
            kept.reason = f"auto: {reasons[key]} [{key}]"
    ordered = [k for k in candidates if k in chosen]
    return SearchResult(str(tolerance), final.met, ordered, reasons, len(candidates), default, final, ev.steps,
                        time.perf_counter() - start, result, calibration)


def _meets(ev: Evaluator, forced: frozenset[str], phase: str) -> bool:
    return ev.evaluate(forced, phase)[0].met


def _bisect(ev: Evaluator, ranked: list[str], max_steps: int) -> frozenset[str]:
    """Smallest prefix of ``ranked`` meeting the tolerance (galloping, then bisection)."""
    n = len(ranked)
    lo, hi, k = 0, None, 1
    while len(ev.steps) < max_steps:
        if _meets(ev, frozenset(ranked[:k]), f"gallop top {k}"):
            hi = k
            break
        lo = k
        if k == n:
            break
        k = min(2 * k, n)
    if hi is None:
        return frozenset(ranked[:lo]) if lo else frozenset()
    while hi - lo > 1 and len(ev.steps) < max_steps:
        mid = (lo + hi) // 2
        if _meets(ev, frozenset(ranked[:mid]), f"bisect top {mid}"):
            hi = mid
        else:
            lo = mid
    return frozenset(ranked[:hi])


def _prune(ev: Evaluator, chosen: frozenset[str], ranked: list[str], max_steps: int) -> frozenset[str]:
    """Drop chunks (least sensitive first, halving sizes) while the rest still meets the tolerance."""
    if not chosen or not ev.cache.get(chosen, None) or not ev.cache[chosen].met:
        return chosen
    members = sorted(chosen, key=ranked.index)
    for size in sorted({max(len(members) // 2, 1), 1}, reverse=True):
        i = len(members)
        while i > 0 and len(ev.steps) < max_steps:
            chunk = members[max(0, i - size):i]
            rest = frozenset(m for m in members if m not in chunk)
            if rest and _meets(ev, rest, f"prune {len(chunk)}"):
                members = [m for m in members if m not in chunk]
            i -= size
    return frozenset(members)
