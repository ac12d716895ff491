"""Reading external data only from inside the model's folder (one-line error, exit 2, from both
``python -m amp_pass convert`` and ``ampci convert``), and outputs created with the process umask."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from amp_pass import ConversionOptions, convert_file
from amp_pass.io import ExternalDataError, check_external_data, process_umask

REPO = Path(__file__).resolve().parents[2]


def _model_with_location(folder: Path, location: str, n: int = 4) -> Path:
    """A MatMul model whose n x n weight is external data at ``location`` (relative to ``folder``)."""
    w = nh.from_array(np.ones((n, n), np.float32), "W")
    w.ClearField("raw_data")
    w.data_location = T.EXTERNAL
    entry = w.external_data.add()
    entry.key, entry.value = "location", location
    g = h.make_graph([h.make_node("MatMul", ["X", "W"], ["Y"], name="mm")], "g",
                     [h.make_tensor_value_info("X", T.FLOAT, [1, n])], [h.make_tensor_value_info("Y", T.FLOAT, [1, n])],
                     [w])
    folder.mkdir(parents=True, exist_ok=True)
    src = folder / "model.onnx"
    src.write_bytes(h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8).SerializeToString())
    return src


def _bad_models(tmp_path: Path) -> dict[str, Path]:
    secret = tmp_path / "secret.bin"
    secret.write_bytes(np.ones((4, 4), np.float32).tobytes())  # a readable file of the right size
    out = {"traversal": _model_with_location(tmp_path / "a" / "b", "../../secret.bin"),
           "absolute": _model_with_location(tmp_path / "abs", str(secret)),
           "missing": _model_with_location(tmp_path / "miss", "weights.bin")}
    link = _model_with_location(tmp_path / "link", "weights.bin")
    (link.parent / "weights.bin").symlink_to(secret)
    out["symlink"] = link
    sub = _model_with_location(tmp_path / "dirlink", "sub/weights.bin")
    (sub.parent / "sub").symlink_to(tmp_path)  # a link to a folder on the way
    (tmp_path / "weights.bin").write_bytes(secret.read_bytes())
    out["link_on_the_way"] = sub
    folder = _model_with_location(tmp_path / "isdir", "data")
    (folder.parent / "data").mkdir()
    out["not_a_file"] = folder
    return out


REASONS = {"traversal": "outside the model's folder", "absolute": "an absolute path", "missing": "no such file",
           "symlink": "a symbolic link", "link_on_the_way": "a symbolic link", "not_a_file": "not a regular file"}


def test_unsafe_external_data_locations_raise_external_data_error(tmp_path: Path) -> None:
    for kind, src in _bad_models(tmp_path).items():
        with pytest.raises(ExternalDataError, match=REASONS[kind]) as err:
            convert_file(src, tmp_path / "out" / f"{kind}.onnx", ConversionOptions(dtype="fp16"))
        assert err.value.exit_code == 2 and "\n" not in str(err.value), kind
        assert not (tmp_path / "out" / f"{kind}.onnx").exists(), kind


def test_a_location_inside_the_folder_is_read(tmp_path: Path) -> None:
    src = _model_with_location(tmp_path / "ok", "sub/weights.bin")
    (src.parent / "sub").mkdir()
    (src.parent / "sub" / "weights.bin").write_bytes(np.ones((4, 4), np.float32).tobytes())
    check_external_data(onnx.load(str(src), load_external_data=False), src.parent)
    report = convert_file(src, tmp_path / "out" / "ok.onnx", ConversionOptions(dtype="fp16"))
    assert report.compute_low == 1


@pytest.mark.parametrize("command", [[sys.executable, "-m", "amp_pass", "convert"],
                                     [sys.executable, "-m", "service.cli.main", "convert"]],
                         ids=["python -m amp_pass", "ampci"])
def test_cli_prints_one_line_and_exits_2(tmp_path: Path, command: list[str]) -> None:
    for kind, src in _bad_models(tmp_path).items():
        proc = subprocess.run([*command, str(src), "-o", str(tmp_path / f"{kind}.out.onnx"), "--dtype", "fp16"],
                              capture_output=True, text=True, cwd=REPO, timeout=120,
                              env={k: v for k, v in os.environ.items() if k != "AMPCI_DEBUG"})
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and REASONS[kind] in lines[0], (kind, proc.stderr)
        assert "Traceback" not in proc.stderr + proc.stdout


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_outputs_honour_the_umask(tmp_path: Path, umask: int) -> None:
    """The converted model (inline and external data) and the report get 0o666 & ~umask, as open() gives."""
    src = _model_with_location(tmp_path / "src", "weights.bin", n=32)  # 4 KiB: stays external when saved
    (src.parent / "weights.bin").write_bytes(np.ones((32, 32), np.float32).tobytes())
    inline = tmp_path / "inline.onnx"
    onnx.save(onnx.load(str(src)), str(inline))
    code = ("import os, sys; os.umask(int(sys.argv[1], 8)); from amp_pass.cli import main; "
            "sys.exit(main(sys.argv[2:]))")
    for name, model in (("ext", src), ("inline", inline)):
        out, report = tmp_path / "out" / f"{name}.onnx", tmp_path / "out" / f"{name}.json"
        proc = subprocess.run([sys.executable, "-c", code, oct(umask), "convert", str(model), "-o", str(out),
                               "--dtype", "fp16", "--report", str(report)], capture_output=True, text=True,
                              cwd=REPO, timeout=120)
        assert proc.returncode == 0, proc.stderr
        written = [out, report] + ([out.parent / f"{out.name}.data"] if name == "ext" else [])
        for path in written:
            assert path.stat().st_mode & 0o777 == 0o666 & ~umask, (path, oct(path.stat().st_mode), oct(umask))


def test_process_umask_reads_without_changing_it() -> None:
    before = os.umask(0o027)
    try:
        assert process_umask() == 0o027 and process_umask() == 0o027
    finally:
        os.umask(before)
