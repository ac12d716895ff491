"""The first hour of a new user with the CLI, tried as they would: an accuracy failure ends with the next
step (policy auto, with what it keeps in fp32), bf16 on the CPU provider says once why latency is not
measured, a mistyped model gets a "did you mean", ``--json`` errors have one shape, a directory or a
text file given where a model or an .npz belongs is named for what it is, and ``zoo list`` has a header."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from service.cli.main import main


@pytest.fixture(autouse=True)
def _env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AMPCI_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("AMPCI_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("AMPCI_LATENCY_RUNS", "3")
    monkeypatch.setenv("AMPCI_LATENCY_WARMUP", "1")
    monkeypatch.setenv("AMPCI_CONVERT_REPEATS", "1")
    monkeypatch.chdir(tmp_path)


def shifted_model(path: Path) -> Path:
    """y = ((x @ w) + 1000 - 1000) @ w: fp16 loses the low bits at 1000 (max_abs ~1 > the bound), while
    keeping the Add/Sub in fp32 is accurate -- the default policy fails, auto passes."""
    w = numpy_helper.from_array(np.random.default_rng(0).normal(size=(16, 16)).astype(np.float32), "w")
    big = numpy_helper.from_array(np.array(1000.0, np.float32), "big")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
             helper.make_node("Add", ["m", "big"], ["a"], name="add"),
             helper.make_node("Sub", ["a", "big"], ["s"], name="sub"),
             helper.make_node("MatMul", ["s", "w"], ["y"], name="mm2")]
    graph = helper.make_graph(nodes, "shift", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])], [w, big])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def test_an_accuracy_failure_ends_with_the_next_step(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    model = str(shifted_model(tmp_path / "shift.onnx"))
    assert main(["check", model]) == 1
    out = capsys.readouterr().out
    assert "FAIL_ACCURACY" in out
    lines = out.splitlines()
    i = lines.index("next step: policy auto keeps the fewest nodes in fp32 that make " + model + " fp16 accurate:")
    check_cmd = f"  ampci check {model} --dtype fp16 --target cpu --policy auto"
    convert_cmd = f"  ampci convert {model} -o shift_fp16.onnx --dtype fp16 --target cpu --policy auto"
    assert lines[i + 1:i + 4] == [check_cmd, "  and to write the passing model:", convert_cmd]
    assert "auto has not run on this model here yet" in lines[i + 4]

    # the suggested commands do what they say
    assert main(shlex.split(check_cmd.strip())[1:]) == 0
    out = capsys.readouterr().out
    assert ": PASS" in out.splitlines()[0]
    [kept] = [x for x in out.splitlines() if x.startswith("  auto kept ")]
    assert "node(s) in fp32" in kept and "(Add)" in kept
    assert main(shlex.split(convert_cmd.strip())[1:]) == 0
    assert (tmp_path / "shift_fp16.onnx").is_file()
    capsys.readouterr()

    # once auto has run here, the failure says what it kept in fp32
    assert main(["check", model]) == 1
    out = capsys.readouterr().out
    [said] = [x for x in out.splitlines() if x.startswith("  when auto ran here")]
    assert ": PASS) it kept" in said and "(Add)" in said
    assert main(["check", model, "--dtype", "bf16"]) in (0, 1)  # another dtype: nothing recalled for it
    assert "when auto ran here" not in capsys.readouterr().out


def test_passing_and_failing_for_other_reasons_print_no_next_step(capsys: pytest.CaptureFixture[str]):
    assert main(["check", "conv_net"]) == 0
    assert "next step" not in capsys.readouterr().out


def test_bf16_on_the_cpu_provider_says_once_why_latency_is_not_measured(capsys: pytest.CaptureFixture[str]):
    assert main(["check", "conv_net", "--dtype", "bf16"]) == 0
    out = capsys.readouterr().out
    status = out.splitlines()[0]
    assert status == "conv_net bf16 policy=default target=cpu: PASS", status
    assert "NOT_IMPLEMENTED" not in out and "ONNXRuntimeError" not in out
    info = [x for x in out.splitlines() if "latency" in x]
    assert info == ["  info: latency not measured: onnxruntime's CPU provider has no bf16 kernels for these ops "
                    "(first missing: Conv); bf16 latency is measured on CUDA workers (--target cuda)"]
    assert main(["check", "conv_net", "--dtype", "bf16", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["message"] == "" and result["latency"]["error"].startswith("unsupported here: ")


def test_latency_error_keeps_other_session_errors():
    from workers.measure.latency import latency_error

    exc = RuntimeError("[ONNXRuntimeError] : 9 : NOT_IMPLEMENTED : Could not find an implementation for Conv(22) "
                       "node with name ''")
    assert latency_error(exc, "cpu", "bf16").startswith("unsupported here: ")
    assert latency_error(exc, "cpu", "fp16").startswith("converted model not timed: ")
    assert latency_error(exc, "cuda", "bf16").startswith("converted model not timed: ")
    assert latency_error(RuntimeError("out of memory"), "cpu", "bf16") == "converted model not timed: out of memory"


def test_a_mistyped_model_gets_a_did_you_mean(capsys: pytest.CaptureFixture[str]):
    assert main(["check", "conv_nett"]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.count("\n") == 1
    assert out.err.startswith("ampci: error: unknown model 'conv_nett' (did you mean 'conv_net'?)")


@pytest.mark.parametrize("argv", [["conv_nett"], ["conv_net", "--policy", "nope.toml"], ["SYM"],
                                  ["SYM", "--input-shape", "x=2by8"], ["conv_net", "--input-shape", "x=1x3"],
                                  ["DIR"], ["MISSING.onnx"]])
def test_json_errors_have_one_shape_on_stdout_and_one_line_on_stderr(tmp_path: Path, argv: list[str],
                                                                      capsys: pytest.CaptureFixture[str]):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])
    sym = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]),
                            opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(sym, tmp_path / "sym.onnx")
    names = {"SYM": str(tmp_path / "sym.onnx"), "DIR": str(tmp_path), "MISSING.onnx": str(tmp_path / "no.onnx")}
    assert main(["check", *(names.get(a, a) for a in argv), "--json"]) == 2
    out = capsys.readouterr()
    got = json.loads(out.out)
    assert set(got) == {"error", "status", "message", "exit_code"}, got
    assert got["error"] == "bad_input" and got["status"] == "bad_spec" and got["exit_code"] == 2
    assert out.err == f"ampci: error: {got['message']}\n"


def test_a_directory_is_named_as_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    (tmp_path / "model.onnx").mkdir()
    for path in (tmp_path, tmp_path / "model.onnx"):
        assert main(["check", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{path} is a directory" in err and "does not exist" not in err, err
    assert main(["zoo", "add", str(tmp_path / "model.onnx"), "--name", "mine"]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_a_text_file_given_as_inputs_is_not_an_npz(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    model = str(shifted_model(tmp_path / "shift.onnx"))
    notes = tmp_path / "notes.txt"
    notes.write_text("remember to check the Resize scales\n")
    assert main(["check", model, "--inputs", str(notes)]) == 2
    err = capsys.readouterr().err
    assert f"--inputs {notes} is not an .npz file" in err and "allow_pickle" not in err and err.count("\n") == 1
    assert main(["convert", model, "-o", str(tmp_path / "o.onnx"), "--policy", "auto", "--inputs", str(notes)]) == 2
    err = capsys.readouterr().err
    assert "is not an .npz file" in err and "allow_pickle" not in err and err.count("\n") == 1


def test_zoo_list_has_a_header_row_aligned_with_its_columns(capsys: pytest.CaptureFixture[str]):
    assert main(["zoo", "list", "--tag", "smoke"]) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    assert header.split() == ["NAME", "ORIGIN", "SOURCE", "TAGS", "INPUTS"]
    assert rows and all(r.index("builtin") == header.index("ORIGIN") for r in rows)
    assert all(r.index("x[") == header.index("INPUTS") for r in rows)


def test_next_step_for_a_zoo_model_exports_it_first():
    import argparse
    from types import SimpleNamespace

    from service.cli.check_cmd import next_steps

    args = argparse.Namespace(model="conv_net", dtype="bf16", target="cuda", policy="default", inputs=None,
                              input_shape=[], input_range=[])
    failed = SimpleNamespace(status="fail_accuracy", graph=None)
    remembered = {"status": "pass", "at": "2026-12-02 17:00 UTC",
                  "kept": [{"node": "mm", "op_type": "MatMul", "forced": "1"}, {"node": "add", "op_type": "Add"}]}
    lines = next_steps(failed, args, remembered)
    assert lines[1:5] == ["  ampci check conv_net --dtype bf16 --target cuda --policy auto",
                          "  and to write the passing model:",
                          "  ampci zoo export conv_net -o conv_net.onnx",
                          "  ampci convert conv_net.onnx -o conv_net_bf16.onnx --dtype bf16 --target cuda --policy auto"]
    assert lines[5] == ("  when auto ran here (2026-12-02 17:00 UTC: PASS) it kept 2 node(s) in fp32: "
                        "mm (MatMul, forced by the search), add (Add)")
    assert next_steps(SimpleNamespace(status="convert_error", graph=None), args, remembered) == []
