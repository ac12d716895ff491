"""The lean IR bridge (amp_pass.protoio) against the onnx-ir serde reference path.

``convert_model`` reads the typed model with ``protoio.read_model`` and writes the pass's changes back
with ``protoio.write_model``; the reference path deserialises with ``onnx_ir.serde`` and serialises the
whole IR again.  Both must give the same model (nodes, attributes, initializers, graph I/O, value
types) and the same report, on graphs with If/Loop/Scan bodies too.
"""

from __future__ import annotations

import onnx
import onnx_ir as ir
import pytest
from onnx import AttributeProto, numpy_helper

from amp_pass import ConversionOptions, convert_model
from amp_pass.converter import AmpPass
from amp_pass.prepare import prepare_model
from amp_pass.protoio import read_model, supported
from amp_pass.protowrite import write_model
from tests.amp_pass import graphs as G

GRAPHS = {
    "loop_with_captured_weights": G.loop_with_captured_weights,
    "if_inside_loop": G.if_inside_loop,
    "if_inside_loop_disagree": lambda: G.if_inside_loop(True),
    "scan_model": G.scan_model,
    "conv_loop_if": G.conv_loop_if,
    "pinned_inputs": G.pinned_inputs,
    "out_of_range_constants": G.out_of_range_constants,
    "existing_casts": G.existing_casts,
    "with_function": G.with_function,
    "shared_input": G.shared_input,
    "large_constants": G.large_constants,
    "int_paths": G.int_paths,
}


def _tensor_key(t: onnx.TensorProto) -> tuple:
    return t.name, t.data_type, tuple(t.dims), numpy_helper.to_array(t).tobytes()


def _graph_key(g: onnx.GraphProto) -> tuple:
    """What the model means: nodes (with attributes and nested graphs), graph I/O, initializers, and the
    declared type of every other value (value_info restating an initializer is ignored)."""
    inits = {t.name for t in g.initializer}
    nodes = []
    for n in g.node:
        attrs = []
        for a in n.attribute:
            if a.type == AttributeProto.GRAPH:
                attrs.append((a.name, _graph_key(a.g)))
            elif a.type == AttributeProto.GRAPHS:
                attrs.append((a.name, tuple(_graph_key(s) for s in a.graphs)))
            elif a.type == AttributeProto.TENSOR:
                attrs.append((a.name, _tensor_key(a.t)))
            else:
                attrs.append((a.name, onnx.helper.get_attribute_value(a)))
        outputs = list(n.output)
        while outputs and not outputs[-1]:
            outputs.pop()
        nodes.append((n.op_type, "" if n.domain == "ai.onnx" else n.domain, n.name, tuple(n.input),
                      tuple(outputs), tuple(attrs)))
    infos = sorted((v.name, v.type.SerializeToString(deterministic=True)) for v in g.value_info
                   if v.name not in inits)
    io = tuple((v.name, v.type.SerializeToString(deterministic=True)) for v in list(g.input) + list(g.output))
    return g.name, tuple(nodes), io, tuple(_tensor_key(t) for t in g.initializer), tuple(infos)


def _reference(model: onnx.ModelProto, options: ConversionOptions) -> tuple[onnx.ModelProto, dict]:
    """The pass over an IR read and written by onnx_ir.serde (no protoio)."""
    prepared = prepare_model(model, options.check_input, options.opset_planner())
    assert prepared.origins is None
    report = AmpPass(options).call(prepared.model)
    report.functions_inlined += prepared.inlined
    if prepared.opset_in is not None:
        report.opset_in = prepared.opset_in
    report.notes.extend(prepared.notes)
    return ir.serde.serialize_model(prepared.model), report.to_dict()


def _without_seconds(d: dict) -> dict:
    return {k: v for k, v in d.items() if k != "seconds"}


@pytest.mark.parametrize("name", sorted(GRAPHS))
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("keep_io_types", [True, False])
def test_lean_path_matches_serde_path(name: str, dtype: str, keep_io_types: bool) -> None:
    model = GRAPHS[name]()
    options = ConversionOptions(dtype=dtype, keep_io_types=keep_io_types)
    result = convert_model(model, options)
    ref_model, ref_report = _reference(model, options)
    assert _graph_key(result.model.graph) == _graph_key(ref_model.graph)
    assert {(o.domain or "", o.version) for o in result.model.opset_import} == \
        {(o.domain or "", o.version) for o in ref_model.opset_import}
    assert _without_seconds(result.report.to_dict()) == _without_seconds(ref_report)
    onnx.checker.check_model(result.model, full_check=True)


@pytest.mark.parametrize("name", ["loop_with_captured_weights", "if_inside_loop", "scan_model", "conv_loop_if"])
def test_lean_path_is_idempotent(name: str) -> None:
    options = ConversionOptions(dtype="fp16")
    once = convert_model(GRAPHS[name](), options)
    twice = convert_model(once.model, options)
    assert twice.report.casts_inserted == 0 and twice.report.casts_removed == 0
    assert _graph_key(twice.model.graph) == _graph_key(once.model.graph)


