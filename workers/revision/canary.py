"""The sandbox canary: one conversion of a tiny model through the real pass sandbox, before any job runs.

A sandbox that cannot import the pass's dependencies (a ``site-packages`` it hides), cannot be made, or cannot
fork a conversion fails *every* conversion, and each failure would look like the pass's.  The commands that
run jobs check first (:func:`run_canary`): ``ampci serve``/``worker`` refuse to start, embedded commands stop
before their first job, each with the one line :attr:`CanaryResult.reason`, and ``/healthz`` shows the last
result (:func:`last`).

The canary's pass is ampci's own stand-in, never the pass under test (a pull request's or a working tree's
broken pass is that pass's failure, not the sandbox's): an ``amp_pass`` written for the canary that imports,
inside the sandbox, every module the checkout's pass imports (:func:`pass_imports`: read from its sources,
kept where this interpreter has them) and then "converts" a MatMul+Add+Relu model built in memory
(:func:`tiny_model`) by copying it, with a report.  It runs through
:func:`workers.revision.convert.convert_in_subprocess` with the worker's sandbox policy and a one-shot zygote, so it
leaves no process behind.  Any failure is the sandbox's.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from workers.sandbox.policy import SandboxPolicy

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


def pass_imports(root: Path | None = None) -> list[str]:
    """The absolute imports of the pass under ``root`` (default: this checkout) other than its own, read from its
    sources (never run), whose top-level package this interpreter has: what the pass needs the sandbox to show
    it (a submodule its installed package lacks is this environment's fault, as the sandbox's is)."""
    import ast
    import importlib.util

    from workers.revision.convert import DEFAULT_PASS_ROOT

    names: set[str] = set()
    for path in sorted(((root or DEFAULT_PASS_ROOT) / "amp_pass").rglob("*.py")):
        try:
            tree = ast.parse(path.read_bytes())
        except (OSError, SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module)
    found = []
    for name in sorted(n for n in names if n.split(".")[0] not in ("amp_pass", "__future__")):
        try:  # the top-level package only: found without importing anything here
            if importlib.util.find_spec(name.split(".")[0]) is not None:
                found.append(name)
        except (ImportError, ValueError):
            continue
    return found


_STAND_IN = '''
import importlib, json, shutil, sys
for name in {modules!r}:
    importlib.import_module(name)
argv = sys.argv[1:]
src, dst, report = argv[1], argv[argv.index("-o") + 1], argv[argv.index("--report") + 1]
shutil.copyfile(src, dst)
with open(report, "w") as fh:
    json.dump({{"dtype": "fp16", "policy": "default", "target": "cpu", "nodes_total": 3, "seconds": 0.0}}, fh)
'''


def stand_in_pass(root: Path, modules: list[str]) -> Path:
    """Write the canary's ``amp_pass`` under ``root`` (readable by the sandbox's uid); returns ``root``."""
    pkg = root / "amp_pass"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""The sandbox canary of ampci: imports what the pass imports."""\n')
    (pkg / "__main__.py").write_text(_STAND_IN.format(modules=list(modules)))
    for p in (root, pkg):
        p.chmod(0o755)
    return root


def reason_for(status: str, message: str) -> str:
    """The one line a failed canary says: what could not be imported, when that is the cause."""
    text = " ".join(message.split())[:400]
    missing = (re.search(r"No module named '([\w.]+)'", text)
               or re.search(r"sandbox cannot import ([\w.]+)", text))  # as workers.infra words it
    if missing:
        return (f"the pass sandbox cannot import {missing.group(1)}, which this interpreter imports (a directory "
                f"it imports from is not visible inside the sandbox?): {text}")
    return f"the pass sandbox failed its canary conversion ({status}): {text or 'no message'}"


def run_canary(policy: SandboxPolicy, modules: list[str] | None = None,
               timeout_s: float = CANARY_TIMEOUT_S) -> CanaryResult:
    """Convert :func:`tiny_model` with the canary's stand-in pass, importing ``modules`` (default:
    :func:`pass_imports`) in the sandbox of ``policy``; never raises for a failure of the sandbox (it is the
    result).  The result is also kept for :func:`last`."""
    from workers.revision.convert import convert_in_subprocess

    global _LAST
    start = time.perf_counter()
    scratch = Path(tempfile.mkdtemp(prefix="ampci-canary-"))
    try:
        root = stand_in_pass(scratch / "pass", pass_imports() if modules is None else modules)
        src = scratch / "canary.onnx"
        src.write_bytes(tiny_model())
        out = convert_in_subprocess(src, scratch / "out.onnx", scratch / "report.json", "fp16", "default", "cpu",
                                    root, timeout_s=timeout_s, memory_bytes=CANARY_MEMORY_BYTES, warm=False,
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


def remember(result: CanaryResult) -> None:
    """Make ``result`` what :func:`last` says (a passed canary remembered: :mod:`workers.revision.canary_cache`)."""
    global _LAST
    with _LOCK:
        _LAST = result


def forget() -> None:
    """Forget the latest result (:func:`last` is None again): for a process that changes its sandbox policy."""
    global _LAST
    with _LOCK:
        _LAST = None
