"""The creep series of ``bench_verdicts.py``: one metric kind per cell, each worsening a little at every commit
so that no single commit crosses its rule's limits while the sum does.

Not a benchmark script (the leading underscore keeps it out of ``tests/test_bench_quick.py``).  One branch
off the bench's base carries all three series at once, each on its own cells (the store keeps one drift per
cell and run, so two series on one cell would hide each other):

- **conversion time**: every conversion of every swept model but the two below ``convert_step_s`` slower
  than at the commit before (20 ms against the rule's +0.1 s floor): by default ``convert_model`` burns that
  much more CPU time (one more graph walk a commit, the issue's creep), with ``wait`` it sleeps it instead
  (a pass that waits: wall time only, the rule's guarded path);
- **latency**: the converted fp16 ``light_squeezenet`` routes its output through no-op Loop steps, as many
  more at each commit as add ``latency_total / n`` of the model's own work (the whole series: x1.5 by
  default; each step about +6 % against the rule's x1.10);
- **accuracy**: the converted fp16 ``conv_net`` adds a constant to its output, ``accuracy_step`` more at each
  commit (0.35 x the larger of the base's max_abs error and the rule's floor: a step never passes the floor or
  doubles the error, three of them pass both).

After the series come noise commits (comments only): a finding there is a false alarm.  Then the tip is
swept once more as a ``nightly`` run (a push, like a nightly, reports any drift over the limit not reported
yet, one dismissed by its confirmation as borderline included; the nightly is a last look).  :func:`score` turns
the sweeps into one row per kind: at which commit the creep was found, against which reference, by a drift or
by the parent comparison, and every finding that belongs to none of the series.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

#: (model, dtype) of the latency and accuracy series; the conversion-time series runs on every other model.
LATENCY_CELL = ("light_squeezenet", "fp16")
ACCURACY_CELL = ("conv_net", "fp16")
#: Graph names of those models (the injected code checks the input model's graph name).
GRAPH_OF = {"light_squeezenet": "squeezenet_old", "conv_net": "conv_net"}
#: kind -> (drift metric, parent-comparison kind) of each series.
KINDS = {"conversion time": ("convert_s", "conversion_time"), "latency": ("latency_p50_ms", "latency"),
         "accuracy": ("max_abs", "accuracy")}

CREEP_FN = '''

_CREEP_CONVERT_S = 0.0
_CREEP_WAIT = {wait!r}
_CREEP_TRIPS = 0
_CREEP_BIAS = 0.0
_convert_model_uncrept = convert_model


def _creep_bias(model: onnx.ModelProto, bias: float) -> onnx.ModelProto:
    """CREEP(accuracy): ``bias`` added to the first output."""
    from onnx import helper

    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    out = g.output[0]
    inner = out.name + "__pre_creep"
    for n in g.node:
        for i, o in enumerate(n.output):
            if o == out.name:
                n.output[i] = inner
    g.initializer.append(helper.make_tensor("creep_bias", out.type.tensor_type.elem_type, [], [bias]))
    g.node.append(helper.make_node("Add", [inner, "creep_bias"], [out.name]))
    return m


def convert_model(model: onnx.ModelProto, options: ConversionOptions | None = None) -> ConversionResult:
    """CREEP: slower conversions, a slower {lat_graph} and a less accurate {acc_graph} at every commit."""
    name = model.graph.name
    if name not in {excluded!r} and _CREEP_WAIT:
        time.sleep(_CREEP_CONVERT_S)
    elif name not in {excluded!r}:
        end = time.thread_time() + _CREEP_CONVERT_S
        while time.thread_time() < end:
            pass
    result = _convert_model_uncrept(model, options)
    fp16 = options is None or options.dtype == "fp16"
    if name == {lat_graph!r} and fp16 and _CREEP_TRIPS > 0:
        m = _redundant_work(result.model)
        for init in m.graph.initializer:
            if init.name == "slow_trip":
                init.int64_data[:] = [_CREEP_TRIPS]
        result = ConversionResult(model=m, report=result.report)
    if name == {acc_graph!r} and fp16 and _CREEP_BIAS > 0:
        result = ConversionResult(model=_creep_bias(result.model, _CREEP_BIAS), report=result.report)
    return result
'''


@dataclass(frozen=True)
class CreepPlan:
    """What each creep commit adds: seconds of conversion, no-op Loop steps (0: no latency series), output
    bias (0: no accuracy series); ``n`` commits; ``wait``: the conversion creep sleeps instead of computing."""

    n: int
    convert_step_s: float
    trips_step: int = 0
    accuracy_step: float = 0.0
    wait: bool = False

    @property
    def kinds(self) -> list[str]:
        """The series this plan runs, in table order."""
        return ["conversion time"] + (["latency"] if self.trips_step else []) + \
            (["accuracy"] if self.accuracy_step else [])

    def expected(self, kind: str, models: Sequence[str], dtypes: Sequence[str] = ("fp16", "bf16")) \
            -> set[tuple[str, str]]:
        """The (model, dtype) cells the series of ``kind`` moves."""
        if kind == "latency":
            return {LATENCY_CELL}
        if kind == "accuracy":
            return {ACCURACY_CELL}
        excluded = {c[0] for c, k in ((LATENCY_CELL, "latency"), (ACCURACY_CELL, "accuracy")) if k in self.kinds}
        return {(m, d) for m in models if m not in excluded for d in dtypes}


def accuracy_step(base_max_abs: float | None, floor: float) -> float:
    """The bias each accuracy creep commit adds: 0.35 x max(base error, floor) (see the module doc)."""
    return 0.35 * max(base_max_abs or 0.0, floor)


def creep_source(plan: CreepPlan, latency_fn: str) -> str:
    """The code the first creep commit appends to ``converter.py``."""
    excluded = tuple(sorted(GRAPH_OF[c[0]] for c, k in ((LATENCY_CELL, "latency"), (ACCURACY_CELL, "accuracy"))
                            if k in plan.kinds))
    return latency_fn + CREEP_FN.format(excluded=excluded, wait=plan.wait, lat_graph=GRAPH_OF[LATENCY_CELL[0]],
                                        acc_graph=GRAPH_OF[ACCURACY_CELL[0]])


def creep_lines(plan: CreepPlan, k: int) -> str:
    """The lines creep commit ``k`` (1-based) appends: each series one step further."""
    lines = [f"_CREEP_CONVERT_S += {plan.convert_step_s!r}  # creep {k}"]
    if plan.trips_step:
        lines.append(f"_CREEP_TRIPS += {plan.trips_step}")
    if plan.accuracy_step:
        lines.append(f"_CREEP_BIAS += {plan.accuracy_step!r}")
    return "\n" + "\n".join(lines) + "\n"


def score(plan: CreepPlan, rows: Sequence[dict[str, Any]], models: Sequence[str], base: str,
          describe_ref: Callable[[str], str]) -> dict[str, Any]:
    """Per series: the first creep commit with a drift of its metric (or a parent-comparison finding of its
    kind) on one of its cells, and the reference named; plus every finding on a creep row that belongs to no
    series (a false alarm: on a noise commit anything but the first report of a series cell's drift, on a creep
    commit a finding of an unmoved cell).  A series cell's drift first reported on a noise commit after the creep
    is the creep reported late (a push reports any drift over the limits that no finding reports yet), listed
    under ``late``; a second report of it is a false alarm."""
    out: dict[str, Any] = {"kinds": {}, "alarms": []}
    moved: set[tuple[str, str, str]] = set()
    drifting: set[tuple[str, str, str]] = set()
    for kind in plan.kinds:
        metric, pair_kind = KINDS[kind]
        cells = plan.expected(kind, models)
        moved |= {(m, d, pair_kind) for m, d in cells}
        drifting |= {(m, d, metric) for m, d in cells}
        hit: dict[str, Any] | None = None
        for r in rows:
            if not r["step"] and not r.get("nightly"):
                continue
            drift = [x for x in r["drifts"] if x[2] == metric and (x[0], x[1]) in cells]
            pair = [f for f in r["findings"] if f[2] == pair_kind and (f[0], f[1]) in cells]
            if drift or pair:
                ref = drift[0][3] if drift else ""
                hit = {"step": r["step"] or "nightly", "commit": r["commit"],
                       "how": (("the nightly's " if r.get("nightly") else "") + f"drift against {describe_ref(ref)}"
                               if drift else "parent comparison"),
                       "cells": sorted({(x[0], x[1]) for x in drift} | {(f[0], f[1]) for f in pair})}
                break
        out["kinds"][kind] = hit
    reported: set[tuple[str, str, str]] = set()  # series cells whose drift a row has reported
    out["late"] = []
    for r in rows:
        series = bool(r["step"]) or bool(r.get("nightly"))  # a row where the series' cells may move
        where = "nightly" if r.get("nightly") else (r["step"] or "noise")
        for f in r["findings"]:
            if f[2] != "drift" and (not series or (f[0], f[1], f[2]) not in moved):
                out["alarms"].append((r["commit"], where, *f))
        for x in r["drifts"]:
            key = (x[0], x[1], x[2])
            if key in drifting and (series or key not in reported):
                if not series:  # the creep's drift, first reported by the push after it: late, not false
                    out["late"].append((r["commit"], where, x[0], x[1], f"drift of {x[2]}"))
                reported.add(key)
                continue
            out["alarms"].append((r["commit"], where, x[0], x[1], f"drift of {x[2]}"))
    return out
