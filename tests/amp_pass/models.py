"""Test utilities for the pass (no amp_pass imports): light models with real weights, feeds, checks.

``light_model(name)`` loads a topology shipped in ``onnx/backend/test/data/light`` and replaces its
ConstantOfShape placeholder weights by seeded random weights of the same shapes (He-scaled for conv /
gemm weights, positive variances and near-one scales for normalisations), so numerics mean something.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

LIGHT_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
#: Range of BatchNormalization / channel-scale gammas.  Randomly initialised deep networks amplify any
#: perturbation (fp16 rounding included) through their residual sums far more than trained ones do;
#: small gammas keep each residual branch small next to its shortcut, as trained ResNets do
#: (and as "zero-init the last gamma" training recipes start from).
SCALE_LOW, SCALE_HIGH = 0.1, 0.3
FLOAT_OUT = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16}


def proto_graphs(g: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``g`` then every If/Loop/Scan body nested in it, depth first (protobuf, no IR)."""
    yield g
    for n in g.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from proto_graphs(a.g)
            for sub in a.graphs:
                yield from proto_graphs(sub)


def light_names() -> list[str]:
    """Names (``light_resnet50``...) of the light topologies shipped in the installed onnx package."""
    return sorted(p.stem for p in LIGHT_DIR.glob("light_*.onnx"))


def _weight(shape: tuple[int, ...], role: str, rng: np.random.Generator) -> np.ndarray:
    if role == "var":  # replaced by measured statistics in _calibrate_batchnorm
        return rng.uniform(0.5, 1.5, shape).astype(np.float32)
    if role == "scale":
        return rng.uniform(SCALE_LOW, SCALE_HIGH, shape).astype(np.float32)
    if len(shape) >= 2:
        fan_in = int(np.prod(shape[1:]))
        return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)
    return (rng.standard_normal(shape) * 0.05).astype(np.float32)


def light_model(name: str, seed: int = 0) -> onnx.ModelProto:
    """The light topology ``name`` with seeded random weights as initializers (not graph inputs)."""
    model = onnx.load(str(LIGHT_DIR / f"{name}.onnx"))
    g = model.graph
    rng = np.random.default_rng(seed)
    inits = {t.name: t for t in g.initializer}
    roles: dict[str, str] = {}
    for node in g.node:
        if node.op_type == "BatchNormalization":
            for i, v in enumerate(node.input):
                roles[v] = {1: "scale", 4: "var"}.get(i, "bias")
        if node.op_type == "Unsqueeze":  # densenet's scale path: Unsqueeze -> Mul
            consumers = [n for n in g.node if node.output[0] in n.input]
            if any(c.op_type == "Mul" for c in consumers):
                roles[node.input[0]] = "scale"
    keep = []
    new_inits = []
    for node in g.node:
        if node.op_type == "ConstantOfShape" and node.input[0] in inits:
            shape = tuple(int(d) for d in numpy_helper.to_array(inits[node.input[0]]))
            arr = _weight(shape, roles.get(node.output[0], "w"), rng)
            new_inits.append(numpy_helper.from_array(arr, node.output[0]))
        else:
            keep.append(node)
    for t in g.initializer:
        if t.data_type == TensorProto.FLOAT and roles.get(t.name) in ("var", "scale"):
            arr = _weight(tuple(t.dims), roles[t.name], rng)
            t.CopyFrom(numpy_helper.from_array(arr, t.name))
    used = {i for n in keep for i in n.input}
    kept_inits = [t for t in g.initializer if t.name in used] + new_inits
    init_names = {t.name for t in kept_inits}
    inputs = [i for i in g.input if i.name not in init_names and i.name in used]
    del g.node[:]
    g.node.extend(keep)
    del g.initializer[:]
    g.initializer.extend(kept_inits)
    del g.input[:]
    g.input.extend(inputs)
    model.ir_version = max(model.ir_version, 4)
    _calibrate_batchnorm(model, random_feeds(model, seed))
    _expose_logits(model)
    return model


#: Name prefix of the extra output added by ``_expose_logits``.
LOGITS = "logits:"


def _expose_logits(model: onnx.ModelProto) -> None:
    """Add the input of a final Softmax as an extra output (probabilities of random nets hide errors).

    The extra output is recorded in ``model.metadata_props`` under ``LOGITS + name``.
    """
    outs = {o.name for o in model.graph.output}
    for n in model.graph.node:
        if n.op_type == "Softmax" and n.output[0] in outs and n.input[0] not in outs:
            inferred = onnx.shape_inference.infer_shapes(model)
            vi = [v for v in inferred.graph.value_info if v.name == n.input[0]]
            if vi:
                model.graph.output.append(vi[0])
                model.metadata_props.add(key=LOGITS + n.input[0], value="pre-softmax logits")


