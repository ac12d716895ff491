"""File-level conversion: load (with external data), convert, save atomically.

Guarantees: nothing is written at ``dst`` unless conversion succeeded (temporary file + rename);
a model stored with external data, or too large for one protobuf, is saved with external data next
to ``dst``; bad input raises InvalidModelError (exit_code 2) naming the problem.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import onnx
import onnx_ir as ir
from google.protobuf.message import DecodeError
from onnx.external_data_helper import load_external_data_for_model

from amp_pass.converter import AmpPass, ConversionOptions, convert_model, gc_paused
from amp_pass.errors import InvalidModelError, OutputError
from amp_pass.report import ConversionReport

#: Above this size a model is handled through onnx-ir with lazy external tensors.
LARGE_BYTES = 1_500_000_000


def _uses_external_data(model: onnx.ModelProto) -> bool:
    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)


def _initializer_bytes(model: onnx.ModelProto) -> int:
    return sum(len(t.raw_data) for t in model.graph.initializer)


def load_model(src: Path) -> tuple[onnx.ModelProto, bool]:
    """Load ``src`` with its external data; also say whether it had any.

    Raises InvalidModelError for missing, corrupt or non-ONNX files and unreadable external data.
    """
    if not src.is_file():
        raise InvalidModelError(f"model file {src} does not exist")
    try:
        model = onnx.load(str(src), load_external_data=False)
    except (DecodeError, RuntimeError, ValueError, OSError, UnicodeDecodeError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise InvalidModelError(f"{src} is not a readable ONNX model: {first}") from None
    if not model.graph.node and not model.graph.output:
        raise InvalidModelError(f"{src} is not an ONNX model (no graph)")
    external = _uses_external_data(model)
    if external:
        try:
            load_external_data_for_model(model, str(src.parent))
        except (OSError, ValueError, RuntimeError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise InvalidModelError(f"cannot read external data of {src}: {first}") from None
    return model, external


def _atomic_dst(dst: Path) -> Path:
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}.", suffix=".tmp", dir=dst.parent)
    except OSError as exc:
        raise OutputError.cannot_write(dst, exc) from None
    os.close(fd)
    return Path(tmp)


def _writable(dst: Path) -> None:
    """Fail early (before converting) when ``dst`` cannot be written; leaves nothing behind."""
    Path(_atomic_dst(dst)).unlink(missing_ok=True)


def convert_file(src: Path | str, dst: Path | str, options: ConversionOptions | None = None) -> ConversionReport:
    """Load ``src``, convert, save to ``dst``; returns the report (``seconds`` covers load+save)."""
    src, dst = Path(src), Path(dst)
    options = options or ConversionOptions()
    start = time.perf_counter()
    size = src.stat().st_size if src.is_file() else 0
    if src.is_file():
        _writable(dst)
    if size > LARGE_BYTES:
        with gc_paused():
            report = _convert_large(src, dst, options)
    else:
        with gc_paused():  # see converter.gc_paused: covers the load and the save too
            model, external = load_model(src)
            result = convert_model(model, options)
            tmp = _atomic_dst(dst)
            try:
                if external or size > LARGE_BYTES // 2 and _initializer_bytes(result.model) > LARGE_BYTES:
                    data_name = f"{dst.name}.data"
                    onnx.save(result.model, str(tmp), save_as_external_data=True, all_tensors_to_one_file=True,
                              location=data_name, size_threshold=1024)
                else:  # onnx.save would first walk every tensor looking for external data there is none of
                    tmp.write_bytes(result.model.SerializeToString())
                os.replace(tmp, dst)
            except OSError as exc:
                raise OutputError.cannot_write(dst, exc) from None
            finally:
                tmp.unlink(missing_ok=True)
        report = result.report
    report.seconds = time.perf_counter() - start
    return report


def _convert_large(src: Path, dst: Path, options: ConversionOptions) -> ConversionReport:
    """Models beyond one protobuf: onnx-ir keeps tensors lazy; external data stays external."""
    amp = AmpPass(options)
    if options.check_input:
        try:
            onnx.checker.check_model(str(src), full_check=True)  # as prepare does: strict type inference too
        except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError, ValueError) as exc:
            raise InvalidModelError(f"input model fails the ONNX checker: {str(exc).splitlines()[0]}") from None
    try:
        model = ir.load(str(src))
    except Exception as exc:  # noqa: BLE001 - any parse failure is bad input
        raise InvalidModelError(f"{src} is not a readable ONNX model: {exc}") from None
    from onnx_ir.passes.common import ShapeInferencePass

    ShapeInferencePass()(model)
    report = amp.call(model)
    if options.opset_planner() is not None:
        report.notes.append(f"opset upgrade is not applied to models over {LARGE_BYTES} bytes (streamed through "
                            f"onnx-ir); converted at opset {report.opset_out}")
    tmp = _atomic_dst(dst)
    try:
        ir.save(model, str(tmp), external_data=f"{dst.name}.data")
        os.replace(tmp, dst)
    except OSError as exc:
        raise OutputError.cannot_write(dst, exc) from None
    finally:
        tmp.unlink(missing_ok=True)
    return report


__all__ = ["convert_file", "load_model"]
