"""The conversion-time rule's drift reference (issue 25): a fixed, conversion-shaped workload per model that
costs a few ms -- parse/walk/serialise passes in memory and one write, not one write per pass."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from workers.revision import convert
from workers.revision import timing_reference as tref
from workers.revision.timing_reference import REFERENCE_MAX_PASSES, reference_passes, reference_workload
from workers.zoo.synthetic import synthetic_model_path


def test_nodes_weigh_in_the_number_of_passes() -> None:
    """A model of many small nodes is not walked as often as its bytes alone would ask (ppocr_mobile_cls)."""
    size = tref.REFERENCE_BYTES // 16
    assert reference_passes(size, 0) == 16
    nodes = size // tref.REFERENCE_NODE_BYTES  # the nodes weigh what the bytes do: half the passes
    assert reference_passes(size, nodes) == 8 or reference_passes(size, nodes) == 9
    assert reference_passes(size, 10 * nodes) == 2
    assert reference_passes(1, 10**9) == 1  # at least one pass


def test_the_passes_cover_the_budget_in_bytes() -> None:
    assert reference_passes(tref.REFERENCE_BYTES) == 1
    assert reference_passes(tref.REFERENCE_BYTES // 4) == 4
    assert reference_passes(tref.REFERENCE_BYTES // 4 - 1) == 5  # rounded up: at least REFERENCE_BYTES
    assert reference_passes(6_000) == REFERENCE_MAX_PASSES  # a tiny model is capped
    assert reference_passes(10 * tref.REFERENCE_BYTES) == 1  # a large model: one pass


def test_the_workload_parses_each_pass_in_memory_and_writes_once(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    src, _ = synthetic_model_path("conv_net", 0, tmp_path / "cache")
    parses: list[int] = []
    writes: list[Path] = []
    real_load, real_write = onnx.load_model_from_string, Path.write_bytes

    def load(data: bytes) -> onnx.ModelProto:
        parses.append(len(data))
        return real_load(data)

    def write(self: Path, data: bytes) -> int:
        writes.append(self)
        return real_write(self, data)

    monkeypatch.setattr(onnx, "load_model_from_string", load)
    monkeypatch.setattr(Path, "write_bytes", write)
    scratch = tmp_path / "scratch.onnx"
    seconds = reference_workload(src, scratch)
    assert seconds > 0
    assert len(parses) == reference_passes(src.stat().st_size) > 1 and set(parses) == {src.stat().st_size}
    assert writes == [scratch]  # the file system is timed once per sample, as a conversion writes once
    assert real_load(scratch.read_bytes()) == real_load(src.read_bytes())  # the model, serialised back


def _model_with_weights_in_a_subgraph(path: Path) -> onnx.ModelProto:
    """Three 40 kB initializers at the top, a Constant of 40 kB inside an If branch (a subgraph's weights)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    weights = [numpy_helper.from_array(np.full((100, 100), i, np.float32), f"w{i}") for i in range(3)]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [100, 100])
    c = helper.make_tensor_value_info("c", TensorProto.BOOL, [])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [100, 100])
    inner = numpy_helper.from_array(np.full((100, 100), 7, np.float32), "k")
    then = helper.make_graph([helper.make_node("Constant", [], ["t"], value=inner)], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, [100, 100])])
    other = helper.make_graph([helper.make_node("Identity", ["w0"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, [100, 100])])
    nodes = [helper.make_node("Add", ["x", "w0"], ["a"]), helper.make_node("Add", ["a", "w1"], ["b"]),
             helper.make_node("Add", ["b", "w2"], ["d"]),
             helper.make_node("If", ["c"], ["i"], then_branch=then, else_branch=other),
             helper.make_node("Add", ["d", "i"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "g", [x, c], [y], weights))
    path.write_bytes(model.SerializeToString())
    return model


def _then_constant(model: onnx.ModelProto) -> onnx.TensorProto:
    """The value of the Constant inside the If node's then branch."""
    branch = next(a.g for a in model.graph.node[3].attribute if a.name == "then_branch")
    return branch.node[0].attribute[0].t


def _payload(t: onnx.TensorProto) -> int:
    return len(t.raw_data) + len(t.float_data)


def test_a_model_within_the_budget_is_its_own_reference(tmp_path: Path) -> None:
    src, _ = synthetic_model_path("conv_net", 0, tmp_path / "cache")
    assert src.stat().st_size <= tref.REFERENCE_BYTES
    plan = tref.reference_plan(src, tmp_path / "cut.onnx")
    model = onnx.load_model_from_string(src.read_bytes())
    assert plan.source == src and plan.passes == reference_passes(src.stat().st_size, len(model.graph.node))
    assert not (tmp_path / "cut.onnx").exists()


def test_a_larger_model_is_cut_to_the_budget_keeping_every_node_and_name(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Weight bytes are kept in file order while they fit (subgraph tensors included) and dropped after; the
    graph itself -- nodes, names, shapes, subgraphs -- is the model's, so the workload still walks all of it."""
    src = tmp_path / "big.onnx"
    model = _model_with_weights_in_a_subgraph(src)
    monkeypatch.setattr(tref, "REFERENCE_BYTES", 100_000)  # two of the four 40 kB tensors fit
    plan = tref.reference_plan(src, tmp_path / "cut.onnx")
    cut_path = plan.source
    assert cut_path == tmp_path / "cut.onnx" and cut_path.stat().st_size <= 100_000
    assert plan.passes == reference_passes(cut_path.stat().st_size, 7)  # 5 nodes at the top, one in each branch
    cut = onnx.load_model_from_string(cut_path.read_bytes())
    assert [_payload(t) for t in cut.graph.initializer] == [40_000, 40_000, 0]
    inner = _then_constant(cut)
    assert inner.name == "k" and list(inner.dims) == [100, 100] and _payload(inner) == 0
    for t in [*cut.graph.initializer, inner]:  # what the tensors are is kept, only their bytes go
        t.raw_data = b""
    for t in [*model.graph.initializer, _then_constant(model)]:
        t.raw_data = b""
    assert cut == model
    # the same cut every time: a function of the model alone
    assert tref.reference_plan(src, tmp_path / "again.onnx").source.read_bytes() == cut_path.read_bytes()


def test_timed_conversions_read_the_cut_model_and_leave_no_file_behind(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """convert_in_subprocess cuts the model once per job, and each reference sample parses the cut copy."""
    from tests.workers.fakes import fake_pass

    src = tmp_path / "src" / "big.onnx"
    src.parent.mkdir()
    _model_with_weights_in_a_subgraph(src)
    monkeypatch.setattr(tref, "REFERENCE_BYTES", 100_000)
    parses: list[int] = []
    real_load = onnx.load_model_from_string

    def load(data: bytes) -> onnx.ModelProto:
        parses.append(len(data))
        return real_load(data)

    monkeypatch.setattr(onnx, "load_model_from_string", load)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    got = convert.convert_in_subprocess(src, out_dir / "out.onnx", out_dir / "report.json", "fp16", "default",
                                        "cpu", fake_pass(tmp_path / "pass", "perturb"), timeout_s=60.0,
                                        memory_bytes=1024**3, repeats=2, repeat_budget_s=120.0)
    assert got.status == "ok" and len(got.reference_s) == 2
    assert parses[0] == src.stat().st_size  # the plan, made once
    assert len(set(parses[1:])) == 1 and parses[1] <= 100_000  # every pass of every sample: the cut copy
    assert len(parses) == 1 + 2 * reference_passes(parses[1], 7)
    assert sorted(p.name for p in out_dir.iterdir()) == ["out.onnx", "report.json"]
