"""Materialise the ``light_*`` models shipped in the onnx package into models with real weights.

Those files keep the real topology but build every weight with ``ConstantOfShape`` (all 0.02), so
their numerics are meaningless.  :func:`materialise` replaces each such placeholder by a seeded
random initializer of the same shape, chosen by the weight's role so activations stay O(1)
(He-normal conv/gemm weights, BatchNorm scale ~1, variance ~1, small biases), drops initializers
from the graph inputs and raises the IR version to 7.  The result is deterministic for a
(source file, seed) and cached.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from workers.zoo.registry import FetchError, verified_sha256

#: Bump when the materialisation rule changes, so old cached files are not reused.
MATERIALISE_VERSION = 1


def light_model_source(name: str) -> Path:
    """Path of ``onnx/backend/test/data/light/<name>.onnx`` in the installed onnx package."""
    path = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / f"{name}.onnx"
    if not path.is_file():
        available = sorted(p.stem for p in path.parent.glob("light_*.onnx"))
        raise FetchError(f"onnx package has no light model {name!r}; available: {', '.join(available)}")
    return path


def _weights(shape: tuple[int, ...], role: tuple[str, int] | None, rng: np.random.Generator) -> np.ndarray:
    op, idx = role or ("", -1)
    if op == "BatchNormalization":
        if idx == 1:   # scale
            return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        if idx == 4:   # variance
            return rng.uniform(0.8, 1.2, shape).astype(np.float32)
        return (0.05 * rng.standard_normal(shape)).astype(np.float32)  # bias, mean
    if op in ("Conv", "Gemm", "MatMul", "ConvTranspose") and idx == 1 and len(shape) >= 2:
        fan_in = int(np.prod(shape[1:])) if op != "MatMul" else int(shape[0])
        return (rng.standard_normal(shape) * np.sqrt(2.0 / max(fan_in, 1))).astype(np.float32)
    if op == "Mul":
        return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    return (0.05 * rng.standard_normal(shape)).astype(np.float32)


def materialise(model: onnx.ModelProto, seed: int) -> onnx.ModelProto:
    """Replace ``ConstantOfShape`` weight placeholders by seeded random initializers (see module doc)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    inits = {t.name: t for t in g.initializer}
    consumers: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for node in g.node:
        for i, name in enumerate(node.input):
            consumers[name].append((node.op_type, i))
    rng = np.random.default_rng(seed)
    kept, new_inits = [], []
    for node in g.node:
        if node.op_type == "ConstantOfShape" and node.input and node.input[0] in inits:
            shape = tuple(int(s) for s in numpy_helper.to_array(inits[node.input[0]]))
            role = consumers[node.output[0]][0] if consumers[node.output[0]] else None
            new_inits.append(numpy_helper.from_array(_weights(shape, role, rng), node.output[0]))
        else:
            kept.append(node)
    del g.node[:]
    g.node.extend(kept)
    g.initializer.extend(new_inits)
    used = {name for node in g.node for name in node.input} | {o.name for o in g.output}
    live = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(live)
    init_names = {t.name for t in live}
    real_inputs = [i for i in g.input if i.name not in init_names and i.name in used]
    del g.input[:]
    g.input.extend(real_inputs)
    m.ir_version = max(m.ir_version, 7)
    onnx.checker.check_model(m)
    return m


#: sha256 of the bytes this process materialised, by cache file: what a cached file must hash to.
_MADE: dict[Path, str] = {}


def materialised_light_model(name: str, source_sha256: str | None, seed: int, cache_dir: Path) -> tuple[Path, str]:
    """(path, sha256) of the cached materialised model for light model ``name`` (verified source).

    The cached file is checked on every call against the sha256 of the model as this process
    materialises it: the first call of a process materialises it in memory to learn that sha256 (the
    manifest only pins the source; a sha256 written next to the file in the cache could be rewritten with
    it), later calls hash the file only when it changed (:func:`verified_sha256`).  A file that differs is
    replaced atomically by the materialised model.
    """
    src = light_model_source(name)
    got = verified_sha256(src)
    if source_sha256 is not None and got != source_sha256:
        raise FetchError(f"checksum mismatch for {src} (installed onnx package): expected {source_sha256}, "
                         f"got {got}; update zoo.toml for this onnx version")
    dest = cache_dir / "materialised" / f"{got[:16]}-seed{seed}-v{MATERIALISE_VERSION}" / f"{name}.onnx"
    want = _MADE.get(dest)
    if want is not None and dest.exists() and verified_sha256(dest) == want:
        return dest, want
    data = materialise(onnx.load(src), seed).SerializeToString()
    want = _MADE[dest] = hashlib.sha256(data).hexdigest()
    if dest.exists() and verified_sha256(dest) == want:
        return dest, want
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, suffix=".part")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, dest)
    if verified_sha256(dest) != want:
        raise FetchError(f"materialised model {dest} does not hash to what was written ({want}); "
                         "something else is writing the cache")
    return dest, want
