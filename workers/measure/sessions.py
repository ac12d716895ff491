"""onnxruntime sessions: one place that picks providers, silences probing and handles IR versions.

The only module (with :mod:`workers.measure.emulation`) that creates ``InferenceSession`` objects.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
from collections.abc import Iterator
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
_IR_RE = re.compile(r"max supported IR version: (\d+)")
_ORT_TYPES = {
    "tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
    "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int8)": np.int8,
    "tensor(uint8)": np.uint8, "tensor(bool)": np.bool_, "tensor(int16)": np.int16,
    "tensor(bfloat16)": ml_dtypes.bfloat16,
}

ort.set_default_logger_severity(3)


class SessionError(Exception):
    """onnxruntime could not load or run a model (message from onnxruntime, one line)."""


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Redirect the process's fd 2 (where onnxruntime's C++ logger writes) to /dev/null."""
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _probe_model() -> bytes:
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "probe",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8).SerializeToString()


@functools.cache
def cuda_usable() -> bool:
    """True only if the CUDA provider is built in *and* a session really gets it (probed silently, once)."""
    if CUDA not in ort.get_available_providers():
        return False
    so = ort.SessionOptions()
    so.log_severity_level = 4
    try:
        with _quiet_stderr():
            sess = ort.InferenceSession(_probe_model(), so, providers=[CUDA, CPU])
            ok = sess.get_providers()[0] == CUDA
            if ok:
                sess.run(None, {"x": np.ones(1, np.float32)})
    except Exception:  # noqa: BLE001 - any failure means "not usable"
        return False
    return ok


def providers_for(target: str) -> list[str]:
    """Providers for a job target (``cpu`` or ``cuda``); ``cuda`` without a usable GPU is an error."""
    if target == "cpu":
        return [CPU]
    if target == "cuda":
        if not cuda_usable():
            raise SessionError("target cuda requested but no usable CUDA device/provider on this machine")
        return [CUDA, CPU]
    raise SessionError(f"unknown target {target!r}; expected cpu or cuda")


def _model_bytes(model: onnx.ModelProto | bytes | Path) -> bytes:
    if isinstance(model, onnx.ModelProto):
        return model.SerializeToString()
    if isinstance(model, Path):
        return model.read_bytes()
    return model


def make_session(model: onnx.ModelProto | bytes | Path, target: str = "cpu", optimize: bool = True,
                 intra_op_threads: int = 0) -> ort.InferenceSession:
    """An InferenceSession for ``target``; raises :class:`SessionError` with onnxruntime's message.

    Guarantees: ``optimize=False`` sets ``ORT_DISABLE_ALL``; a model whose IR version is newer than
    this onnxruntime accepts is retried once with the highest IR version it does accept; CUDA
    sessions that silently fall back to CPU are rejected.
    """
    data = _model_bytes(model)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize
                                   else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    if intra_op_threads:
        so.intra_op_num_threads = intra_op_threads
    providers = providers_for(target)
    try:
        sess = _create(data, so, providers)
    except SessionError as exc:
        m = _IR_RE.search(str(exc))
        if not m:
            raise
        proto = onnx.ModelProto.FromString(data)
        proto.ir_version = int(m.group(1))
        sess = _create(proto.SerializeToString(), so, providers)
    if target == "cuda" and sess.get_providers()[0] != CUDA:
        raise SessionError("CUDA provider was not assigned to the session")
    return sess


def _create(data: bytes, so: ort.SessionOptions, providers: list[str]) -> ort.InferenceSession:
    try:
        with _quiet_stderr():
            return ort.InferenceSession(data, so, providers=providers)
    except Exception as exc:  # noqa: BLE001 - onnxruntime raises several unrelated types
        raise SessionError(_one_line(exc)) from None


def run_session(sess: ort.InferenceSession, feeds: dict[str, np.ndarray],
                names: list[str] | None = None) -> dict[str, np.ndarray]:
    """Run all outputs (``names``: the session's output names, when the caller has them already);
    return them by name; onnxruntime failures become :class:`SessionError`."""
    if names is None:
        names = output_names(sess)
    try:
        values = sess.run(names, feeds)
    except Exception as exc:  # noqa: BLE001
        raise SessionError(_one_line(exc)) from None
    return dict(zip(names, values, strict=True))


def output_names(sess: ort.InferenceSession) -> list[str]:
    """The session's output names, in order."""
    return [o.name for o in sess.get_outputs()]


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().replace("\n", " ")
    text = re.sub(r"\s+", " ", text)
    return f"{type(exc).__name__}: {text[:600]}"


def numpy_dtype(ort_type: str) -> type:
    """numpy dtype for an onnxruntime type string like ``tensor(float)``."""
    if ort_type not in _ORT_TYPES:
        raise SessionError(f"unsupported input type {ort_type}")
    return _ORT_TYPES[ort_type]
