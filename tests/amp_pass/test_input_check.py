"""The input check agrees with the ONNX checker, on mutated test graphs.

``convert_model`` checks a weight-less skeleton of the model (see amp_pass/prepare.py) plus what the
skeleton hides.  Properties, on seeded random mutations of the synthetic graphs: a model the basic
checker rejects is rejected (InvalidModelError, never another exception); a model rejected is one the
full checker rejects too; an accepted model converts to one the full checker accepts.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import numpy_helper as nh

from amp_pass import ConversionOptions, convert_model
from amp_pass.errors import InvalidModelError
from tests.amp_pass import graphs as G
from tests.amp_pass.models import proto_graphs

BASES = ["loop_with_captured_weights", "if_inside_loop", "scan_model", "pinned_inputs", "out_of_range_constants",
         "existing_casts", "with_function", "shared_input", "conv_loop_if", "large_constants", "ir3_model"]


@pytest.mark.parametrize(("elements", "dtype", "reader"), [
    (6, np.int64, "Gather"),  # small: sized up front
    (300_000, np.float32, "MatMul"),  # large, read by the pass: sized when read
    (200_000, np.int64, "Gather"),  # large, never read by the pass: sized when written back
    (300_000, np.float32, "ReduceSum"),  # large float feeding only a DENY node: never read either
])
def test_short_tensor_data_is_reported(elements: int, dtype: type, reader: str) -> None:
    """An initializer with less raw data than its dims call for: one line, naming it, whether it is
    small (checked up front), large and read by the pass, or large and never read."""
    from onnx import helper as h

    from amp_pass.prepare import SIZE_CHECK_BYTES

    t = nh.from_array(np.ones(elements, dtype), "table")
    t.raw_data = t.raw_data[:-8]
    assert (np.dtype(dtype).itemsize * elements > SIZE_CHECK_BYTES) == (elements > 6)
    inputs = [h.make_tensor_value_info("X", TensorProto.FLOAT, [2])]
    out = 2
    if reader == "Gather":
        nodes = [h.make_node("Gather", ["table", "I"], ["g"]), h.make_node("Cast", ["g"], ["c"], to=TensorProto.FLOAT),
                 h.make_node("Mul", ["X", "c"], ["Y"])]
        inputs.append(h.make_tensor_value_info("I", TensorProto.INT64, [2]))
    elif reader == "MatMul":
        nodes = [h.make_node("Reshape", ["table", "shape"], ["w"]), h.make_node("MatMul", ["X", "w"], ["Y"])]
        out = elements // 2
    else:
        nodes = [h.make_node("ReduceSum", ["table"], ["s"], keepdims=1), h.make_node("Mul", ["X", "s"], ["Y"])]
    inits = [t, nh.from_array(np.array([2, elements // 2], np.int64), "shape")]
    g = h.make_graph(nodes, "main", inputs, [h.make_tensor_value_info("Y", TensorProto.FLOAT, [out])], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
    assert not _accepts(m, full=False)
    with pytest.raises(InvalidModelError, match="table") as err:
        convert_model(m, ConversionOptions())
    assert "\n" not in str(err.value)
    m.graph.initializer[0].raw_data = nh.from_array(np.ones(elements, dtype)).raw_data  # whole data: converts
    onnx.checker.check_model(convert_model(m, ConversionOptions()).model, full_check=True)


def _move_node(g: onnx.GraphProto, rng: random.Random) -> bool:
    """Move a random node of ``g`` to a random place (False when ``g`` has fewer than two nodes)."""
    nodes = list(g.node)
    if len(nodes) < 2:
        return False
    n = nodes.pop(rng.randrange(len(nodes)))
    nodes.insert(rng.randrange(len(nodes) + 1), n)
    del g.node[:]
    g.node.extend(nodes)
    return True


def _mutate(m: onnx.ModelProto, rng: random.Random) -> str | None:
    """One random corruption of ``m`` (in place); its name, or None when it did not apply."""
    g = m.graph
    nodes = list(g.node)
    k = rng.randrange(13)
    if k == 0 and _move_node(g, rng):
        return "move node"
    if k == 1 and (n := rng.choice(nodes)).input:
        n.input[rng.randrange(len(n.input))] = "undefined_value"
        return "undefined input"
    if k == 2 and len(nodes) > 1 and (pair := rng.sample(nodes, 2))[0].output and pair[1].output:
        pair[1].output[0] = pair[0].output[0]
        return "duplicate output"
    if k == 3:
        m.ir_version = 3
        return "ir 3"
    if k == 4 and g.input:
        del g.input[rng.randrange(len(g.input))]
        return "drop input"
    if k == 5 and g.initializer:
        del g.initializer[rng.randrange(len(g.initializer))]
        return "drop initializer"
    if k == 6 and g.initializer:
        g.initializer.append(g.initializer[rng.randrange(len(g.initializer))])
        return "duplicate initializer"
    if k == 7:
        rng.choice(nodes).op_type = "NoSuchOp"
        return "unknown op"
    if k == 8 and (casts := [n for n in nodes if n.op_type == "Cast"]):
        casts[0].attribute[0].i = 999
        return "bad cast"
    if k == 9 and g.value_info:
        g.value_info[rng.randrange(len(g.value_info))].type.tensor_type.elem_type = TensorProto.INT32
        return "mistyped value_info"
    if k == 10 and g.output:
        g.output[rng.randrange(len(g.output))].type.tensor_type.elem_type = TensorProto.DOUBLE
        return "mistyped output"
    if k == 11 and g.initializer and (t := g.initializer[rng.randrange(len(g.initializer))]).raw_data:
        t.raw_data = t.raw_data[:-1]
        return "short initializer"
    if k == 12 and (consts := [n for n in nodes if n.op_type == "Constant" and n.attribute[0].t.raw_data]):
        t = consts[rng.randrange(len(consts))].attribute[0].t
        t.raw_data = t.raw_data[:-1]
        return "short Constant"
    return None


def _mutate_subgraph(m: onnx.ModelProto, rng: random.Random) -> str | None:
    """One random corruption inside a nested graph of ``m`` (or of its opset); None when it did not apply."""
    graphs = list(proto_graphs(m.graph))[1:]
    if not graphs:
        return None
    g = rng.choice(graphs)
    nodes = list(g.node)
    k = rng.randrange(9)
    if k == 0 and _move_node(g, rng):
        return "subgraph: move node"
    if k == 1 and nodes and (n := rng.choice(nodes)).input:
        outer = [v.name for v in m.graph.input] + [o for x in m.graph.node for o in x.output]
        n.input[rng.randrange(len(n.input))] = rng.choice(["undefined_value", *outer])
        return "subgraph: rewire input"
    if k == 2 and g.output:
        g.output[rng.randrange(len(g.output))].type.tensor_type.elem_type = rng.choice(
            [TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.INT64])
        return "subgraph: output type"
    if k == 3 and g.input:
        g.input[rng.randrange(len(g.input))].type.tensor_type.elem_type = rng.choice(
            [TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.INT64])
        return "subgraph: input type"
    if k == 4 and g.output:
        del g.output[rng.randrange(len(g.output))]
        return "subgraph: drop output"
    if k == 5 and g.input:
        del g.input[rng.randrange(len(g.input))]
        return "subgraph: drop input"
    if k == 6 and nodes:
        rng.choice(nodes).op_type = rng.choice(["Relu", "Exp", "Identity", "MatMul", "Cast"])
        return "subgraph: swap op"
    if k == 7:
        m.opset_import[0].version = rng.choice([9, 11, 13, 16, 18, 21])
        return "opset"
    if k == 8 and nodes and (n := rng.choice(nodes)).attribute:
        del n.attribute[rng.randrange(len(n.attribute))]
        return "subgraph: drop attribute"
    return None


def _accepts(model: onnx.ModelProto, full: bool) -> bool:
    try:
        onnx.checker.check_model(model, full_check=full)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError, ValueError):
        return False
    return True


def _typed(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with the value types ONNX infers written in (non-strict)."""
    try:
        return onnx.shape_inference.infer_shapes(model)
    except (onnx.shape_inference.InferenceError, ValueError):
        return model


