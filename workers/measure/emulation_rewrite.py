"""Faithful emulation of fp16/bf16 numerics on an fp32 device: the graph rewrite.

onnxruntime's CPU provider computes most fp16 ops in fp32 behind inserted casts and its graph
optimizer removes cast pairs, so an fp16 model run there hides overflow and rounding.  The
emulated model makes every rounding explicit instead: every low-precision (fp16/bf16) tensor
value becomes an fp32 value that has been rounded through its dtype (``Cast`` to the low type,
``Cast`` back to float), so each op reads rounded inputs, computes in fp32 and stores a rounded
output, which is what GPU kernels with fp32 accumulation do.

:func:`emulate_model` guarantees, for the returned model:

- no tensor of type fp16/bf16 remains anywhere except between the two Casts of a round trip;
- graph inputs that were fp32 stay fp32; low-precision graph inputs become fp32 inputs with the
  same name that are rounded on entry; graph outputs are fp32 and carry the rounded values;
- low-precision initializers, ``Constant``/``ConstantOfShape`` tensors and any other tensor
  attribute are converted to fp32 exactly (every fp16/bf16 number is an fp32 number);
- ``Cast``/``EyeLike``/``Random*``-style ``to``/``dtype`` attributes naming a low type are
  redirected to fp32 and followed by a round trip;
- values inside ``If``/``Loop``/``Scan`` bodies (and any other graph attribute) are treated the
  same way, with body inputs rounded on entry so body signatures stay consistent; model-local
  functions are inlined first so their values are covered too.

It only rewrites protobufs (no onnxruntime); :mod:`workers.measure.emulation` runs the result.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

import numpy as np
import onnx
import onnx.inliner
import onnx.shape_inference
from onnx import (
    AttributeProto,
    GraphProto,
    ModelProto,
    NodeProto,
    TensorProto,
    TypeProto,
    helper,
    numpy_helper,
)

#: Low-precision element types this module rounds through.
LOW_TYPES: frozenset[int] = frozenset({TensorProto.FLOAT16, TensorProto.BFLOAT16})
_DTYPE_ATTRS = frozenset({"to", "dtype"})
_DEFAULT_DOMAINS = frozenset({"", "ai.onnx"})


class EmulationError(Exception):
    """The model cannot be emulated faithfully (the message names the value or node)."""


def emulate_model(model: ModelProto) -> ModelProto:
    """Return an fp32 model that rounds every fp16/bf16 value through its dtype (see module doc).

    The input model is not modified.  Raises :class:`EmulationError` when the element type of a
    node output cannot be determined (the rounding would otherwise be silently skipped).
    """
    work = ModelProto()
    work.CopyFrom(model)
    if len(work.functions):
        work = onnx.inliner.inline_local_functions(work, convert_version=True)
    try:
        work = onnx.shape_inference.infer_shapes(work, check_type=False, strict_mode=False, data_prop=False)
    except Exception as exc:  # noqa: BLE001 - inference is a best effort; missing types are caught below
        raise EmulationError(f"shape inference failed: {exc}") from exc
    names = _Names(_all_names(work.graph))
    _rewrite_graph(work.graph, outer_types={}, renames={}, names=names, is_main=True)
    return work


def low_precision_inputs(model: ModelProto) -> dict[str, int]:
    """Main-graph inputs whose element type is fp16/bf16: name -> TensorProto elem type."""
    inits = {i.name for i in model.graph.initializer}
    return {i.name: i.type.tensor_type.elem_type for i in model.graph.input
            if i.name not in inits and i.type.HasField("tensor_type")
            and i.type.tensor_type.elem_type in LOW_TYPES}


# --------------------------------------------------------------------------- graph rewriting


class _Names:
    """Fresh, model-wide unique value names."""

    def __init__(self, taken: set[str]) -> None:
        self._taken = taken

    def fresh(self, base: str) -> str:
        for i in itertools.count():
            name = f"{base}__emu" if i == 0 else f"{base}__emu{i}"
            if name not in self._taken:
                self._taken.add(name)
                return name
        raise AssertionError("unreachable")


def _all_names(graph: GraphProto) -> set[str]:
    out: set[str] = set()
    for vi in itertools.chain(graph.input, graph.output, graph.value_info):
        out.add(vi.name)
    out.update(t.name for t in graph.initializer)
    for node in graph.node:
        out.update(node.input)
        out.update(node.output)
        out.add(node.name)
        for attr in node.attribute:
            for sub in _subgraphs(attr):
                out |= _all_names(sub)
    return out


def _subgraphs(attr: AttributeProto) -> list[GraphProto]:
    if attr.type == AttributeProto.GRAPH:
        return [attr.g]
    if attr.type == AttributeProto.GRAPHS:
        return list(attr.graphs)
    return []


_NON_TENSOR = -1  # a known type that is not a tensor (sequence, optional, map): never rounded


def _elem_type(tp: TypeProto) -> int | None:
    """Element type of a tensor type, ``_NON_TENSOR`` for other known types, None if unknown."""
    kind = tp.WhichOneof("value")
    if kind == "tensor_type":
        return tp.tensor_type.elem_type or None
    return _NON_TENSOR if kind else None


def _retype(tp: TypeProto) -> None:
    """Replace low element types by FLOAT, recursing into sequence/optional/map types."""
    kind = tp.WhichOneof("value")
    if kind == "tensor_type" and tp.tensor_type.elem_type in LOW_TYPES:
        tp.tensor_type.elem_type = TensorProto.FLOAT
    elif kind == "sparse_tensor_type" and tp.sparse_tensor_type.elem_type in LOW_TYPES:
        tp.sparse_tensor_type.elem_type = TensorProto.FLOAT
    elif kind == "sequence_type":
        _retype(tp.sequence_type.elem_type)
    elif kind == "optional_type":
        _retype(tp.optional_type.elem_type)
    elif kind == "map_type":
        _retype(tp.map_type.value_type)


def _to_float_tensor(t: TensorProto) -> TensorProto:
    """An exact fp32 copy of a low-precision tensor (same name, dims and values)."""
    arr = numpy_helper.to_array(t).astype(np.float32)
    out = numpy_helper.from_array(arr, t.name)
    if t.doc_string:
        out.doc_string = t.doc_string
    return out


def _convert_tensor_inplace(t: TensorProto) -> None:
    if t.data_type in LOW_TYPES:
        if t.data_location == TensorProto.EXTERNAL:
            raise EmulationError(f"tensor {t.name!r} is stored externally; load external data first")
        t.CopyFrom(_to_float_tensor(t))


def _round_trip(src: str, dst: str, low: int, names: _Names, tag: str) -> list[NodeProto]:
    mid = names.fresh(f"{dst}_low")
    return [
        helper.make_node("Cast", [src], [mid], to=low, name=names.fresh(f"{tag}_to_low")),
        helper.make_node("Cast", [mid], [dst], to=TensorProto.FLOAT, name=names.fresh(f"{tag}_to_f32")),
    ]


def _local_types(graph: GraphProto, outer: Mapping[str, int]) -> dict[str, int]:
    """Element types visible in ``graph``: outer scope, inputs, initializers, value_info, outputs."""
    types = dict(outer)
    for t in graph.initializer:
        types[t.name] = t.data_type
    for vi in itertools.chain(graph.input, graph.value_info, graph.output):
        et = _elem_type(vi.type)
        if et is not None:
            types[vi.name] = et
    return types


def _node_output_type(node: NodeProto, index: int, types: Mapping[str, int]) -> int | None:
    """Element type of a node output, from inference results or the node's own attributes."""
    name = node.output[index]
    if name in types:
        return types[name]
    attrs = {a.name: a for a in node.attribute}
    if node.domain in _DEFAULT_DOMAINS:
        if node.op_type == "Cast" and "to" in attrs:
            return attrs["to"].i
        if node.op_type == "Constant" and "value" in attrs:
            return attrs["value"].t.data_type
        if node.op_type == "CastLike" and len(node.input) > 1:
            return types.get(node.input[1])
    return None