@pytest.mark.parametrize("name", ["loop_with_captured_weights", "if_inside_loop", "scan_model", "conv_loop_if"])
def test_read_then_write_unchanged_is_the_source(name: str) -> None:
    """Nothing changed: every graph (subgraphs included) is written back as read, and the IR has the
    same structure as onnx_ir.serde's (values shared across scopes, uses, nested graphs)."""
    model = onnx.shape_inference.infer_shapes(GRAPHS[name]())
    assert supported(model)
    ir_model, origins = read_model(model)
    out = write_model(ir_model, origins)
    assert _graph_key(out.graph) == _graph_key(model.graph)
    ref = ir.serde.deserialize_model(model)

    def shape(g: ir.Graph) -> list:
        rows = []
        for node in g:
            rows.append((node.op_type, [v.name if v is not None else None for v in node.inputs],
                         [(v.name, v.dtype, len(v.uses())) for v in node.outputs],
                         [shape(a.value) for a in node.attributes.values() if a.type is ir.AttributeType.GRAPH]))
        return rows

    assert shape(ir_model.graph) == shape(ref.graph)


def test_source_protos_are_not_modified() -> None:
    model = G.conv_loop_if()
    before = model.SerializeToString(deterministic=True)
    result = convert_model(model, ConversionOptions(dtype="fp16", keep_io_types=False))
    assert result.report.nodes_low > 0
    assert model.SerializeToString(deterministic=True) == before


def test_new_cast_outputs_carry_the_shape_of_their_source() -> None:
    checked = 0
    for make in GRAPHS.values():
        out = convert_model(make(), ConversionOptions(dtype="fp16")).model
        g = out.graph
        infos = {v.name: v for v in list(g.input) + list(g.output) + list(g.value_info)}
        for n in g.node:
            if n.op_type == "Cast" and n.output[0] in infos and n.input[0] in infos:
                src, dst = infos[n.input[0]].type.tensor_type, infos[n.output[0]].type.tensor_type
                assert dst.shape == src.shape, n.name
                assert dst.elem_type == next(a.i for a in n.attribute if a.name == "to")
                checked += 1
    assert checked > 0


def test_batched_range_check_agrees_with_one_by_one() -> None:
    """ranges.convert_clean returns exactly check_and_convert's conversion for clean arrays, None for the
    others (overflow, inf/nan, values flushed to zero), whatever their neighbours in the batch."""
    import numpy as np

    from amp_pass.ranges import check_and_convert, convert_clean

    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in [(1,), (3, 4), (17,), (2, 2, 2)]]
    arrays += [np.array([1e6, 1.0], np.float32), np.array([np.inf, 1.0], np.float32),
               np.array([np.nan], np.float32), np.full((8,), 1e-9, np.float32), np.array([0.0, -0.0], np.float32),
               np.array([1e-9, 1.0, 2.0], np.float32), np.array([3e38], np.float32)]
    for low in (ir.DataType.FLOAT16, ir.DataType.BFLOAT16):
        for order in (arrays, arrays[::-1]):
            for a, got in zip(order, convert_clean(order, low), strict=True):
                problem, expected = check_and_convert(a, low, "x")
                fast = expected is not None and np.all(np.isfinite(a)) and \
                    np.count_nonzero(a) == np.count_nonzero(expected.view(np.uint16) & 0x7FFF)
                assert (got is not None) == bool(fast)  # the others are left to check_and_convert
                if got is not None:
                    assert problem is None and expected is not None
                    assert got.dtype == expected.dtype and got.shape == expected.shape
                    assert got.tobytes() == expected.tobytes()


def _convert_with_ir(model: onnx.ModelProto, options: ConversionOptions, skip_opaque: bool
                     ) -> tuple[onnx.ModelProto, dict, int]:
    prepared = prepare_model(model, options.check_input, options.opset_planner(), lean=True, shapes=False,
                             skip_opaque=skip_opaque)
    origins = prepared.origins
    assert origins is not None
    report = AmpPass(options).call(prepared.model, origins.reserved)
    report.nodes_total += origins.opaque_count
    return write_model(prepared.model, origins), _without_seconds(report.to_dict()), origins.opaque_count


@pytest.mark.parametrize("name", sorted(GRAPHS))
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("keep_io_types", [True, False])
def test_leaving_int_nodes_out_of_the_ir_changes_nothing(name: str, dtype: str, keep_io_types: bool) -> None:
    """``skip_opaque`` (the IR without the nodes the pass cannot change) gives the same model, node order
    included, and the same report as the IR of every node."""
    model = GRAPHS[name]()
    options = ConversionOptions(dtype=dtype, keep_io_types=keep_io_types)
    full, full_report, none_left_out = _convert_with_ir(model, options, False)
    lean, lean_report, left_out = _convert_with_ir(model, options, True)
    assert none_left_out == 0
    if name == "int_paths":
        assert left_out >= 10  # in the main graph and in the If and Loop bodies
    assert _graph_key(lean.graph) == _graph_key(full.graph)
    assert lean_report == full_report
    onnx.checker.check_model(lean, full_check=True)


@pytest.mark.parametrize("name", ["silero_vad", "ppocr_v4_rec"])
def test_leaving_int_nodes_out_on_real_models(name: str, real_model_path) -> None:  # noqa: ANN001 - fixture
    model = onnx.load(str(real_model_path(name)))
    for dtype in ("fp16", "bf16"):
        options = ConversionOptions(dtype=dtype)
        full, full_report, _ = _convert_with_ir(model, options, False)
        lean, lean_report, left_out = _convert_with_ir(model, options, True)
        assert left_out > 0
        assert _graph_key(lean.graph) == _graph_key(full.graph)
        assert lean_report == full_report
