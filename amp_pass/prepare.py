"""Preparation: check the input, inline model-local functions, optionally upgrade the opset (see
``amp_pass.opset``), infer types, build the onnx-ir model.

The checker and ONNX type inference both serialise the whole model into C++; for a model of hundreds
of MB that costs more than the conversion.  They only need the graph, so they run on a *skeleton*: the
model without main-graph initializer data (each initializer, and each main-graph Constant node holding
a large tensor, becomes a typed graph input).  The inferred skeleton is then deserialised and the
original initializers and Constant nodes are attached back, lazily and without a copy; what the checker
would have verified on the parts left out (initializer names, IR<=3 inputs, Constant order) is checked
directly, and type inference runs in strict mode with type checks, as the checker's full check does.
Main-graph inputs that have an initializer of the same name (every weight of an IR 3 model, and of
models from older exporters) are made constants by default: removed from the graph inputs, as
onnxruntime's ``remove_initializer_from_input`` tool does, so the pass folds their casts as it does an
IR>=4 model's; the IR version is raised to 4 where it was lower (IR 3 requires every initializer to be
an input) and a note says so.
Guarantees: the input proto is never modified; value types inside subgraphs and inlined functions are inferred; bad
input raises InvalidModelError naming the first problem; an explicit opset that cannot be reached raises
OpsetError.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field

import onnx
import onnx.inliner as onnx_inliner
import onnx_ir as ir
from onnx import helper

from amp_pass.errors import InvalidModelError, OpsetError
from amp_pass.opset import UpgradeFailure, model_opset, upgrade
from amp_pass.protoio import Origins, read_model, supported
from amp_pass.tensor_data import SIZE_CHECK_BYTES, check_raw_size, raw_bytes_needed
from amp_pass.walk import iter_proto_nodes, proto_subgraphs


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


#: Main-graph Constant nodes holding at least this many bytes of tensor data are left out of the
#: skeleton like initializers (exporters such as Paddle2ONNX store every weight in one).
CONSTANT_BYTES = 1024


@dataclass
class _MovedConstant:
    node: onnx.NodeProto
    before: int | None  # index, among the skeleton's main-graph nodes, of the node it preceded
    at: int  # index among the model's main-graph nodes


def _movable(node: onnx.NodeProto) -> bool:
    if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or len(node.output) != 1:
        return False
    if len(node.attribute) != 1 or node.attribute[0].name != "value":
        return False
    t = node.attribute[0].t
    if node.attribute[0].type != onnx.AttributeProto.TENSOR or not node.output[0] or \
            t.data_location == onnx.TensorProto.EXTERNAL or not t.HasField("raw_data"):
        return False
    need = raw_bytes_needed(t)  # (not len(t.raw_data): reading it copies the data)
    return need is not None and need >= CONSTANT_BYTES


def _skeleton(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str], list[_MovedConstant]]:
    """The model without main-graph initializers and large Constant nodes, whose values become typed
    inputs; returns the skeleton, the initializer names and the Constant nodes left out."""
    sk = onnx.ModelProto()
    for name in ("ir_version", "producer_name", "producer_version", "domain", "model_version", "doc_string"):
        setattr(sk, name, getattr(model, name))
    sk.opset_import.extend(model.opset_import)
    sk.metadata_props.extend(model.metadata_props)
    sk.functions.extend(model.functions)
    g, src = sk.graph, model.graph
    if src.name:  # (proto2 fields: assigning "" would make an empty field present)
        g.name = src.name
    if src.doc_string:
        g.doc_string = src.doc_string
    constants: list[_MovedConstant] = []
    kept: list[onnx.NodeProto] = []
    for at, node in enumerate(src.node):
        if _movable(node):
            constants.append(_MovedConstant(node, len(kept), at))
        else:
            kept.append(node)
    g.node.extend(kept)
    for c in constants:
        if c.before == len(kept):
            c.before = None
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
    for c in constants:
        t = c.node.attribute[0].t
        g.input.append(helper.make_tensor_value_info(c.node.output[0], t.data_type, list(t.dims)))
    return sk, moved, constants


def _restore_constants(graph: ir.Graph, constants: list[_MovedConstant], same_nodes: bool,
                       origins: Origins | None = None) -> None:
    """Put the Constant nodes left out of the skeleton back in place of their stand-in graph inputs:
    at their original position when the node list is the skeleton's, else (after function inlining or
    an opset upgrade, which may add, drop or move nodes) at the top of the graph, which is always a
    valid topological position for a node without inputs."""
    if not constants:
        return
    by_name = {v.name: v for v in graph.inputs}
    nodes = list(graph)
    # the IR may leave out nodes (protoio's skip_opaque): positions are those of the nodes as read
    at = [origins.nodes[n].index for n in nodes] if origins is not None and origins.opaque_count else None
    for c in constants:
        stand_in = by_name[c.node.output[0]]
        node = ir.serde.deserialize_node(c.node)
        out = node.outputs[0]
        out.type, out.shape = stand_in.type, stand_in.shape
        graph.inputs.remove(stand_in)
        stand_in.replace_all_uses_with(out, replace_graph_outputs=True)
        if origins is not None:  # written back as the original node, with the stand-in's inferred type
            origins.adopt(node, c.node)
            if stand_in in origins.infos:
                origins.infos[out] = origins.infos[stand_in]
        anchor = None
        if same_nodes and c.before is not None:
            if at is None:
                anchor = nodes[c.before]
            elif (k := bisect.bisect_left(at, c.before)) < len(nodes):
                anchor = nodes[k]  # the first IR node read at or after the Constant's position
        if anchor is not None:
            graph.insert_before(anchor, node)
        elif same_nodes or not nodes:
            graph.append(node)
        else:
            graph.insert_before(nodes[0], node)


def _check_tensor_data(t: onnx.TensorProto, what: str) -> None:
    """The checker's data-size rules for ``t`` (held out of the skeleton), for tensors of up to
    SIZE_CHECK_BYTES; typed-data fields (and types sized otherwise) through the checker itself."""
    if t.data_location == onnx.TensorProto.EXTERNAL:
        return  # read (and sized) when the pass loads it
    need = raw_bytes_needed(t)
    if t.HasField("raw_data") and need is not None:
        if 0 < need <= SIZE_CHECK_BYTES:
            check_raw_size(t, what, need)
        return
    if need is not None and need > SIZE_CHECK_BYTES:
        return
    try:  # typed data fields (or a type sized otherwise): the checker's own rules, on a copy
        onnx.checker.check_tensor(t)
    except (onnx.checker.ValidationError, ValueError) as exc:
        raise InvalidModelError(f"input model fails the ONNX checker: {_first_line(exc)}") from None


def _check_initializers(model: onnx.ModelProto) -> None:
    """What the checker verifies on main-graph initializers and the skeleton (where they are graph
    inputs) cannot: names present and unique, a data type, enough data for the dims (see
    ``_check_tensor_data``), and -- up to IR version 3 -- each one also a graph input."""
    seen: set[str] = set()
    inputs = {v.name for v in model.graph.input} if model.ir_version <= 3 else None
    for t in model.graph.initializer:
        if not t.name:
            raise InvalidModelError("input model fails the ONNX checker: an initializer has no name")
        if t.name in seen:
            raise InvalidModelError(f"input model fails the ONNX checker: initializer name {t.name} is not unique")
        seen.add(t.name)
        if t.data_type == onnx.TensorProto.UNDEFINED:
            raise InvalidModelError(f"input model fails the ONNX checker: initializer {t.name} has no data type")
        _check_tensor_data(t, "initializer")
        if inputs is not None and t.name not in inputs:
            raise InvalidModelError(f"input model fails the ONNX checker: {t.name} in initializer but not in "
                                    f"graph input (required up to IR version 3; this model is IR version "
                                    f"{model.ir_version})")


def _names_read(node: onnx.NodeProto) -> list[str]:
    """Names ``node`` reads: its inputs and, inside its subgraphs, every node input and graph output
    (outer-scope values are read by name)."""
    names = list(node.input)
    for g in proto_subgraphs(node):
        names.extend(o.name for o in g.output)
        for n in iter_proto_nodes(g):
            names.extend(n.input)
            names.extend(o.name for sub in proto_subgraphs(n) for o in sub.output)
    return names


def _check_constant_order(model: onnx.ModelProto, constants: list[_MovedConstant]) -> None:
    """The skeleton turns the large Constant nodes it leaves out into graph inputs, defined before
    every node; check here what the checker would have: their data sizes, and that no node reads one
    before its Constant node."""
    if not constants:
        return
    for c in constants:
        _check_tensor_data(c.node.attribute[0].t, f"Constant node {c.node.name or c.node.output[0]!r} value")
    pending = {c.node.output[0] for c in constants}
    moved = {c.at for c in constants}
    for at, node in enumerate(model.graph.node):
        if at in moved:
            pending.discard(node.output[0])
            continue
        for name in _names_read(node):
            if name in pending:
                raise InvalidModelError("input model fails the ONNX checker: Nodes in a graph must be topologically "
                                        f"sorted, however input '{name}' of node {node.name or node.op_type!r} is "
                                        "not output of any previous nodes")


def _op_versions_agree(function: onnx.FunctionProto, a: int, b: int) -> bool:
    """Whether every default-domain op of ``function`` (subgraphs included) has the same schema at
    opsets ``a`` and ``b`` (so it means the same at either)."""
    for n in iter_proto_nodes(function):
        if n.domain in ("", "ai.onnx"):
            try:
                if onnx.defs.get_schema(n.op_type, a).since_version != onnx.defs.get_schema(n.op_type, b).since_version:
                    return False
            except onnx.defs.SchemaError:
                return False
    return True


def _inline(sk: onnx.ModelProto) -> onnx.ModelProto:
    """``sk`` with its model-local functions inlined (``sk`` itself may be modified).

    onnx's inliner refuses a function importing another version of the default opset than the model.
    When every op of the function has the same schema at both versions, the function's import is set to
    the model's (nothing changes meaning); otherwise the version converter is tried on the function."""
    model_version = model_opset(sk)
    for f in sk.functions:
        for imp in f.opset_import:
            if imp.domain in ("", "ai.onnx") and model_version is not None and imp.version != model_version and \
                    _op_versions_agree(f, imp.version, model_version):
                imp.version = model_version
    try:
        return onnx_inliner.inline_local_functions(sk, convert_version=True)
    except Exception as exc:  # noqa: BLE001 - the inliner and the version converter raise several types
        raise InvalidModelError(f"cannot inline the model's local functions: {_first_line(exc)}") from None


