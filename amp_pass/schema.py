"""Operator schema type constraints at the model's opset: which inputs/outputs may change dtype.

A node may run low precision only on the type variables (``T``...) that (a) bind at least one fp32
output, (b) admit the low dtype in the schema at the model's opset, and (c) bind only fp32 values.
Inputs on other type variables (Resize scales/roi, BatchNormalization-15 mean/var, LayerNorm stash,
Range, ConstantOfShape value...) keep their dtype: they are pinned.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import onnx
import onnx_ir as ir

TYPE_STR = {ir.DataType.FLOAT16: "tensor(float16)", ir.DataType.BFLOAT16: "tensor(bfloat16)",
            ir.DataType.FLOAT: "tensor(float)"}


@dataclass(frozen=True)
class Slots:
    """Input and output positions that switch to the low dtype when the node runs low precision."""

    inputs: frozenset[int]
    outputs: frozenset[int]
    free_inputs: frozenset[int]  # positions whose type var binds only that input: any allowed dtype passes


@dataclass(frozen=True)
class _Formal:
    type_str: str
    variadic: bool


@lru_cache(maxsize=4096)
def _schema(op_type: str, domain: str, opset: int) -> tuple[tuple[_Formal, ...], tuple[_Formal, ...],
                                                          dict[str, frozenset[str]], int] | None:
    try:
        s = onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        return None
    var = onnx.defs.OpSchema.FormalParameterOption.Variadic
    ins = tuple(_Formal(p.type_str, p.option == var) for p in s.inputs)
    outs = tuple(_Formal(p.type_str, p.option == var) for p in s.outputs)
    cons = {c.type_param_str: frozenset(c.allowed_type_strs) for c in s.type_constraints}
    return ins, outs, cons, s.since_version


def _formal(formals: tuple[_Formal, ...], i: int) -> _Formal | None:
    if i < len(formals):
        return formals[i]
    if formals and formals[-1].variadic:
        return formals[-1]
    return None


def schema_version(node: ir.Node, opset: int) -> int | None:
    """The since_version of the node's schema at ``opset`` (None when ONNX has no schema for it)."""
    found = _schema(node.op_type, node.domain, opset)
    return None if found is None else found[3]


def low_slots(node: ir.Node, opset: int, low: ir.DataType) -> tuple[Slots | None, str]:
    """Positions that may switch to ``low`` for this node at ``opset``, or None with the reason why not.

    The result never lists a position whose schema type variable forbids ``low`` or is tied to a
    non-fp32 value, so switching exactly these positions keeps the node schema-valid.
    """
    key = (node.op_type, node.domain, opset, low, tuple(None if v is None else v.dtype for v in node.inputs),
           tuple(v.dtype for v in node.outputs))
    if key not in _SLOTS_CACHE:
        if len(_SLOTS_CACHE) > 100_000:
            _SLOTS_CACHE.clear()
        _SLOTS_CACHE[key] = _low_slots(node, opset, low)
    return _SLOTS_CACHE[key]


_SLOTS_CACHE: dict[tuple, tuple[Slots | None, str]] = {}


def _low_slots(node: ir.Node, opset: int, low: ir.DataType) -> tuple[Slots | None, str]:
    found = _schema(node.op_type, node.domain, opset)
    if found is None:
        return None, f"no ONNX schema for {node.domain or 'ai.onnx'}::{node.op_type} at opset {opset}"
    ins, outs, cons, since = found
    low_str = TYPE_STR[low]
    binds: dict[str, list[ir.DataType | None]] = {}
    for i, v in enumerate(node.inputs):
        f = _formal(ins, i)
        if v is not None and f is not None:
            binds.setdefault(f.type_str, []).append(v.dtype)
    out_vars: set[str] = set()
    for i, v in enumerate(node.outputs):
        f = _formal(outs, i)
        if f is not None:
            binds.setdefault(f.type_str, []).append(v.dtype)
            out_vars.add(f.type_str)
    primary: set[str] = set()
    forbidden: list[str] = []
    for tvar in out_vars:
        dtypes = binds[tvar]
        if ir.DataType.FLOAT not in dtypes:
            continue
        if any(d is not ir.DataType.FLOAT for d in dtypes):
            continue  # tied to an unknown or other dtype: leave this variable alone
        allowed = cons.get(tvar, frozenset({tvar}))
        if low_str not in allowed:
            forbidden.append(tvar)
            continue
        primary.add(tvar)
    if not primary:
        if forbidden:
            return None, f"schema: {node.op_type}-{since} does not accept {low_str} (opset {opset})"
        return None, "no fp32 output"
    in_pos = frozenset(i for i in range(len(node.inputs))
                       if (f := _formal(ins, i)) is not None and f.type_str in primary)
    out_pos = frozenset(i for i in range(len(node.outputs))
                        if (f := _formal(outs, i)) is not None and f.type_str in primary)
    return Slots(in_pos, out_pos, free_inputs(node, opset)), ""


def free_inputs(node: ir.Node, opset: int) -> frozenset[int]:
    """Inputs whose type variable binds nothing else and admits both fp16/bf16 and fp32.

    Such an input (Shape's data, Cast's input, Resize roi...) accepts whatever dtype its producer
    has, so no cast is needed in front of it.
    """
    found = _schema(node.op_type, node.domain, opset)
    if found is None:
        return frozenset()
    ins, outs, cons, _ = found
    counts: dict[str, int] = {}
    for i in range(len(node.inputs)):
        f = _formal(ins, i)
        if f is not None:
            counts[f.type_str] = counts.get(f.type_str, 0) + 1
    for i in range(len(node.outputs)):
        f = _formal(outs, i)
        if f is not None:
            counts[f.type_str] = counts.get(f.type_str, 0) + 2
    free = set()
    for i in range(len(node.inputs)):
        f = _formal(ins, i)
        if f is None or counts.get(f.type_str) != 1 or f.type_str not in cons:
            continue
        free.add(i)
    return frozenset(free)


def accepts(node: ir.Node, opset: int, index: int, dtype: ir.DataType, output: bool = False) -> bool:
    """Whether the schema admits ``dtype`` at input (or output) ``index``; True when unknown."""
    found = _schema(node.op_type, node.domain, opset)
    if found is None:
        return False
    ins, outs, cons, _ = found
    f = _formal(outs if output else ins, index)
    if f is None:
        return False
    allowed = cons.get(f.type_str)
    if allowed is None:
        return f.type_str == TYPE_STR.get(dtype, "")
    return TYPE_STR.get(dtype, "?") in allowed
