"""The CLI entries: ``python -m amp_pass convert`` (subprocess) and ``ampci convert`` (in process).

Bad input gives exit 2, exactly one line on stderr, no traceback and nothing written.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from service.cli.main import main as ampci_main
from tests.amp_pass import graphs as G

ROOT = Path(__file__).resolve().parents[2]


def _amp(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "amp_pass", "convert", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def good(tmp_path: Path) -> Path:
    path = tmp_path / "good.onnx"
    onnx.save(G.loop_with_captured_weights(), str(path))
    return path


def _bad_inputs(tmp_path: Path, good: Path) -> dict[str, tuple[list[str | Path], str]]:
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(good.read_bytes()[: len(good.read_bytes()) // 2] + b"\xff\x00garbage")
    text = tmp_path / "notes.onnx"
    text.write_text("this is not a model\n")
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    broken = tmp_path / "broken.onnx"
    m = G.shared_input()
    m.graph.node[0].input[0] = "undefined_value"
    onnx.save(m, str(broken))
    ir3 = tmp_path / "ir3.onnx"  # up to IR version 3 every initializer must also be a graph input
    m3 = G.ir3_model()
    del m3.graph.input[1:]
    onnx.save(m3, str(ir3))
    dup = tmp_path / "dup.onnx"
    m = G.shared_input()
    m.graph.initializer.append(m.graph.initializer[0])
    onnx.save(m, str(dup))
    unsorted = tmp_path / "unsorted.onnx"  # a large Constant after its reader: left out of the skeleton
    m = G.large_constants()
    nodes = list(m.graph.node)
    big = next(i for i, n in enumerate(nodes) if n.op_type == "Constant" and len(n.attribute[0].t.raw_data) >= 1024)
    nodes.append(nodes.pop(big))
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    onnx.save(m, str(unsorted))
    mistyped = tmp_path / "mistyped.onnx"  # passes the basic checker, fails its full check (type inference)
    m = G.shared_input()
    m.graph.output[0].type.tensor_type.elem_type = onnx.TensorProto.DOUBLE
    onnx.save(m, str(mistyped))
    bad_policy = tmp_path / "bad.toml"
    bad_policy.write_text("[ops]\nallow = [1, 2\n")
    return {
        "corrupt": ([corrupt], "not a readable ONNX model"),
        "non-onnx": ([text], "is not a readable ONNX model"),
        "empty": ([empty], "is not an ONNX model"),
        "checker": ([broken], "checker"),
        "ir3 initializer": ([ir3], "in initializer but not in graph input"),
        "duplicate initializer": ([dup], "is not unique"),
        "unsorted constant": ([unsorted], "topologically sorted"),
        "type error": ([mistyped], "fails ONNX type inference"),
        "missing": ([tmp_path / "nope.onnx"], "does not exist"),
        "unknown policy": ([good, "--policy", "fastest"], "unknown policy"),
        "bad policy file": ([good, "--policy", bad_policy], "malformed policy file"),
    }


@pytest.mark.parametrize("case", ["corrupt", "non-onnx", "empty", "checker", "ir3 initializer",
                                  "duplicate initializer", "unsorted constant", "type error", "missing", "unknown policy", "bad policy file"])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path: Path, good: Path, case: str) -> None:
    args, needle = _bad_inputs(tmp_path, good)[case]
    out, report = tmp_path / "out" / "model.onnx", tmp_path / "out" / "report.json"
    proc = _amp(*args, "-o", out, "--report", report)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert needle in lines[0]
    leftovers = list((tmp_path / "out").glob("*")) if (tmp_path / "out").exists() else []
    assert leftovers == []


def test_subprocess_convert_writes_model_and_report(tmp_path: Path, good: Path) -> None:
    out, report = tmp_path / "m16.onnx", tmp_path / "r.json"
    proc = _amp(good, "-o", out, "--dtype", "bf16", "--policy", "conservative", "--target", "cpu",
                "--opset", "keep", "--report", report)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(report.read_text())
    for key in ("dtype", "policy", "target", "nodes_total", "nodes_low", "casts_inserted", "casts_removed",
                "compute_nodes", "compute_low", "low_precision_compute_fraction", "kept_fp32", "by_op_type",
                "seconds", "opset_in", "opset_out", "notes"):
        assert key in data
    assert data["opset_in"] == data["opset_out"] and data["notes"] == []  # --opset keep
    assert (data["dtype"], data["policy"], data["target"]) == ("bf16", "conservative", "cpu")
    onnx.checker.check_model(onnx.load(str(out)), full_check=True)


def test_ampci_convert_matches_python_m(tmp_path: Path, good: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_a, out_b = tmp_path / "a.onnx", tmp_path / "b.onnx"
    assert ampci_main(["convert", str(good), "-o", str(out_a), "--no-keep-io-types", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["keep_io_types"] is False
    assert _amp(good, "-o", out_b, "--no-keep-io-types").returncode == 0
    assert out_a.read_bytes() == out_b.read_bytes()
    assert onnx.load(str(out_a)).graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16


def test_ampci_convert_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = tmp_path / "x.onnx"
    text.write_text("hello")
    assert ampci_main(["convert", str(text), "-o", str(tmp_path / "o.onnx")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ampci: error:")
    assert not (tmp_path / "o.onnx").exists()


@pytest.mark.parametrize("where", ["model", "report"])
def test_unwritable_output_is_one_line_and_writes_nothing(tmp_path: Path, good: Path, where: str) -> None:
    """An output under a regular file (a directory that cannot be made, even as root): one line, exit 2,
    and neither the model nor the report is left behind."""
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("")
    out, report = tmp_path / "out" / "model.onnx", tmp_path / "out" / "report.json"
    if where == "model":
        out = blocker / "model.onnx"
    else:
        report = blocker / "report.json"
    proc = _amp(good, "-o", out, "--report", report)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot write" in lines[0] and "Traceback" not in proc.stderr
    assert not out.exists() and not report.exists()
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["good.onnx", "not_a_dir"]