@dataclass
class Prepared:
    """The result of ``prepare_model``: the typed onnx-ir model and what preparation did to it."""

    model: ir.Model
    inlined: int
    opset_in: int | None
    opset_out: int | None
    notes: list[str] = field(default_factory=list)
    origins: Origins | None = None  # set when read by amp_pass.protoio (write back with protowrite.write_model)


def prepare(model: onnx.ModelProto, check: bool = True) -> tuple[ir.Model, int]:
    """An onnx-ir model with inferred types (functions inlined); returns it and how many were inlined.

    The model keeps its opset (see ``prepare_model`` for an opset upgrade)."""
    prepared = prepare_model(model, check)
    return prepared.model, prepared.inlined


def _infer(sk: onnx.ModelProto | bytes, strict: bool = False) -> onnx.ModelProto:
    """Type inference; ``strict`` is the checker's full check (type checks, an inference error raises)."""
    try:
        return onnx.shape_inference.infer_shapes(sk, check_type=strict, strict_mode=strict)
    except (onnx.shape_inference.InferenceError, ValueError) as exc:
        raise InvalidModelError(f"input model fails ONNX type inference: {_first_line(exc)}") from None


def _initializer_inputs_note(names: list[str], ir_in: int, ir_out: int) -> str:
    shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
    note = (f"{len(names)} initializer(s) also listed as graph inputs ({shown}) treated as constants and removed "
            "from the graph inputs (keep_initializer_inputs / --keep-initializer-inputs keeps them)")
    if ir_out != ir_in:
        note += f"; IR version {ir_in} -> {ir_out} (IR 3 requires every initializer to be a graph input)"
    return note


