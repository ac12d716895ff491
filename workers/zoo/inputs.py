"""Model inputs from a zoo entry's input spec, checked against the model's graph inputs.

:func:`make_feeds` is deterministic for (entry, seed, step) and raises :class:`SpecError` with a
precise message when the spec and the model disagree (names, rank, fixed dims, dtype).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping

import numpy as np
import onnx
from onnx import helper

from workers.zoo.manifest import InputSpec, ZooEntry


class SpecError(Exception):
    """A zoo entry's input spec does not match the model (job status ``bad_spec``)."""

    exit_code = 2


def model_inputs(model: onnx.ModelProto) -> dict[str, tuple[np.dtype, list[int | str | None]]]:
    """Real graph inputs (initializers excluded): name -> (numpy dtype, dims; str/None for symbolic)."""
    inits = {t.name for t in model.graph.initializer}
    out: dict[str, tuple[np.dtype, list[int | str | None]]] = {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type)) if tt.elem_type else np.dtype(np.float32)
        dims: list[int | str | None] = []
        for d in tt.shape.dim:
            dims.append(d.dim_value if d.HasField("dim_value") else (d.dim_param or None))
        out[vi.name] = (dtype, dims)
    return out


def check_spec(entry: ZooEntry, model: onnx.ModelProto) -> None:
    """Raise SpecError unless every model input has a spec with a compatible shape, and vice versa."""
    inputs = model_inputs(model)
    specs = {s.name: s for s in entry.inputs}
    missing = [n for n in inputs if n not in specs]
    extra = [n for n in specs if n not in inputs]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"model inputs without a spec: {', '.join(missing)}")
        if extra:
            parts.append(f"specs for inputs the model does not have: {', '.join(extra)}")
        raise SpecError(f"{entry.name}: {'; '.join(parts)} (model inputs: {', '.join(inputs) or 'none'})")
    for name, (dtype, dims) in inputs.items():
        spec = specs[name]
        if len(dims) and len(dims) != len(spec.shape):
            raise SpecError(f"{entry.name}: input {name!r} has rank {len(dims)} {dims} in the model, "
                            f"but the spec gives shape {list(spec.shape)}")
        for i, (d, s) in enumerate(zip(dims, spec.shape, strict=False)):
            if isinstance(d, int) and d > 0 and d != s:
                raise SpecError(f"{entry.name}: input {name!r} dim {i} is {d} in the model, spec says {s}")
        if np.dtype(spec.dtype) != dtype:
            raise SpecError(f"{entry.name}: input {name!r} is {dtype} in the model, spec says {spec.dtype}")


def _rng(seed: int, name: str, step: int) -> np.random.Generator:
    digest = hashlib.sha256(f"{seed}/{name}/{step}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def _one(entry: ZooEntry, spec: InputSpec, seed: int, step: int) -> np.ndarray:
    if spec.dist == "npz":  # read from a file each time (it may change); generated values are memoised
        return _generate(entry, spec, seed, step)
    return _generated(spec, seed, step if spec.per_step else 0).copy()


@functools.lru_cache(maxsize=256)
def _generated(spec: InputSpec, seed: int, step: int) -> np.ndarray:
    """Generated (non-npz) values depend only on the spec, seed and step: drawn once per process."""
    arr = _generate(None, spec, seed, step)
    arr.setflags(write=False)
    return arr


def _generate(entry: ZooEntry | None, spec: InputSpec, seed: int, step: int) -> np.ndarray:
    dtype = np.dtype(spec.dtype)
    shape = spec.shape
    if spec.dist == "npz":
        assert spec.npz is not None and entry is not None
        path = entry.base_dir / spec.npz
        try:
            with np.load(path) as data:
                arr = np.asarray(data[spec.name])
        except (OSError, KeyError, ValueError) as exc:
            raise SpecError(f"{entry.name}: cannot read input {spec.name!r} from {path}: {exc}") from None
        if tuple(arr.shape) != tuple(shape):
            raise SpecError(f"{entry.name}: {path} holds {spec.name!r} with shape {list(arr.shape)}, "
                            f"spec says {list(shape)}")
        return arr.astype(dtype)
    if spec.dist == "zeros":
        return np.zeros(shape, dtype)
    if spec.dist == "ones":
        return np.ones(shape, dtype)
    if spec.dist == "constant":
        return np.full(shape, spec.value).astype(dtype)
    rng = _rng(seed, spec.name, step if spec.per_step else 0)
    if spec.dist == "normal":
        arr = rng.standard_normal(shape) * spec.std + spec.mean
    elif spec.dist == "uniform":
        arr = rng.uniform(spec.low, spec.high, shape)
    else:  # randint
        arr = rng.integers(int(spec.low), int(spec.high), shape)
    return np.asarray(arr).astype(dtype)


def make_feeds(entry: ZooEntry, seed: int, step: int = 0, only: Mapping[str, object] | None = None,
               ) -> dict[str, np.ndarray]:
    """Inputs for one run (deterministic for entry, seed and step); ``only`` restricts the names."""
    return {s.name: _one(entry, s, seed, step) for s in entry.inputs if only is None or s.name in only}


def describe_values(spec: InputSpec) -> str:
    """How an input's values are made, in words (``normal(mean=0, std=1)``, ``npz FILE``, ...)."""
    if spec.dist == "npz":
        return f"npz {spec.npz}"
    if spec.dist == "normal":
        return f"normal(mean={spec.mean:g}, std={spec.std:g})"
    if spec.dist in ("uniform", "randint"):
        return f"{spec.dist}[{spec.low:g}, {spec.high:g})"
    if spec.dist == "constant":
        return f"constant {spec.value:g}"
    return spec.dist


def describe_inputs(entry: ZooEntry, seed: int) -> dict[str, dict[str, object]]:
    """What a job feeds the model, per input: ``shape``, ``dtype``, ``values`` (how they are made: see
    :func:`describe_values`; generated values are seeded by ``seed``) and ``note`` (where the spec came
    from: the zoo entry, the model's static dims, ``--input-shape``, the npz ...)."""
    out: dict[str, dict[str, object]] = {}
    for s in entry.inputs:
        values = describe_values(s)
        if s.dist in ("normal", "uniform", "randint"):
            values += f", seed {seed}"
        out[s.name] = {"shape": list(s.shape), "dtype": s.dtype, "values": values,
                       "note": s.note or f"zoo entry {entry.name} ({entry.origin})"}
    return out


def feeds_digest(feeds: Mapping[str, np.ndarray]) -> str:
    """A short content hash of the feeds (names, dtypes, shapes, bytes)."""
    h = hashlib.sha256()
    for name in sorted(feeds):
        arr = np.ascontiguousarray(feeds[name])
        h.update(f"{name}|{arr.dtype.str}|{arr.shape}|".encode())
        h.update(arr.tobytes())
    return h.hexdigest()[:16]
