"""Bring your own model: ``ampci check PATH.onnx`` with inputs from an npz or generated from the graph's
declared types and shapes, one-line errors (exit 2) for what must be given, and relative paths in zoo
manifests and sweep files resolved against the file that holds them."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from service.cli.main import main
from service.orchestration.sweeps import SweepConfig
from workers.result import JobResult


def symbolic_model(path: Path) -> str:
    """``y = Relu((x + emb[ids]) @ w)`` with x: float[batch, 8], ids: int64[batch]; its sha256."""
    rng = np.random.default_rng(0)
    w = helper.make_tensor("w", TensorProto.FLOAT, [8, 4], rng.standard_normal(32).astype(np.float32).tolist())
    emb = helper.make_tensor("emb", TensorProto.FLOAT, [10, 8], rng.standard_normal(80).astype(np.float32).tolist())
    graph = helper.make_graph(
        [helper.make_node("Gather", ["emb", "ids"], ["e"]), helper.make_node("Add", ["x", "e"], ["s"]),
         helper.make_node("MatMul", ["s", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8]),
         helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])], [w, emb])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, path)
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(autouse=True)
def _env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AMPCI_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("AMPCI_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("AMPCI_LATENCY_RUNS", "3")
    monkeypatch.setenv("AMPCI_LATENCY_WARMUP", "1")
    monkeypatch.setenv("AMPCI_CONVERT_REPEATS", "1")


def _check(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, JobResult]:
    code = main(["check", *argv, "--json"])
    return code, JobResult.from_json(capsys.readouterr().out)


def test_check_model_file_with_symbolic_dims_given_input_shape(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    sha = symbolic_model(tmp_path / "sym.onnx")
    code, r = _check([str(tmp_path / "sym.onnx"), "--input-shape", "x=2x8", "--input-shape", "ids=2",
                      "--input-range", "ids=0:10"], capsys)
    assert code == 0, r.message
    assert r.status == "pass" and r.model == "sym.onnx" and r.model_sha256 == sha
    assert r.accuracy is not None and set(r.accuracy.per_output) == {"y"}
    assert r.latency is not None and len(r.latency.samples_ms) == 3
    assert r.graph is not None and r.graph.compute_by_op["MatMul"]["total"] == 1  # graph facts measured
    x, ids = r.inputs["x"], r.inputs["ids"]
    assert x["shape"] == [2, 8] and x["dtype"] == "float32" and x["values"].startswith("normal(mean=0, std=1)")
    assert "--input-shape" in x["note"] and "[batch, 8]" in x["note"]
    assert ids["shape"] == [2] and ids["dtype"] == "int64" and ids["values"].startswith("randint[0, 10)")
    assert "--input-range" in ids["note"]
    # the human output says the same
    assert main(["check", str(tmp_path / "sym.onnx"), "--input-shape", "x=2x8", "--input-shape", "ids=2",
                 "--input-range", "ids=0:10"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("sym.onnx fp16 policy=default target=cpu: PASS")
    assert "  input x: float32[2, 8] normal(mean=0, std=1), seed 0 (shape from --input-shape" in out
    assert "  input ids: int64[2] randint[0, 10), seed 0" in out and "graph (measured)" in out


@pytest.mark.parametrize("constant", [["--input-value", "ids=3"], ["--input-range", "ids=3"]])
def test_check_a_constant_input_and_the_limits_each_figure_was_held_to(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], constant: list[str]) -> None:
    """``--input-value ids=3`` (or ``--input-range ids=3``) feeds the constant 3, not a 3:4 range; the
    human output shows each output's max_abs beside the limit it was judged against, and cosine beside its
    minimum, the same numbers as the result's ``accuracy.limits``."""
    symbolic_model(tmp_path / "sym.onnx")
    argv = [str(tmp_path / "sym.onnx"), "--input-shape", "x=2x8", "--input-shape", "ids=2", *constant]
    code, r = _check(argv, capsys)
    assert code == 0, r.message
    assert r.inputs["ids"]["values"] == "constant 3" and "--input-value" in r.inputs["ids"]["note"]
    assert r.accuracy is not None
    limit = r.accuracy.limits["y"]
    assert limit["max_abs"] > r.accuracy.per_output["y"].max_abs and limit["min_cosine"] == 0.999
    assert main(["check", *argv]) == 0
    out = capsys.readouterr().out
    assert f"    y: max_abs {format(r.accuracy.per_output['y'].max_abs, '.3g')} (limit {limit['max_abs']:.3g})" in out
    assert "(min 0.999)" in out and "  input ids: int64[2] constant 3" in out


