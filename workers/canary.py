"""The sandbox canary: one conversion of a tiny model through the real pass sandbox, before any job runs.

A sandbox that cannot import the pass's dependencies (a ``site-packages`` it hides), cannot be made, or cannot
fork a conversion fails *every* conversion, and each failure would look like the pass's.  The commands that
run jobs check first (:func:`run_canary`): ``ampci serve``/``worker`` refuse to start, embedded commands stop
before their first job, each with the one line :attr:`CanaryResult.reason`, and ``/healthz`` shows the last
result (:func:`last`).

The canary converts a MatMul+Add+Relu model built in memory (:func:`tiny_model`) with the pass of this checkout
(:data:`workers.convert.DEFAULT_PASS_ROOT`, or the root given), through
:func:`workers.convert.convert_in_subprocess` with the worker's sandbox policy.  ``warm=False`` (the default:
serve, worker, sweep) uses a one-shot zygote and leaves no process behind; ``warm=True`` (a command that then
converts in this same process) leaves the pass root's zygote running for the first job to use.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from workers.sandbox import SandboxPolicy

#: The conversion's limits: the canary is tiny; a sandbox that needs longer is broken.
CANARY_TIMEOUT_S = 120.0
CANARY_MEMORY_BYTES = 2 * 2**30


@dataclass(frozen=True)
class CanaryResult:
    """How the canary conversion went: ``ok``, and when not, ``reason`` (one line, starting "the pass sandbox");
    ``ran_at`` (Unix time it finished), ``seconds`` it took, ``sandbox`` mode it ran in."""

    ok: bool
    reason: str
    ran_at: float
    seconds: float
    sandbox: str = ""


_LAST: CanaryResult | None = None
_LOCK = threading.Lock()


def tiny_model() -> bytes:
    """A float32 MatMul -> Add -> Relu model (x[1,4] @ W[4,4] + b[4]), serialised."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="matmul"),
             helper.make_node("Add", ["h", "b"], ["a"], name="add"),
             helper.make_node("Relu", ["a"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "canary", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])], [w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model.SerializeToString()


def reason_for(status: str, message: str) -> str:
    """The one line a failed canary says: what could not be imported, when that is the cause."""
    text = " ".join(message.split())[:400]
    missing = re.search(r"No module named '([\w.]+)'", text)
    if missing:
        return (f"the pass sandbox cannot import {missing.group(1)} (a directory the interpreter imports from is "
                f"not visible inside it?): {text}")
    return f"the pass sandbox failed its canary conversion ({status}): {text or 'no message'}"


def run_canary(policy: SandboxPolicy, pass_root: Path | None = None, warm: bool = False,
               timeout_s: float = CANARY_TIMEOUT_S) -> CanaryResult:
    """Convert :func:`tiny_model` to fp16 with the pass of ``pass_root`` (default: this checkout) in the sandbox
    of ``policy``; never raises for a failure of the sandbox or the pass (it is the result).  The result is
    also kept for :func:`last`."""
    from workers.convert import convert_in_subprocess

    global _LAST
    start = time.perf_counter()
    scratch = Path(tempfile.mkdtemp(prefix="ampci-canary-"))
    try:
        src = scratch / "canary.onnx"
        src.write_bytes(tiny_model())
        out = convert_in_subprocess(src, scratch / "out.onnx", scratch / "report.json", "fp16", "default", "cpu",
                                    pass_root, timeout_s=timeout_s, memory_bytes=CANARY_MEMORY_BYTES, warm=warm,
                                    sandbox=policy)
        ok = out.status == "ok"
        result = CanaryResult(ok, "" if ok else reason_for(out.status, out.message), time.time(),
                              time.perf_counter() - start, out.sandbox)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    with _LOCK:
        _LAST = result
    return result


def last() -> CanaryResult | None:
    """The result of this process's latest :func:`run_canary` (None: none ran)."""
    with _LOCK:
        return _LAST


def forget() -> None:
    """Forget the latest result (:func:`last` is None again): for a process that changes its sandbox policy."""
    global _LAST
    with _LOCK:
        _LAST = None
