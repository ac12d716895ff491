"""Old-IR models: initializers also listed as graph inputs (IR 3 requires it; older exporters did it at
later IR versions too) are constants by default, so such a model gets the casts of its IR>=4 twin.

Every conversion goes through the ``convert`` fixture: full checker, onnxruntime load (bf16 through the
emulation), idempotence, input left untouched.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from amp_pass import ConversionOptions, convert_model
from amp_pass.prepare import prepare_model
from amp_pass.protowrite import write_model
from tests.amp_pass.models import cosine, emulated_cosines, proto_graphs, random_feeds, run_fp32

ROOT = Path(__file__).resolve().parents[2]
LOW = {"fp16": T.FLOAT16, "bf16": T.BFLOAT16}


def _w(name: str, shape: tuple[int, ...], seed: int, scale: float = 0.3) -> onnx.TensorProto:
    rng = np.random.default_rng(seed)
    return nh.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def _as_inputs(g: onnx.GraphProto) -> None:
    """List every initializer of ``g`` as a graph input too (after the real inputs), as IR 3 requires."""
    g.input.extend(h.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in g.initializer)


def conv_net(ir_version: int = 3) -> onnx.ModelProto:
    """Conv -> BatchNormalization -> Relu -> Conv -> GlobalAveragePool -> Flatten -> Gemm, opset 9; at
    ``ir_version`` 3 every initializer is also a graph input."""
    inits = [_w("W1", (4, 3, 3, 3), 1), _w("B1", (4,), 2), nh.from_array(np.full(4, 1.2, np.float32), "S"),
             _w("Bb", (4,), 3), _w("M", (4,), 4, 0.1), nh.from_array(np.full(4, 0.8, np.float32), "V"),
             _w("W2", (4, 4, 1, 1), 5), _w("Wf", (5, 4), 6), _w("Bf", (5,), 7)]
    g = h.make_graph(
        [h.make_node("Conv", ["X", "W1", "B1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
         h.make_node("BatchNormalization", ["c1", "S", "Bb", "M", "V"], ["bn"], name="bn"),
         h.make_node("Relu", ["bn"], ["r"], name="relu"),
         h.make_node("Conv", ["r", "W2"], ["c2"], name="conv2"),
         h.make_node("GlobalAveragePool", ["c2"], ["p"], name="gap"),
         h.make_node("Flatten", ["p"], ["f"], name="flatten"),
         h.make_node("Gemm", ["f", "Wf", "Bf"], ["Y"], transB=1, name="fc")],
        "conv_net", [h.make_tensor_value_info("X", T.FLOAT, [1, 3, 8, 8])],
        [h.make_tensor_value_info("Y", T.FLOAT, [1, 5])], inits)
    if ir_version <= 3:
        _as_inputs(g)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 9)], ir_version=ir_version)
    onnx.checker.check_model(m, full_check=True)
    return m


def loop_net(ir_version: int = 3) -> onnx.ModelProto:
    """A Loop whose body multiplies its state by the outer weight W (read by name), opset 9."""
    body = h.make_graph(
        [h.make_node("MatMul", ["h_in", "W"], ["mm"], name="body_mm"),
         h.make_node("Add", ["mm", "B"], ["add"], name="body_add"),
         h.make_node("Tanh", ["add"], ["h_out"], name="body_tanh"),
         h.make_node("Identity", ["cond_in"], ["cond_out"], name="body_cond")],
        "body", [h.make_tensor_value_info("i", T.INT64, []), h.make_tensor_value_info("cond_in", T.BOOL, []),
                 h.make_tensor_value_info("h_in", T.FLOAT, [2, 4])],
        [h.make_tensor_value_info("cond_out", T.BOOL, []), h.make_tensor_value_info("h_out", T.FLOAT, [2, 4])])
    g = h.make_graph(
        [h.make_node("MatMul", ["X", "W"], ["x0"], name="pre_mm"),
         h.make_node("Loop", ["trips", "", "x0"], ["Y"], body=body, name="loop")],
        "loop_net", [h.make_tensor_value_info("X", T.FLOAT, [2, 4])], [h.make_tensor_value_info("Y", T.FLOAT, [2, 4])],
        [_w("W", (4, 4), 8, 0.5), _w("B", (4,), 9, 0.1), nh.from_array(np.array(3, np.int64), "trips")])
    if ir_version <= 3:
        _as_inputs(g)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 9)], ir_version=ir_version)
    onnx.checker.check_model(m, full_check=True)
    return m


NETS = {"conv_net": conv_net, "loop_net": loop_net}


def _casts(m: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for g in proto_graphs(m.graph) for n in g.node if n.op_type == "Cast"]


def _weight_casts(original: onnx.ModelProto, m: onnx.ModelProto) -> list[str]:
    """Casts (anywhere) reading one of ``original``'s initializers."""
    weights = {t.name for t in original.graph.initializer}
    return [n.name for n in _casts(m) if n.input[0] in weights]


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("net", sorted(NETS))
def test_ir3_weights_are_constants_like_the_ir4_twin(convert, dtype: str, net: str) -> None:
    old, twin = NETS[net](3), NETS[net](4)
    r, t = convert(old, dtype), convert(twin, dtype)
    out = r.model
    assert [i.name for i in out.graph.input] == ["X"] and out.ir_version >= 4
    assert _weight_casts(old, out) == []
    assert len(_casts(out)) == len(_casts(t.model)) and r.report.casts_inserted == t.report.casts_inserted
    d, dt = r.report.to_dict(), t.report.to_dict()
    assert (d["compute_low"], d["constants_folded"]) == (dt["compute_low"], dt["constants_folded"])
    assert d["compute_low"] == d["compute_nodes"] > 0
    n = len(old.graph.initializer)
    ir_note = "; IR version 3 -> 4 (IR 3 requires every initializer to be a graph input)" if dtype == "fp16" else ""
    assert d["notes"][-1].startswith(f"{n} initializer(s) also listed as graph inputs (")
    assert d["notes"][-1].endswith(f"(keep_initializer_inputs / --keep-initializer-inputs keeps them){ir_note}")
    assert dt["notes"] == []
    feeds = random_feeds(twin)
    if dtype == "fp16":  # onnxruntime runs fp16 as it is
        import onnxruntime as ort

        sess = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"])
        got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True))
        ref = run_fp32(old, feeds)
        assert cosine(ref["Y"], got["Y"]) >= 0.999
        assert np.allclose(ref["Y"], got["Y"].astype(np.float32), atol=2e-2, rtol=2e-2)
    else:
        cos = emulated_cosines(old, out, feeds)
        assert cos and min(cos.values()) >= 0.99, cos


