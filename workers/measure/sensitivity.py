"""Per-node sensitivity: where a converted model's error appears, from one run that exposes every value.

:func:`sensitivity` compares the main-graph values of the fp32 model with those of the emulated
converted model (same names: the pass keeps node output names) and scores each node by its *local
error jump*: the relative L2 error of its outputs minus the largest relative error of its inputs.
A node whose output first turns non-finite scores above every finite jump; nodes inside If/Loop/Scan
bodies (whose values cannot be exposed) take the score of their top-level control-flow node.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import onnx

from amp_pass.calibration import SEP, node_key

INF_JUMP = 1e200  # the score of a node whose output turns inf/NaN first


def _rel_err(ref: np.ndarray, got: np.ndarray) -> float:
    r = np.asarray(ref, dtype=np.float64)
    g = np.asarray(got, dtype=np.float64)
    if r.shape != g.shape or r.size == 0:
        return 0.0
    fin = np.isfinite(r)
    if (fin & ~np.isfinite(g)).any():
        return math.inf
    num = float(np.linalg.norm((r - g)[fin]))
    return num / max(float(np.linalg.norm(r[fin])), 1e-12)


def sensitivity(prepared: onnx.ModelProto, ref: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray]
                ) -> dict[str, float]:
    """Local error jump of every node key (body nodes get their top-level control-flow node's jump)."""
    err = {n: _rel_err(ref[n], got[n]) for n in got if n in ref}
    scores: dict[str, float] = {}

    def visit_body(g: onnx.GraphProto, scope: str, score: float) -> None:
        for i, node in enumerate(g.node):
            key = node_key(scope, node.output, node.op_type, i)
            scores[key] = score
            for attr in node.attribute:
                subs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
                for pos, sub in enumerate(subs):
                    where = None if attr.type == onnx.AttributeProto.GRAPH else pos
                    visit_body(sub, f"{key}{SEP}{attr.name}{'' if where is None else f'[{where}]'}{SEP}", score)

    for i, node in enumerate(prepared.graph.node):
        key = node_key("", node.output, node.op_type, i)
        out = max((err.get(n, 0.0) for n in node.output if n), default=0.0)
        inp = max((err.get(n, 0.0) for n in node.input if n), default=0.0)
        if math.isinf(out):
            jump = 0.0 if math.isinf(inp) else INF_JUMP
        else:
            jump = out - inp
        scores[key] = jump
        for attr in node.attribute:
            subs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            for pos, sub in enumerate(subs):
                where = "" if attr.type == onnx.AttributeProto.GRAPH else f"[{pos}]"
                visit_body(sub, f"{key}{SEP}{attr.name}{where}{SEP}", jump)
    return scores
