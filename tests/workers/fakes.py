"""Stand-in passes (``amp_pass`` packages under a temporary pass root) and test manifests.

Each fake implements the subprocess contract ``python -m amp_pass convert SRC -o DST --dtype D
--policy P --target T --report FILE`` with one behaviour, so every job status can be produced
without depending on what the real pass does today.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

_ARGS = '''
import argparse, json, os, sys, time
p = argparse.ArgumentParser()
p.add_argument("cmd"); p.add_argument("src"); p.add_argument("-o", dest="dst", required=True)
p.add_argument("--dtype"); p.add_argument("--policy"); p.add_argument("--target"); p.add_argument("--report")
a = p.parse_args()

def report(**extra):
    data = {"dtype": a.dtype, "policy": a.policy, "target": a.target, "nodes_total": 1, "nodes_low": 1,
            "casts_inserted": 0, "casts_removed": 0, "compute_nodes": 1, "compute_low": 1,
            "low_precision_compute_fraction": 1.0, "kept_fp32": [], "by_op_type": {}, "seconds": 0.01}
    data.update(extra)
    with open(a.report, "w") as f:
        json.dump(data, f)
'''

BEHAVIOURS = {
    # Copies the model after 0.5 s of arithmetic (CPU time of the conversion process) / of sleeping (wall only).
    "burn": '''
import shutil
_end = time.process_time() + 0.5
while time.process_time() < _end:
    pass
shutil.copyfile(a.src, a.dst)
report()
''',
    "sleepy": '''
import shutil
time.sleep(0.5)
shutil.copyfile(a.src, a.dst)
report()
''',
    # Naive full fp16 conversion (onnxconverter-common, a dev dependency): everything in fp16, graph
    # inputs and outputs included (its keep_io_types=True mode produces invalid models).
    "naive_fp16": '''
import onnx
from onnxconverter_common import float16
if a.dtype != "fp16":
    print("naive pass: only fp16", file=sys.stderr); sys.exit(2)
m = float16.convert_float_to_float16(onnx.load(a.src), keep_io_types=False)
onnx.save(m, a.dst)
report(kept_fp32=[{"node": "n", "op_type": "X", "graph": "main", "reason": "test"}])
''',
    # Returns the fp32 model with every float initializer scaled by 1.05: converts "fine", inaccurate.
    "perturb": '''
import numpy as np, onnx
from onnx import numpy_helper
m = onnx.load(a.src)
for i, t in enumerate(m.graph.initializer):
    arr = numpy_helper.to_array(t)
    if arr.dtype == np.float32 and arr.size > 1:
        m.graph.initializer[i].CopyFrom(numpy_helper.from_array(arr * np.float32(1.05), t.name))
onnx.save(m, a.dst)
report()
''',
    # The model with its first float initializer's data moved to "external data" at a location the pass names
    # (PASS_EXTERNAL_LOCATION, default ../secret): the worker must never read that file for it.
    "external_secret": '''
import onnx
m = onnx.load(a.src)
t = next(i for i in m.graph.initializer if i.data_type == onnx.TensorProto.FLOAT)
t.ClearField("raw_data"); t.ClearField("float_data")
t.data_location = onnx.TensorProto.EXTERNAL
for k, v in (("location", os.environ.get("PASS_EXTERNAL_LOCATION", "../secret")), ("offset", "0"), ("length", "4")):
    e = t.external_data.add(); e.key, e.value = k, v
onnx.save(m, a.dst)
report()
''',
    "reject": '''
print("amp_pass: error: policy 'nope' does not exist", file=sys.stderr)
sys.exit(2)
''',
    "internal": '''
raise RuntimeError("walk: node has no producer")
''',
    # What a sandbox that hides the interpreter's site-packages gives (the worker has onnx.inliner): ampci's failure.
    "hidden_dependency": '''
raise ModuleNotFoundError("No module named 'onnx.inliner'")
''',
    # The pass's own import failing (a module of amp_pass, or one no interpreter has): the pass's failure.
    "own_import": '''
import amp_pass.no_such_module
''',
    "missing_dependency": '''
import no_such_dependency_anywhere
''',
    "hang": '''
time.sleep(600)
''',
    "memory": '''
blocks = [bytearray(256 * 2**20) for _ in range(64)]  # 16 GiB: beyond any RLIMIT_AS the test sets
''',
    "segfault": '''
import signal
os.kill(os.getpid(), signal.SIGSEGV)
''',
    "no_model": '''
report()
''',
    # Writes a type-inconsistent model: an fp32 MatMul input bound to an fp16 weight.
    "invalid": '''
import onnx
from onnx import TensorProto
m = onnx.load(a.src)
for t in m.graph.initializer:
    if t.data_type == TensorProto.FLOAT and len(t.dims) == 2:
        import numpy as np
        from onnx import numpy_helper
        t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float16), t.name))
        break
onnx.save(m, a.dst)
report()
''',
}


def fake_pass(root: Path, behaviour: str) -> Path:
    """Create ``root/amp_pass`` implementing ``behaviour``; return ``root`` (a pass root)."""
    pkg = root / "amp_pass"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text('"""Fake pass for tests."""\n')
    (pkg / "__main__.py").write_text(_ARGS + textwrap.dedent(BEHAVIOURS[behaviour]))
    return root


def write_manifest(path: Path, body: str) -> Path:
    """Write a zoo manifest with ``body`` (TOML) and return its path."""
    path.write_text(textwrap.dedent(body))
    return path
