"""File-level conversion: load (with external data), convert, save atomically.

Guarantees: nothing is written at ``dst`` unless conversion succeeded (temporary file + rename);
the file at ``dst`` gets the mode a plain ``open(dst, "w")`` would give it (``0o666`` less the
process umask, not the ``0600`` of the temporary file); a model stored with external data, or too
large for one protobuf, is saved with external data next to ``dst``; bad input raises
InvalidModelError (exit_code 2) naming the problem in one line, and external data is only read from
regular files inside the model's folder (:class:`ExternalDataError` otherwise).
"""

from __future__ import annotations

import os
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath, PureWindowsPath

import onnx
import onnx_ir as ir
from google.protobuf.message import DecodeError
from onnx.external_data_helper import load_external_data_for_model

from amp_pass.converter import AmpPass, ConversionOptions, convert_model, gc_paused
from amp_pass.errors import InvalidModelError, OutputError
from amp_pass.report import ConversionReport

#: Above this size a model is handled through onnx-ir with lazy external tensors.
LARGE_BYTES = 1_500_000_000


class ExternalDataError(InvalidModelError):
    """A tensor's external data cannot be read safely: its location is absolute, leaves the model's
    folder, is a symbolic link or names no regular file.  Nothing is read from that location."""

    exit_code = 2


def _uses_external_data(model: onnx.ModelProto) -> bool:
    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in _tensors(model.graph))


def _tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Every tensor of ``graph`` and its subgraphs: initializers, sparse initializers, attribute tensors."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from _tensors(attr.g)
            for sub in attr.graphs:
                yield from _tensors(sub)


def check_external_data(model: onnx.ModelProto, base: Path) -> None:
    """Raise ExternalDataError unless every external tensor's location is a relative path to a regular
    file (not a symbolic link, nor through one) inside ``base``, the model's folder."""
    for tensor in _tensors(model.graph):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            check_location(tensor.name, next((e.value for e in tensor.external_data if e.key == "location"), ""),
                           base)


def check_location(tensor: str, location: str, base: Path) -> None:
    """Raise ExternalDataError unless ``location`` (of ``tensor``'s external data) is a relative path
    to a regular file inside ``base`` reached through no symbolic link."""
    what = f"external data of tensor {tensor[:80]!r} at {location[:200]!r}"
    if not location or "\x00" in location:
        raise ExternalDataError(f"{what}: no usable location")
    if PurePosixPath(location).is_absolute() or PureWindowsPath(location).is_absolute() \
            or PureWindowsPath(location).drive:
        raise ExternalDataError(f"{what}: an absolute path; external data must lie in the model's folder {base}")
    path = base / location
    if ".." in PurePosixPath(location).parts:
        raise ExternalDataError(f"{what}: points outside the model's folder {base}")
    if _through_link(base, PurePosixPath(location)):
        raise ExternalDataError(f"{what}: a symbolic link; external data must be a regular file")
    if not path.resolve().is_relative_to(base.resolve()):
        raise ExternalDataError(f"{what}: points outside the model's folder {base}")
    try:
        mode = path.stat().st_mode
    except OSError:
        raise ExternalDataError(f"{what}: no such file in {base}") from None
    if not stat.S_ISREG(mode):
        raise ExternalDataError(f"{what}: not a regular file")


def _check_ir_external_data(model: ir.Model, base: Path) -> None:
    """:func:`check_location` for every external initializer and attribute tensor of an onnx-ir model."""
    for graph in model.graphs():
        tensors = [v.const_value for v in graph.initializers.values()]
        tensors += [a.value for node in graph for a in node.attributes.values()
                    if a.type == ir.AttributeType.TENSOR]
        for t in tensors:
            if isinstance(t, ir.ExternalTensor):
                check_location(t.name or "", t.location, base)


def _through_link(base: Path, location: PurePosixPath) -> bool:
    """Whether any component of ``base / location`` below ``base`` is a symbolic link."""
    path = base
    for part in location.parts:
        path = path / part
        if path.is_symlink():
            return True
    return False


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
        check_external_data(model, src.parent)
        try:
            load_external_data_for_model(model, str(src.parent))
        except (OSError, ValueError, RuntimeError, onnx.checker.ValidationError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise InvalidModelError(f"cannot read external data of {src}: {first}") from None
    return model, external


def process_umask() -> int:
    """The process umask, read without changing it where Linux reports it (``/proc/self/status``);
    elsewhere set and restored at once."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def chmod_as_created(path: Path | str) -> None:
    """Give ``path`` (a temporary file from ``tempfile.mkstemp``, mode 0600) the mode a newly created
    plain file gets: ``0o666 & ~umask``."""
    os.chmod(path, 0o666 & ~process_umask())


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
    external_out = False
    try:
        with gc_paused():  # see converter.gc_paused: covers the load and the save too
            if size > LARGE_BYTES:
                model_ir, report = _convert_large(src, options)
                _write(dst, lambda: ir.save(model_ir, str(tmp), external_data=f"{dst.name}.data"))
            else:
                model, external = load_model(src)
                result = convert_model(model, options)
                external_out = external or size > LARGE_BYTES // 2 and _initializer_bytes(result.model) > LARGE_BYTES
                if external_out:
                    _write(dst, lambda: onnx.save(result.model, str(tmp), save_as_external_data=True,
                                                  all_tensors_to_one_file=True, location=f"{dst.name}.data",
                                                  size_threshold=1024))
                else:  # onnx.save would first walk every tensor looking for external data there is none of
                    _write(dst, lambda: tmp.write_bytes(result.model.SerializeToString()))
                report = result.report
            _write(dst, lambda: chmod_as_created(tmp))
            data = dst.parent / f"{dst.name}.data"  # onnx creates it 0600 too
            if (size > LARGE_BYTES or external_out) and data.is_file():
                _write(data, lambda: chmod_as_created(data))
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
    _check_ir_external_data(model, src.parent)  # before any lazy tensor is read
    from onnx_ir.passes.common import ShapeInferencePass

    ShapeInferencePass()(model)
    report = amp.call(model)
    if options.opset_planner() is not None:
        report.notes.append(f"opset upgrade is not applied to models over {LARGE_BYTES} bytes (streamed through "
                            f"onnx-ir); converted at opset {report.opset_out}")
    return model, report


__all__ = ["ExternalDataError", "check_external_data", "check_location", "chmod_as_created", "convert_file", "load_model",
           "process_umask"]
