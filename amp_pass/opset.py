"""Opset planning: upgrade a model to the opset at which its compute ops accept the low dtype.

ONNX schemas admit bf16 late (MatMul/Gemm from 13, Conv/LSTM/GRU/RNN only from 22), so a bf16
conversion of an opset-9..16 model would leave every compute op fp32 (correctly, per schema).
``required_opset`` finds the lowest opset (at most ``MAX_OPSET``) at which every ALLOW op of the
model accepts the low dtype; ``upgrade`` moves the model there with ``onnx.version_converter``.

Guarantees: ``upgrade`` never raises for a model the converter cannot handle -- it returns the input
unchanged with a note saying why (for "auto" the conversion then runs at the original opset; an
explicit opset that cannot be reached is an ``OpsetError`` raised by ``amp_pass.prepare``); an upgraded model
passes the (non-full) ONNX checker and its ``ir_version`` is at least the one its opset needs; only
the default ONNX domain changes version.  Subgraphs (If/Loop/Scan bodies) are converted with their
graph.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import NamedTuple

import onnx
import onnx.version_converter as version_converter
from onnx import helper

from amp_pass.schema import _schema
from amp_pass.walk import iter_proto_nodes

#: The highest opset the planner upgrades to (bf16 Conv/LSTM/GRU/RNN arrive at 22).
MAX_OPSET = 22
AUTO, KEEP = "auto", "keep"
DEFAULT_DOMAINS = ("", "ai.onnx")


#: The C++ source location and assertion text the version converter prefixes its messages with.
_CPP_PREFIX = re.compile(r"^\S+\.(?:h|hpp|cc|cpp):\d+: \w+: Assertion `[^`]*` failed: ")


def _first_line(exc: BaseException) -> str:
    return _CPP_PREFIX.sub("", (str(exc).strip().splitlines() or [type(exc).__name__])[0])


def model_opset(model: onnx.ModelProto) -> int | None:
    """The default-domain opset of ``model`` (None when it imports none)."""
    for imp in model.opset_import:
        if imp.domain in DEFAULT_DOMAINS:
            return int(imp.version)
    return None


def _accepts_low(op_type: str, opset: int, type_str: str) -> bool:
    """Whether ``op_type``'s first output at ``opset`` may carry ``type_str``."""
    found = _schema(op_type, "", opset)
    if found is None or not found[1]:
        return False
    _, outs, cons, _ = found
    return type_str in cons.get(outs[0].type_str, frozenset({outs[0].type_str}))


def lowest_accepting_opset(op_type: str, start: int, type_str: str) -> int | None:
    """The lowest opset in ``[start, MAX_OPSET]`` at which ``op_type`` accepts ``type_str`` (None: never)."""
    for version in range(start, MAX_OPSET + 1):
        if _accepts_low(op_type, version, type_str):
            return version
    return None


def casts_accept(opset: int, type_str: str) -> bool:
    """Whether ``Cast`` at ``opset`` reads and writes ``type_str`` (bf16: from opset 13)."""
    return _accepts_low("Cast", opset, type_str)


def _has_float_io(model: onnx.ModelProto) -> bool:
    """Whether a main-graph input or output of ``model`` is a float32 tensor (on ``prepare``'s skeleton
    the initializers are inputs too: a model whose only float inputs are weights may be upgraded for
    nothing, never left invalid)."""
    return any(v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
               for v in (*model.graph.input, *model.graph.output) if v.type.HasField("tensor_type"))


def required_opset(model: onnx.ModelProto, low_type_str: str, is_allow: Callable[[str, str], bool],
                   low_io: bool = False) -> int:
    """The lowest opset (>= the model's, <= MAX_OPSET) at which every ALLOW op accepts the low dtype.

    ``is_allow(op_type, node_name)`` says whether the policy classes a default-domain node ALLOW.
    Ops that never accept the dtype up to MAX_OPSET do not raise the result (upgrading gains nothing).
    ``low_io`` (``keep_io_types=False``): the graph's float inputs and outputs become the low dtype, so
    the result is also at least the opset at which ``Cast`` carries it (bf16: 13), with or without ALLOW
    ops (the casts between those inputs and fp32 consumers need it).
    """
    current = model_opset(model)
    if current is None:
        return 0
    need = current
    if low_io and _has_float_io(model):
        version = lowest_accepting_opset("Cast", current, low_type_str)
        if version is not None:
            need = max(need, version)
    seen: set[str] = set()
    for node in iter_proto_nodes(model.graph):
        if node.domain not in DEFAULT_DOMAINS or not is_allow(node.op_type, node.name):
            continue
        if node.op_type in seen:
            continue
        seen.add(node.op_type)
        version = lowest_accepting_opset(node.op_type, current, low_type_str)
        if version is not None:
            need = max(need, version)
    return need


class UpgradeFailure(NamedTuple):
    """Why a model was not converted to ``target``: ``what`` happened, ``detail`` (the first line of the
    converter's error, or None); ``current`` is the model's opset (None: no default domain)."""

    current: int | None
    target: int
    what: str
    detail: str | None = None

    def note(self) -> str:
        """The report note of an "auto" upgrade that falls back to the model's opset."""
        kept = f", kept opset {self.current}" if self.current is not None else ""
        return f"{self.what}{kept}" + (f": {self.detail}" if self.detail else "")

    def error(self) -> str:
        """The one-line error of an explicit opset that cannot be honoured."""
        return f"cannot convert at opset {self.target}: {self.what}" + (f": {self.detail}" if self.detail else "")


def upgrade(model: onnx.ModelProto, target: int) -> tuple[onnx.ModelProto, UpgradeFailure | None]:
    """``model`` converted to default-domain opset ``target``, or ``model`` itself and why it was not.

    The returned model passes ``onnx.checker.check_model`` (without full_check); type inference is
    left to the caller, which must fall back to the original model if inference fails.
    """
    current = model_opset(model)
    if current is None:
        return model, UpgradeFailure(None, target, f"opset upgrade to {target} skipped: the model imports no "
                                                   "default ONNX domain")
    if current == target:
        return model, None
    try:
        out = version_converter.convert_version(model, target)
    except Exception as exc:  # noqa: BLE001 - the converter raises several C++ error types
        return model, UpgradeFailure(current, target, f"opset upgrade {current} -> {target} failed",
                                     _first_line(exc))
    if model_opset(out) != target:
        return model, UpgradeFailure(current, target, f"opset upgrade {current} -> {target} did not take effect")
    try:
        needed_ir = helper.find_min_ir_version_for(list(out.opset_import), ignore_unknown=True)
    except Exception:  # noqa: BLE001 - unknown domains: leave ir_version alone
        needed_ir = out.ir_version
    out.ir_version = max(out.ir_version, needed_ir)
    try:
        onnx.checker.check_model(out)
    except (onnx.checker.ValidationError, ValueError) as exc:
        return model, UpgradeFailure(current, target, f"opset upgrade {current} -> {target} produced an invalid "
                                                      "model", _first_line(exc))
    return out, None