def _calibrate_batchnorm(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    """Set every BatchNormalization's running mean/var to the statistics of its actual input.

    Random weights make activations grow without bound; a trained network's BN statistics keep them
    normalised.  One probe run computes them exactly: each BN is replaced by a normalisation with the
    per-channel statistics of its input (what the inference BN then reproduces), exposed as outputs.
    """
    from onnx import helper as h

    bns = [n for n in model.graph.node if n.op_type == "BatchNormalization"]
    if not bns:
        return
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    nodes: list[onnx.NodeProto] = []
    outputs: list[str] = []
    eps = 1e-3
    probe.graph.initializer.append(numpy_helper.from_array(np.array(eps, np.float32), "__calib_eps"))
    for k, n in enumerate(probe.graph.node):
        if n.op_type != "BatchNormalization":
            nodes.append(n)
            continue
        x, scale, bias = n.input[0], n.input[1], n.input[2]
        p = f"__calib{k}_"
        nodes += [
            h.make_node("ReduceMean", [x], [p + "mean"], axes=[0, 2, 3], keepdims=1),
            h.make_node("Sub", [x, p + "mean"], [p + "d"]),
            h.make_node("Mul", [p + "d", p + "d"], [p + "d2"]),
            h.make_node("ReduceMean", [p + "d2"], [p + "var"], axes=[0, 2, 3], keepdims=1),
            h.make_node("Add", [p + "var", "__calib_eps"], [p + "ve"]),
            h.make_node("Sqrt", [p + "ve"], [p + "std"]),
            h.make_node("Div", [p + "d", p + "std"], [p + "xn"]),
            h.make_node("Unsqueeze", [scale], [p + "s"], axes=[1, 2]),
            h.make_node("Unsqueeze", [bias], [p + "b"], axes=[1, 2]),
            h.make_node("Mul", [p + "xn", p + "s"], [p + "y"]),
            h.make_node("Add", [p + "y", p + "b"], [n.output[0]]),
        ]
        outputs += [p + "mean", p + "var"]
    del probe.graph.node[:]
    probe.graph.node.extend(nodes)
    del probe.graph.output[:]
    probe.graph.output.extend(h.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs)
    stats = run_fp32(probe, feeds)
    inits = {t.name: t for t in model.graph.initializer}
    for k, n in enumerate(model.graph.node):
        if n.op_type == "BatchNormalization":
            p = f"__calib{k}_"
            for idx, arr in ((3, stats[p + "mean"].ravel()), (4, stats[p + "var"].ravel() + eps)):
                t = inits[n.input[idx]]
                t.CopyFrom(numpy_helper.from_array(arr.astype(np.float32), t.name))


def random_feeds(model: onnx.ModelProto, seed: int = 0, dims: dict[str, list[int]] | None = None,
                 ints: dict[str, int] | None = None) -> dict[str, np.ndarray]:
    """Seeded feeds for every graph input (symbolic dims from ``dims`` or 1; ints from ``ints``)."""
    rng = np.random.default_rng(seed)
    init = {t.name for t in model.graph.initializer}
    feeds: dict[str, np.ndarray] = {}
    for inp in model.graph.input:
        if inp.name in init:
            continue
        tt = inp.type.tensor_type
        shape = (dims or {}).get(inp.name) or [d.dim_value if d.dim_value > 0 else 1 for d in tt.shape.dim]
        np_type = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if np.issubdtype(np_type, np.floating):
            feeds[inp.name] = rng.uniform(-1, 1, shape).astype(np.float32)
        else:
            feeds[inp.name] = np.full(shape, (ints or {}).get(inp.name, 1), dtype=np_type)
    return feeds


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two arrays (1.0 when both are all zero; 0.0 when either is not finite)."""
    a64, b64 = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    if not (np.all(np.isfinite(a64)) and np.all(np.isfinite(b64))):
        return 0.0
    na, nb = np.linalg.norm(a64), np.linalg.norm(b64)
    if na == 0 and nb == 0:
        return 1.0
    if na == 0 or nb == 0:
        return 0.0
    return float(np.dot(a64, b64) / (na * nb))


def run_fp32(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Reference outputs of an fp32 model on the onnxruntime CPU provider."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds), strict=True))


def assert_valid(model: onnx.ModelProto, dtype: str) -> None:
    """Full ONNX checker, then an onnxruntime CPU session (fp16), or of the emulated model (bf16).

    onnxruntime's CPU provider has no bf16 kernels for most ops (MatMul, Add...), so a bf16 model can
    only be loaded there through its emulation; fp16 models are loaded as they are.
    """
    import onnxruntime as ort

    onnx.checker.check_model(model, full_check=True)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if dtype == "bf16":
        from workers.measure.emulation_rewrite import emulate_model

        model = emulate_model(model)
        # the emulation is run with graph optimizations off (workers.measure.emulation.EmulatedSession): its
        # round-trip casts must all run; ORT's fusions (LayerNormFusion) also mis-type its Cast chains
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def emulated_cosines(fp32: onnx.ModelProto, converted: onnx.ModelProto,
                     feeds: dict[str, np.ndarray]) -> dict[str, float]:
    """Cosine per float output between the fp32 reference and the faithful emulation of ``converted``."""
    from workers.measure.emulation import run_emulated

    ref = run_fp32(fp32, feeds)
    got = run_emulated(converted, feeds)
    floats = {o.name for o in fp32.graph.output if o.type.tensor_type.elem_type in FLOAT_OUT}
    return {name: cosine(ref[name], got[name]) for name in ref if name in floats}