@pytest.mark.parametrize(("seed", "mutate"), [(s, _mutate) for s in range(3)] + [(s, _mutate_subgraph) for s in range(3)])
def test_input_check_agrees_with_the_checker(seed: int, mutate: Callable[..., str | None]) -> None:
    rng = random.Random(seed)
    bases = {name: getattr(G, name)() for name in BASES}
    seen: set[str] = set()
    for _ in range(60):
        name = rng.choice(BASES)
        m = copy.deepcopy(bases[name])
        done = [x for x in (mutate(m, rng) for _ in range(rng.randrange(1, 3))) if x]
        if not done:
            continue
        seen.update(done)
        options = ConversionOptions(dtype=rng.choice(["fp16", "bf16"]), **rng.choice(
            [{}, {"keep_io_types": False}, {"policy": "aggressive"}, {"target": "cpu"}]))
        what = f"{name} {done} {options}"
        try:
            out = convert_model(m, options).model
        except InvalidModelError as exc:
            assert "\n" not in str(exc)
            assert not _accepts(m, full=True), f"{what}: rejected a valid model: {exc}"
            continue
        assert _accepts(m, full=False), f"{what}: accepted a model the checker rejects"
        # ONNX does not give subgraphs the shapes of outer-scope values unless the model declares them,
        # so some invalid inputs pass its full check; the output (which declares them) then does not.
        assert _accepts(out, full=True) or not _accepts(_typed(m), full=True), f"{what}: the output fails the checker"
    assert len(seen) >= 6  # the mutations really vary


@pytest.mark.parametrize("version", [13, 16, 18, 21])
def test_function_importing_another_opset_version(convert, version: int) -> None:
    """A local function written for opset 17 in a model of another opset where its ops have the same
    schemas (which the checker allows): inlined, converted, valid (onnx's inliner refuses any mismatch)."""
    m = G.with_function()
    m.opset_import[0].version = version
    onnx.checker.check_model(m, full_check=True)
    r = convert(m, "fp16")
    assert r.report.functions_inlined == 1 and not r.model.functions


def test_function_with_ops_that_changed_between_versions() -> None:
    """ReduceSum changed at opset 13 (axes became an input): a function at opset 11 in an opset-13 model
    is refused, as the checker refuses it, with one line."""
    from onnx import helper as h

    f = h.make_function("local", "SumRows", ["x"], ["y"],
                        [h.make_node("ReduceSum", ["x"], ["y"], axes=[1], keepdims=0)],
                        [h.make_opsetid("", 11)])
    g = h.make_graph([h.make_node("SumRows", ["X"], ["s"], domain="local"), h.make_node("Relu", ["s"], ["Y"])],
                     "main", [h.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3])],
                     [h.make_tensor_value_info("Y", TensorProto.FLOAT, [2])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 13), h.make_opsetid("local", 1)], ir_version=8,
                     functions=[f])
    assert not _accepts(m, full=False)
    with pytest.raises(InvalidModelError, match="not compatible with the version imported by model"):
        convert_model(m, ConversionOptions())
