"""``auto`` never judges on invented inputs: user npz, the zoo entry's spec, or (static float inputs only)
generated from the declared shapes; anything else is refused naming the inputs it needs.  The report
says which inputs were used."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from service.cli.main import main
from tests.auto.conftest import assert_valid
from workers.revision import autoconvert
from workers.revision.autoconvert import DataError, choose_feeds


def _save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, path)
    return path


def _mlp(batch: int | str) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((8, 8)) / 3).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"), helper.make_node("Tanh", ["h"], ["y"], name="t")],
        "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 8])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _embedding() -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    table = numpy_helper.from_array(rng.standard_normal((10, 8)).astype(np.float32), "table")
    w = numpy_helper.from_array((rng.standard_normal((8, 8)) / 3).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["e"], name="g"),
         helper.make_node("MatMul", ["e", "w"], ["y"], name="mm")],
        "emb", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8])], [table, w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _convert(src: Path, tmp: Path, *extra: str) -> tuple[int, Path, Path]:
    out, rep = tmp / "out.onnx", tmp / "rep.json"
    code = main(["convert", str(src), "-o", str(out), "--policy", "auto", "--report", str(rep), *extra])
    return code, out, rep


@pytest.mark.parametrize(("model", "needle"), [
    (_mlp("batch"), "x float32[batch,8] (symbolic dims batch)"),
    (_mlp(0), "x float32[?,8] (symbolic dims ?)"),
    (_embedding(), "ids int64[1,4] (int64 values)"),
])
def test_auto_refuses_to_invent_inputs(tmp_path: Path, capsys: pytest.CaptureFixture[str], model: onnx.ModelProto,
                                       needle: str) -> None:
    src = _save(model, tmp_path / "m.onnx")
    code, out, rep = _convert(src, tmp_path)
    err = capsys.readouterr().err
    assert code == 2 and needle in err and "--inputs FILE.npz" in err and err.count("\n") == 1
    assert not out.exists() and not rep.exists()


@pytest.mark.parametrize(("model", "feeds"), [
    (_mlp("batch"), {"x": np.random.default_rng(2).standard_normal((3, 8)).astype(np.float32)}),
    (_embedding(), {"ids": np.array([[1, 2, 3, 9]], np.int64)}),
])
def test_auto_with_an_npz_uses_it_and_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    src = _save(model, tmp_path / "m.onnx")
    npz = tmp_path / "real.npz"
    np.savez(npz, **feeds)
    code, out, rep = _convert(src, tmp_path, "--inputs", str(npz))
    assert code == 0, capsys.readouterr().err
    assert f"inputs: user npz:{npz}" in capsys.readouterr().out
    data = json.loads(rep.read_text())
    name, value = next(iter(feeds.items()))
    assert data["inputs"] == {"source": f"user npz:{npz}", "samples": 1, "shapes": {name: list(value.shape)},
                              "dtypes": {name: str(value.dtype)}}
    assert data["auto"]["met"]
    assert_valid(onnx.load(str(out)))


def test_static_float_inputs_may_be_generated_and_the_report_says_so(tmp_path: Path) -> None:
    src = _save(_mlp(2), tmp_path / "m.onnx")
    code, _, rep = _convert(src, tmp_path)
    assert code == 0
    inputs = json.loads(rep.read_text())["inputs"]
    assert inputs["source"] == "generated from static shapes" and inputs["shapes"] == {"x": [2, 8]}


def test_the_job_command_names_its_inputs_as_the_zoo_spec(tmp_path: Path) -> None:
    src = _save(_mlp("batch"), tmp_path / "m.onnx")
    npz = tmp_path / "inputs.npz"
    np.savez(npz, x=np.ones((2, 8), np.float32))
    cmd = autoconvert.command(src, tmp_path / "o.onnx", tmp_path / "r.json", "fp16", "cpu", Path("."), npz)
    assert cmd[cmd.index("--calibration-data") + 1] == str(npz)
    argv = cmd[cmd.index("workers.revision.autoconvert") + 1:]
    argv = argv[:argv.index("--pass-root")] + argv[argv.index("--pass-root") + 2:]  # this checkout's pass
    assert autoconvert.main(argv) == 0
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["inputs"]["source"] == "zoo spec (the job's inputs)" and data["inputs"]["shapes"] == {"x": [2, 8]}


def test_choose_feeds_refusal_is_a_data_error(tmp_path: Path) -> None:
    model = _mlp("n")
    src = _save(model, tmp_path / "m.onnx")
    with pytest.raises(DataError, match=r"m.onnx is not a zoo model and its inputs cannot be made up: x float32\[n,8\]"):
        choose_feeds(src, model)


def test_a_zoo_model_uses_its_zoo_spec(real_model_path) -> None:  # type: ignore[no-untyped-def]
    path = real_model_path("silero_vad")  # symbolic dims and an int64 input: only the zoo spec makes them
    feeds, source, inputs = choose_feeds(path, onnx.load(str(path)))
    assert source == "zoo:silero_vad" and inputs["source"] == "zoo spec" and inputs["zoo"] == "silero_vad"
    assert inputs["shapes"] == {"input": [1, 512], "state": [2, 1, 128], "sr": []}
    assert inputs["dtypes"]["sr"] == "int64" and int(feeds[0]["sr"]) == 16000
