"""An explicit ``--opset N`` / ``target_opset=N`` is honoured or refused, never silently dropped.

Refused: N above the highest opset the installed onnx defines (the pass's ceiling -- it never imports
onnxruntime -- named in the message), N below 1, and any N the model cannot be converted to (version
converter error, invalid result, failed type inference).  The refusal is an ``OpsetError`` (exit 2, one
line, nothing written); "auto" keeps falling back to the model's opset with a note (``test_opset.py``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from amp_pass import AmpPassError, ConversionOptions, OptionsError, convert_model
from amp_pass import opset as opset_mod
from amp_pass.errors import OpsetError
from service.cli.main import main as ampci_main
from tests.amp_pass import graphs as G

ROOT = Path(__file__).resolve().parents[2]
CEILING = onnx.defs.onnx_opset_version()


def _opset(m: onnx.ModelProto) -> int:
    return next(o.version for o in m.opset_import if o.domain in ("", "ai.onnx"))


@pytest.fixture
def model_path(tmp_path: Path) -> Path:
    path = tmp_path / "in.onnx"
    onnx.save(G.shared_input(opset=17), str(path))
    return path


@pytest.mark.parametrize(("opset", "says"), [
    ("5", "cannot convert at opset 5: opset upgrade 17 -> 5 failed: No Adapter From Version $14 for Add"),
    ("999", f"cannot convert at opset 999: the highest opset this onnx ({onnx.__version__}) supports is {CEILING}"),
    ("0", "cannot convert at opset 0: opsets start at 1"),
])
def test_python_m_refuses_an_opset_it_cannot_honour(tmp_path: Path, model_path: Path, opset: str, says: str) -> None:
    out = tmp_path / "out.onnx"
    proc = subprocess.run([sys.executable, "-m", "amp_pass", "convert", str(model_path), "-o", str(out),
                           "--opset", opset], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [f"amp_pass: error: {says}"]
    assert proc.stdout == "" and not out.exists() and list(tmp_path.iterdir()) == [model_path]


def test_ampci_convert_refuses_it_too(tmp_path: Path, model_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out.onnx"
    assert ampci_main(["convert", str(model_path), "-o", str(out), "--opset", "5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ampci: error: cannot convert at opset 5:"), err
    assert not out.exists()


def test_the_error_class() -> None:
    assert issubclass(OpsetError, OptionsError) and issubclass(OpsetError, AmpPassError)
    assert OpsetError.exit_code == 2
    with pytest.raises(OpsetError, match=f"highest opset this onnx .* supports is {CEILING}$"):
        ConversionOptions(target_opset=CEILING + 1).validate()
    ConversionOptions(target_opset=CEILING).validate()  # the ceiling itself is allowed


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_a_failed_explicit_upgrade_raises(monkeypatch: pytest.MonkeyPatch, dtype: str) -> None:
    def broken(model: onnx.ModelProto, target: int) -> onnx.ModelProto:
        raise RuntimeError("/src/BaseConverter.h:66: adapter_lookup: Assertion `false` failed: No Adapter For X\nmore")

    monkeypatch.setattr(opset_mod.version_converter, "convert_version", broken)
    m = G.conv_loop_if(11)
    with pytest.raises(OpsetError) as info:
        convert_model(m, ConversionOptions(dtype=dtype, target_opset=18))
    assert str(info.value) == "cannot convert at opset 18: opset upgrade 11 -> 18 failed: No Adapter For X"
    if dtype == "bf16":  # "auto" still falls back to the model's opset with a note
        r = convert_model(m, ConversionOptions(dtype=dtype))
        assert r.report.opset_out == 11 and r.report.notes == ["opset upgrade 11 -> 22 failed, kept opset 11: "
                                                               "No Adapter For X"]


def test_type_inference_failing_after_an_explicit_upgrade_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    real = onnx.shape_inference.infer_shapes

    def picky(model: onnx.ModelProto | bytes, *args: object, **kwargs: object) -> onnx.ModelProto:
        if isinstance(model, onnx.ModelProto) and _opset(model) == 18:
            raise onnx.shape_inference.InferenceError("[TypeInferenceError] made up\nsecond line")
        return real(model, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", picky)
    with pytest.raises(OpsetError, match=r"^cannot convert at opset 18: opset upgrade 11 -> 18: type inference "
                                         r"failed on the upgraded model: \[TypeInferenceError\] made up$"):
        convert_model(G.conv_loop_if(11), ConversionOptions(target_opset=18))


@pytest.mark.parametrize(("source", "target"), [(11, 18), (17, 14), (17, 17)])
def test_an_explicit_opset_that_can_be_reached_is_honoured(convert, source: int, target: int) -> None:
    m = G.conv_loop_if(source) if source == 11 else G.shared_input(opset=source)
    r = convert(m, "fp16", target_opset=target)
    assert (r.report.opset_in, r.report.opset_out, _opset(r.model)) == (source, target, target)
    assert r.report.notes == []


def test_the_streamed_path_refuses_an_explicit_opset_it_does_not_apply(tmp_path: Path, model_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Models over ``io.LARGE_BYTES`` go through onnx-ir without an opset upgrade: an explicit other
    opset is refused there too (an explicit equal one, or auto, converts)."""
    from amp_pass import convert_file
    from amp_pass import io as amp_io

    monkeypatch.setattr(amp_io, "LARGE_BYTES", 0)
    out = tmp_path / "out.onnx"
    with pytest.raises(OpsetError, match="^cannot convert at opset 18: the model reaching the pass is at opset 17"):
        convert_file(model_path, out, ConversionOptions(target_opset=18))
    assert not out.exists()
    report = convert_file(model_path, out, ConversionOptions(target_opset=17))
    assert report.opset_out == 17 and _opset(onnx.load(str(out))) == 17