def prepare_model(model: onnx.ModelProto, check: bool = True,
                  target_opset: Callable[[onnx.ModelProto], int | None] | int | None = None,
                  lean: bool = False, shapes: bool = True, skip_opaque: bool = False,
                  keep_initializer_inputs: bool = False) -> Prepared:
    """Check, inline, optionally upgrade the opset, infer types and build the onnx-ir model.

    ``target_opset``: an int is an explicit opset, which must be reached (a failed conversion to it
    raises OpsetError naming why); a function ``target_opset(skeleton)`` returns the default-domain
    opset to convert to (None: keep), and an upgrade to it that fails (version converter error,
    invalid result, failed type inference) keeps the original opset and adds a note.  The skeleton is
    serialised once and the same bytes feed the checker and type inference when nothing changes it in
    between.  ``keep_initializer_inputs``: leave main-graph inputs that have an initializer as inputs
    (else they become constants; see the module docstring).

    ``lean``: build the IR with ``amp_pass.protoio.read_model`` when it supports the model (then
    ``Prepared.origins`` is set and the result should be written with ``protowrite.write_model``);
    ``shapes``: whether that IR carries value shapes (``onnx_ir.serde``'s always does); ``skip_opaque``:
    that IR leaves out the nodes the pass can never change (``protoio.read_model``).
    """
    sk, moved, constants = _skeleton(model)
    data = sk.SerializeToString()
    if check:
        _check_initializers(model)
        _check_constant_order(model, constants)
        try:
            onnx.checker.check_model(data)
        except (onnx.checker.ValidationError, ValueError) as exc:
            raise InvalidModelError(f"input model fails the ONNX checker: {_first_line(exc)}") from None
    inlined = len(sk.functions)
    if inlined:
        sk = _inline(sk)
        data = sk.SerializeToString()
    opset_in = model_opset(sk)
    opset_out = opset_in
    notes: list[str] = []
    explicit = isinstance(target_opset, int)
    target = target_opset if isinstance(target_opset, int) else \
        target_opset(sk) if target_opset is not None else None
    inferred: onnx.ModelProto | None = None
    if target is not None and target != opset_in:
        upgraded, failure = upgrade(sk, target)
        stand_ins = {t.name for t in model.graph.initializer} | {c.node.output[0] for c in constants}
        if failure is None and not stand_ins <= {v.name for v in upgraded.graph.input}:
            failure = UpgradeFailure(opset_in, target, f"opset upgrade {opset_in} -> {target} renamed initializers")
        if failure is None:
            try:
                inferred = onnx.shape_inference.infer_shapes(upgraded, check_type=check, strict_mode=check)
                opset_out = target
            except (onnx.shape_inference.InferenceError, ValueError) as exc:
                failure = UpgradeFailure(opset_in, target, f"opset upgrade {opset_in} -> {target}: type inference "
                                                           "failed on the upgraded model", _first_line(exc))
        if failure is not None:
            if explicit:
                raise OpsetError(failure.error())
            notes.append(failure.note())
    if inferred is None:
        inferred = _infer(data, strict=check)
    same_nodes = not inlined and opset_out == opset_in
    dropped: list[str] = []
    if not keep_initializer_inputs:
        given = {v.name for v in model.graph.input}
        dropped = [t.name for t in model.graph.initializer if t.name in given]
    ir_in = inferred.ir_version
    if dropped:
        inferred.ir_version = max(ir_in, 4)  # (inferred is our own proto, never the input)
        notes.append(_initializer_inputs_note(dropped, ir_in, inferred.ir_version))
    if lean and supported(inferred):
        inputs = {v.name for v in inferred.graph.input}
        tensors = {t.name: t for t in model.graph.initializer if t.name in inputs}
        extra = {name: tensors[name] for name in moved}
        extra.update((name, t) for name, t in tensors.items() if name not in extra)
        try:
            ir_model, origins = read_model(inferred, extra, frozenset(moved) | frozenset(dropped), shapes,
                                           skip_opaque)
        except Exception as exc:  # noqa: BLE001 - anything onnx-ir cannot read is bad input
            raise InvalidModelError(f"input model cannot be read into the IR: {_first_line(exc)}") from None
        _restore_constants(ir_model.graph, constants, same_nodes, origins)
        return Prepared(ir_model, inlined, opset_in, opset_out, notes, origins)
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
    as_constants = set(dropped)
    for t in model.graph.initializer:  # initializers that are also graph inputs (IR < 4 style)
        if t.name not in moved and t.name in by_name:
            value = by_name[t.name]
            value.const_value = ir.serde.deserialize_tensor(t)
            if t.name in as_constants:
                graph.inputs.remove(value)
            graph.register_initializer(value)
    _restore_constants(graph, constants, same_nodes)
    return Prepared(ir_model, inlined, opset_in, opset_out, notes)
