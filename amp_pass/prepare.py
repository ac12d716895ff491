"""Preparation: check the input, inline model-local functions, optionally upgrade the opset (see
``amp_pass.opset``), infer types, build the onnx-ir model.

The checker and ONNX type inference both serialise the whole model into C++; for a model of hundreds
of MB that costs more than the conversion.  They only need the graph, so they run on a *skeleton*: the
model without main-graph initializer data (each initializer becomes a typed graph input).  The inferred
skeleton is then deserialised and the original initializers are attached back, lazily and without a
copy.  Guarantees: the input proto is never modified; value types inside subgraphs and inlined
functions are inferred; bad input raises InvalidModelError naming the first problem.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import onnx
import onnx.inliner as onnx_inliner
import onnx_ir as ir
from onnx import helper

from amp_pass.errors import InvalidModelError
from amp_pass.opset import model_opset, upgrade


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _skeleton(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """The model without main-graph initializers, which become typed inputs; returns their names."""
    sk = onnx.ModelProto()
    for field in ("ir_version", "producer_name", "producer_version", "domain", "model_version", "doc_string"):
        setattr(sk, field, getattr(model, field))
    sk.opset_import.extend(model.opset_import)
    sk.metadata_props.extend(model.metadata_props)
    sk.functions.extend(model.functions)
    g, src = sk.graph, model.graph
    g.name, g.doc_string = src.name, src.doc_string
    g.node.extend(src.node)
    g.input.extend(src.input)
    g.output.extend(src.output)
    g.value_info.extend(src.value_info)
    g.sparse_initializer.extend(src.sparse_initializer)
    inputs = {v.name for v in src.input}
    moved: list[str] = []
    for t in src.initializer:
        if t.name in inputs:
            continue
        g.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
        moved.append(t.name)
    return sk, moved


def _check_initializers(model: onnx.ModelProto) -> None:
    """What the checker would verify on initializers, minus data sizes (reading them is a copy;
    a tensor whose data does not match its dims is reported when the pass reads it)."""
    for t in model.graph.initializer:
        if not t.name:
            raise InvalidModelError("input model fails the ONNX checker: an initializer has no name")
        if t.data_type == onnx.TensorProto.UNDEFINED:
            raise InvalidModelError(f"input model fails the ONNX checker: initializer {t.name} has no data type")


@dataclass
class Prepared:
    """The result of ``prepare_model``: the typed onnx-ir model and what preparation did to it."""

    model: ir.Model
    inlined: int
    opset_in: int | None
    opset_out: int | None
    notes: list[str] = field(default_factory=list)


def prepare(model: onnx.ModelProto, check: bool = True) -> tuple[ir.Model, int]:
    """An onnx-ir model with inferred types (functions inlined); returns it and how many were inlined.

    The model keeps its opset (see ``prepare_model`` for an opset upgrade)."""
    prepared = prepare_model(model, check)
    return prepared.model, prepared.inlined


def _infer(sk: onnx.ModelProto | bytes) -> onnx.ModelProto:
    try:
        return onnx.shape_inference.infer_shapes(sk)
    except (onnx.shape_inference.InferenceError, ValueError) as exc:
        raise InvalidModelError(f"input model fails ONNX type inference: {_first_line(exc)}") from None


def prepare_model(model: onnx.ModelProto, check: bool = True,
                  target_opset: Callable[[onnx.ModelProto], int | None] | None = None) -> Prepared:
    """Check, inline, optionally upgrade the opset, infer types and build the onnx-ir model.

    ``target_opset(skeleton)`` returns the default-domain opset to convert to (None: keep).  An
    upgrade that fails (version converter error, invalid result, failed type inference) keeps the
    original opset and adds a note; it never raises.  The skeleton is serialised once and the same
    bytes feed the checker and type inference when nothing changes it in between.
    """
    sk, moved = _skeleton(model)
    data = sk.SerializeToString()
    if check:
        try:
            onnx.checker.check_model(data)
        except (onnx.checker.ValidationError, ValueError) as exc:
            raise InvalidModelError(f"input model fails the ONNX checker: {_first_line(exc)}") from None
        _check_initializers(model)
    inlined = len(sk.functions)
    if inlined:
        sk = onnx_inliner.inline_local_functions(sk)
        data = sk.SerializeToString()
    opset_in = model_opset(sk)
    opset_out = opset_in
    notes: list[str] = []
    target = target_opset(sk) if target_opset is not None else None
    inferred: onnx.ModelProto | None = None
    if target is not None and target != opset_in:
        upgraded, note = upgrade(sk, target)
        if not note and not set(moved) <= {v.name for v in upgraded.graph.input}:
            note = f"opset upgrade {opset_in} -> {target} renamed initializers, kept opset {opset_in}"
        if note:
            notes.append(note)
        else:
            try:
                inferred = onnx.shape_inference.infer_shapes(upgraded)
                opset_out = target
            except (onnx.shape_inference.InferenceError, ValueError) as exc:
                notes.append(f"opset upgrade {opset_in} -> {target}: type inference failed on the upgraded "
                             f"model, kept opset {opset_in}: {_first_line(exc)}")
    if inferred is None:
        inferred = _infer(data)
    try:
        ir_model = ir.serde.deserialize_model(inferred)
    except Exception as exc:  # noqa: BLE001 - anything onnx-ir cannot read is bad input
        raise InvalidModelError(f"input model cannot be read into the IR: {_first_line(exc)}") from None
    graph = ir_model.graph
    by_name = {v.name: v for v in graph.inputs}
    originals = {t.name: t for t in model.graph.initializer}
    for name in moved:
        value = by_name[name]
        graph.inputs.remove(value)
        value.const_value = ir.serde.deserialize_tensor(originals[name])
        graph.register_initializer(value)
    for t in model.graph.initializer:  # initializers that are also graph inputs (IR < 4 style)
        if t.name not in moved and t.name in by_name:
            value = by_name[t.name]
            value.const_value = ir.serde.deserialize_tensor(t)
            graph.register_initializer(value)
    return Prepared(ir_model, inlined, opset_in, opset_out, notes)