def _rename_inputs(node: NodeProto, renames: Mapping[str, str]) -> None:
    for i, name in enumerate(node.input):
        if name in renames:
            node.input[i] = renames[name]


def _rewrite_graph(graph: GraphProto, outer_types: Mapping[str, int], renames: Mapping[str, str],
                   names: _Names, is_main: bool) -> None:
    """Rewrite ``graph`` in place.  ``renames`` maps outer names to the rounded value's name."""
    types = _local_types(graph, outer_types)
    renames = dict(renames)
    # Names defined in this graph shadow outer renames.
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    defined |= {o for n in graph.node for o in n.output}
    for name in defined:
        renames.pop(name, None)

    for t in graph.initializer:
        _convert_tensor_inplace(t)
    for st in graph.sparse_initializer:
        _convert_tensor_inplace(st.values)

    init_names = {t.name for t in graph.initializer}
    entry: list[NodeProto] = []
    for vi in graph.input:
        low = _elem_type(vi.type)
        if low not in LOW_TYPES or (is_main and vi.name in init_names):
            continue
        if is_main:
            # The name is the model's interface: keep it, round into a fresh name, rename uses.
            rounded = names.fresh(f"{vi.name}_rounded")
            entry += _round_trip(vi.name, rounded, low, names, vi.name)
            renames[vi.name] = rounded
        else:
            # Body inputs are positional: rename the input and produce the old name rounded.
            raw = names.fresh(f"{vi.name}_raw")
            entry += _round_trip(raw, vi.name, low, names, vi.name)
            vi.name = raw

    new_nodes: list[NodeProto] = list(entry)
    for node in graph.node:
        _rename_inputs(node, renames)
        visible = dict(types)
        for attr in node.attribute:
            _rewrite_attribute(node, attr, visible, renames, names)
        new_nodes.append(node)
        for idx, out in enumerate(node.output):
            if not out:
                continue
            et = _node_output_type(node, idx, types)
            if et is None:
                if _may_be_low(node, types):
                    raise EmulationError(
                        f"cannot determine the element type of {out!r} (output {idx} of "
                        f"{node.op_type} node {node.name!r}); emulation would skip its rounding")
                continue
            if et not in LOW_TYPES:
                continue
            if node.op_type == "Constant" and node.domain in _DEFAULT_DOMAINS:
                continue  # its tensor was converted exactly: already representable
            raw = names.fresh(f"{out}_raw")
            node.output[idx] = raw
            if node.op_type == "Cast" and node.domain in _DEFAULT_DOMAINS:
                # The model's own Cast to fp16/bf16 is the first half of the round trip.
                _set_int_attr(node, "to", et)
                new_nodes.append(helper.make_node("Cast", [raw], [out], to=TensorProto.FLOAT,
                                                  name=names.fresh(f"{out}_to_f32")))
            else:
                new_nodes += _round_trip(raw, out, et, names, out)
    del graph.node[:]
    graph.node.extend(new_nodes)

    for vi in itertools.chain(graph.input, graph.output, graph.value_info):
        _retype(vi.type)