@pytest.mark.parametrize(("value", "words"), [("ids=1:4", "a range is --input-range"), ("ids=x", "NAME=VALUE"),
                                              ("ids=inf", "finite")])
def test_a_bad_input_value_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str,
                                       words: str) -> None:
    symbolic_model(tmp_path / "sym.onnx")
    assert main(["check", str(tmp_path / "sym.onnx"), "--input-shape", "x=2x8", "--input-shape", "ids=2",
                 "--input-value", value]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--input-value {value!r}" in err and words in err


def test_check_model_file_given_an_npz(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    symbolic_model(tmp_path / "sym.onnx")
    np.savez(tmp_path / "in.npz", x=np.linspace(-1, 1, 24, dtype=np.float32).reshape(3, 8),
             ids=np.array([1, 5, 9]))
    code, r = _check([str(tmp_path / "sym.onnx"), "--inputs", str(tmp_path / "in.npz")], capsys)
    assert code == 0, r.message
    assert r.inputs["x"]["shape"] == [3, 8] and r.inputs["ids"]["shape"] == [3]
    assert r.inputs["x"]["values"] == f"npz {(tmp_path / 'in.npz').resolve()}"
    assert r.inputs["ids"]["note"] == f"array of --inputs {tmp_path / 'in.npz'}"


def test_check_model_file_errors_are_one_line_exit_2_before_any_job(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = str(tmp_path / "sym.onnx")
    symbolic_model(tmp_path / "sym.onnx")
    cases = [
        ([], "sym.onnx: symbolic dims need --input-shape NAME=AxBxC (or --inputs FILE.npz): x[batch, 8] (batch), "
             "ids[batch] (batch); integer inputs need --input-range NAME=LOW:HIGH (or --inputs FILE.npz): ids (int64)"),
        (["--input-shape", "x=2x8", "--input-shape", "ids=2"],
         "sym.onnx: integer inputs need --input-range NAME=LOW:HIGH (or --inputs FILE.npz): ids (int64)"),
        (["--input-shape", "x=2x8", "--input-range", "ids=0:10"],
         "sym.onnx: symbolic dims need --input-shape NAME=AxBxC (or --inputs FILE.npz): ids[batch] (batch)"),
        (["--input-shape", "x=2x9", "--input-shape", "ids=2", "--input-range", "ids=0:10"],
         "sym.onnx: input 'x' [batch, 8]: dim 1 is 8 in the model, got shape [2, 9]"),
        (["--input-shape", "y=2", "--input-shape", "ids=2"],
         "sym.onnx: --input-shape names no model input: y (model inputs: x, ids)"),
        (["--input-shape", "x=2by8"], "--input-shape 'x=2by8': expected NAME=DIMS"),
        (["--input-range", "ids=5:1"], "--input-range 'ids=5:1': expected NAME=LOW:HIGH"),
    ]
    for extra, message in cases:
        assert main(["check", model, *extra]) == 2, extra
        out = capsys.readouterr()
        assert out.out == "" and out.err.startswith(f"ampci: error: {message}") and out.err.count("\n") == 1, \
            (extra, out.err)
    assert main(["check", str(tmp_path / "missing.onnx")]) == 2
    assert capsys.readouterr().err == f"ampci: error: model file {tmp_path / 'missing.onnx'} does not exist\n"
    assert main(["check", "conv_net", "--input-shape", "x=1x3x32x32"]) == 2  # a zoo name has its own inputs
    assert "is a zoo name" in capsys.readouterr().err


def test_zoo_manifest_paths_resolve_against_the_manifest_from_another_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    sha = symbolic_model(tmp_path / "a" / "models" / "m.onnx")
    (tmp_path / "a" / "data").mkdir()
    np.savez(tmp_path / "a" / "data" / "ids.npz", ids=np.array([0, 3]))
    (tmp_path / "a" / "my_zoo.toml").write_text(
        f'[models.mine]\nsource = {{ path = "models/m.onnx" }}\nsha256 = "{sha}"\n'
        'inputs.x = { shape = [2, 8] }\ninputs.ids = { shape = [2], dtype = "int64", npz = "data/ids.npz" }\n')
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "b")
    code, r = _check(["mine", "--zoo", "../a/my_zoo.toml"], capsys)
    assert code == 0, r.message
    assert r.model == "mine" and r.model_sha256 == sha
    assert r.inputs["ids"]["values"] == "npz data/ids.npz"
    from workers.zoo.manifest import load_zoo

    assert load_zoo(Path("../a/my_zoo.toml")).get("mine").base_dir == (tmp_path / "a").resolve()


def test_sweep_zoo_path_resolves_against_the_sweep_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sha = symbolic_model(tmp_path / "s" / "m.onnx")
    (tmp_path / "s" / "my_zoo.toml").write_text(
        f'[models.mine]\nsource = {{ path = "m.onnx" }}\nsha256 = "{sha}"\ntags = ["own"]\n'
        'inputs.x = { shape = [2, 8] }\ninputs.ids = { shape = [2], dtype = "int64", dist = "randint", high = 10 }\n')
    (tmp_path / "s" / "sweep.toml").write_text('name = "own"\nzoo = "my_zoo.toml"\nmodels = ["tag:own"]\n'
                                               'dtypes = ["fp16"]\npolicies = ["default"]\ntargets = ["cpu"]\n')
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    config = SweepConfig.from_file(Path("../s/sweep.toml"))
    assert config.zoo_path() == (tmp_path / "s" / "my_zoo.toml").resolve()
    from service.orchestration.scheduler import zoo_catalog

    (cell,) = config.expand(zoo_catalog(config.zoo_path()))
    assert cell.cell == ("mine", "fp16", "default", "cpu") and cell.options()["zoo"] == str(config.zoo_path())
    from service.orchestration.sweeps import SweepConfigError

    (tmp_path / "s" / "bad.toml").write_text('zoo = "nope.toml"\nmodels = ["mine"]\ndtypes = ["fp16"]\n'
                                             'policies = ["default"]\ntargets = ["cpu"]\n')
    with pytest.raises(SweepConfigError, match=r"zoo manifest 'nope.toml' does not exist \(.*/s/nope.toml\)"):
        SweepConfig.from_file(tmp_path / "s" / "bad.toml")


def test_result_inputs_round_trip_and_old_results_read_empty() -> None:
    r = JobResult(model="m", dtype="fp16", policy="default", target="cpu", status="pass",
                  inputs={"x": {"shape": [1, 2], "dtype": "float32", "values": "normal(mean=0, std=1)"}})
    d = json.loads(r.to_json())
    assert JobResult.from_dict(d).inputs == r.inputs
    del d["inputs"]
    assert JobResult.from_dict(d).inputs == {}


def test_readme_quick_start_checks_an_own_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The quick start's third line runs as written (its /tmp file moved into tmp_path)."""
    import re
    import shlex

    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    quick = readme.split("## Quick start", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    (line,) = [ln for ln in quick.splitlines() if "ampci check" in ln]
    commands = [shlex.split(part, comments=True) for part in line.split("&&")]
    assert [c[:3] for c in commands] == [["python3", "dev.py", "ampci"]] * 2, line
    assert [c[3:5] for c in commands] == [["zoo", "export"], ["check", "/tmp/model.onnx"]]
    for argv in commands:
        assert main([re.sub(r"^/tmp/", f"{tmp_path}/", a) for a in argv[3:]]) == 0
    out = capsys.readouterr().out
    assert "model.onnx fp16 policy=default target=cpu: PASS" in out and "  input x: float32[4, 3, 32, 32]" in out