@pytest.mark.parametrize("net", sorted(NETS))
def test_keep_initializer_inputs_keeps_them_feedable(convert, net: str) -> None:
    old = NETS[net](3)
    r = convert(old, "fp16", keep_initializer_inputs=True)
    out = r.model
    assert out.ir_version == 3
    assert [i.name for i in out.graph.input] == [i.name for i in old.graph.input]
    assert {t.name for t in out.graph.initializer} == {t.name for t in old.graph.initializer}
    float_weights = {t.name for t in old.graph.initializer if t.data_type == T.FLOAT}
    weights = {t.name for t in old.graph.initializer}
    assert {n.input[0] for n in _casts(out) if n.input[0] in weights} == float_weights  # each cast at run time
    assert not any("initializer(s) also listed" in note for note in r.report.notes)


def test_ir4_initializer_inputs_are_constants_too(convert) -> None:
    """An IR 8 model that lists its weight as an (overridable) input: a constant by default, IR kept."""
    m = loop_net(8)
    _as_inputs(m.graph)
    r = convert(m, "fp16")
    assert [i.name for i in r.model.graph.input] == ["X"] and r.model.ir_version == 8
    assert _weight_casts(m, r.model) == [] and r.report.notes[-1].endswith("keeps them)")
    kept = convert(m, "fp16", keep_initializer_inputs=True)
    assert [i.name for i in kept.model.graph.input] == ["X", "W", "B", "trips"]


@pytest.mark.parametrize("net", sorted(NETS))
def test_both_ir_readers_agree(net: str) -> None:
    """``prepare_model`` through protoio (lean) and through onnx_ir.serde (what workers/measure/autosearch.py
    uses) makes the same inputs constants, or keeps the same ones."""
    m = NETS[net](3)
    weights = [t.name for t in m.graph.initializer]
    for keep in (False, True):
        got = []
        for lean in (True, False):
            p = prepare_model(m, lean=lean, keep_initializer_inputs=keep)
            out = write_model(p.model, p.origins) if p.origins is not None else ir.serde.serialize_model(p.model)
            onnx.checker.check_model(out, full_check=True)
            got.append(([v.name for v in p.model.graph.inputs], sorted(p.model.graph.initializers),
                        p.model.ir_version, out.ir_version, p.notes))
        assert got[0] == got[1]
        inputs, inits, ir_version, _, notes = got[0]
        assert inits == sorted(weights)
        assert (inputs, ir_version, len(notes)) == ((["X", *weights], 3, 0) if keep else (["X"], 4, 1))


def test_cli_keep_initializer_inputs(tmp_path: Path) -> None:
    src, dst, kept = tmp_path / "ir3.onnx", tmp_path / "out.onnx", tmp_path / "kept.onnx"
    onnx.save(conv_net(3), str(src))
    stdout = []
    for out, extra in ((dst, []), (kept, ["--keep-initializer-inputs"])):
        proc = subprocess.run([sys.executable, "-m", "amp_pass", "convert", str(src), "-o", str(out), *extra],
                              cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        stdout.append(proc.stdout)
    assert [i.name for i in onnx.load(str(dst)).graph.input] == ["X"]
    assert "note: 9 initializer(s) also listed as graph inputs (W1, B1, S, ...)" in stdout[0]
    assert len(onnx.load(str(kept)).graph.input) == 1 + len(conv_net(3).graph.initializer)
    assert "initializer(s) also listed" not in stdout[1]


def test_densenet121_at_ir3_gets_the_casts_of_its_twin() -> None:
    """The issue's model: DenseNet-121 (onnx's light topology, seeded weights) with every weight also a
    graph input at IR 3 got 850 Casts for 910 nodes; it now gets its IR-4 twin's."""
    from tests.amp_pass.models import light_model

    twin = light_model("light_densenet121")
    old = onnx.ModelProto()
    old.CopyFrom(twin)
    _as_inputs(old.graph)
    old.ir_version = 3
    onnx.checker.check_model(old)
    options = ConversionOptions(dtype="fp16")
    got, want = convert_model(old, options).model, convert_model(twin, options).model
    onnx.checker.check_model(got, full_check=True)
    assert _weight_casts(old, got) == [] and len(_casts(got)) == len(_casts(want)) < 300
    assert [i.name for i in got.graph.input] == [i.name for i in twin.graph.input]
    kept = convert_model(old, ConversionOptions(dtype="fp16", keep_initializer_inputs=True)).model
    assert len(_casts(kept)) > 800  # what every conversion did before