def _may_be_low(node: NodeProto, types: Mapping[str, int]) -> bool:
    """Whether an untyped output could be low precision: any low input or low dtype attribute."""
    if any(types.get(i) in LOW_TYPES for i in node.input if i):
        return True
    for attr in node.attribute:
        if attr.name in _DTYPE_ATTRS and attr.type == AttributeProto.INT and attr.i in LOW_TYPES:
            return True
        if attr.type == AttributeProto.TENSOR and attr.t.data_type in LOW_TYPES:
            return True
        if _subgraphs(attr):
            return True
    return False


def _set_int_attr(node: NodeProto, name: str, value: int) -> None:
    for attr in node.attribute:
        if attr.name == name:
            attr.i = value


def _rewrite_attribute(node: NodeProto, attr: AttributeProto, visible: Mapping[str, int],
                       renames: Mapping[str, str], names: _Names) -> None:
    if attr.type == AttributeProto.TENSOR:
        _convert_tensor_inplace(attr.t)
    elif attr.type == AttributeProto.TENSORS:
        for t in attr.tensors:
            _convert_tensor_inplace(t)
    elif attr.type == AttributeProto.SPARSE_TENSOR:
        _convert_tensor_inplace(attr.sparse_tensor.values)
    elif (attr.type == AttributeProto.INT and attr.name in _DTYPE_ATTRS and attr.i in LOW_TYPES
          and node.domain in _DEFAULT_DOMAINS and node.op_type != "Cast"):
        # EyeLike/RandomNormal/... producing fp16: produce fp32, rounded by the output rule.
        attr.i = TensorProto.FLOAT
    for sub in _subgraphs(attr):
        _rewrite_graph(sub, visible, renames, names, is_main=False)

