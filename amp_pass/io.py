"""File-level conversion: load (with external data), convert, save atomically.

Guarantees: nothing is written at ``dst`` unless conversion succeeded (temporary file + rename);
a model stored with external data, or too large for one protobuf, is saved with external data next
to ``dst``; bad input raises InvalidModelError (exit_code 2) naming the problem.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
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


def convert_file(src: Path | str, dst: Path | str, options: ConversionOptions | None = None) -> ConversionReport:
    """Load ``src``, convert, save to ``dst``; returns the report (``seconds`` covers load+save).

    The temporary file the result is written to is made first, so an unwritable ``dst`` fails before
    any conversion work."""
    src, dst = Path(src), Path(dst)
    options = options or ConversionOptions()
    start = time.perf_counter()
    if not src.is_file():
        load_model(src)  # raises InvalidModelError naming the missing file
    size = src.stat().st_size
    tmp = _atomic_dst(dst)
    try:
        with gc_paused():  # see converter.gc_paused: covers the load and the save too
            if size > LARGE_BYTES:
                model_ir, report = _convert_large(src, options)
                _write(dst, lambda: ir.save(model_ir, str(tmp), external_data=f"{dst.name}.data"))
            else:
                model, external = load_model(src)
                result = convert_model(model, options)
                if external or size > LARGE_BYTES // 2 and _initializer_bytes(result.model) > LARGE_BYTES:
                    _write(dst, lambda: onnx.save(result.model, str(tmp), save_as_external_data=True,
                                                  all_tensors_to_one_file=True, location=f"{dst.name}.data",
                                                  size_threshold=1024))
                else:  # onnx.save would first walk every tensor looking for external data there is none of
                    _write(dst, lambda: tmp.write_bytes(result.model.SerializeToString()))
                report = result.report
            _write(dst, lambda: os.replace(tmp, dst))
    finally:
        tmp.unlink(missing_ok=True)
    report.seconds = time.perf_counter() - start
    return report


def _write(dst: Path, step: Callable[[], object]) -> None:
    """Run one step of writing ``dst``; an OSError becomes an OutputError naming ``dst``."""
    try:
        step()
    except OSError as exc:
        raise OutputError.cannot_write(dst, exc) from None


def _convert_large(src: Path, options: ConversionOptions) -> tuple[ir.Model, ConversionReport]:
    """Models beyond one protobuf: onnx-ir keeps tensors lazy (the caller saves with external data)."""
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
    return model, report


__all__ = ["convert_file", "load_model"]
