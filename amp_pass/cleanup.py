"""Cast cleanup: remove no-op casts, fold consecutive casts when lossless, drop dead casts.

Guarantees: a chain ``Cast(Cast(x, A), B)`` is shortened to ``Cast(x, B)`` only when the first cast is
exactly representable (A is wider than x's float dtype), so results never change; a Cast to the
dtype its input already has is removed unless its output is a main-graph output (whose name must
stay); nothing outside Cast nodes is touched.
"""

from __future__ import annotations

import onnx_ir as ir

from amp_pass.walk import graph_list

_WIDTH = {ir.DataType.FLOAT16: 1, ir.DataType.BFLOAT16: 1, ir.DataType.FLOAT: 2, ir.DataType.DOUBLE: 3}


def _lossless(src: ir.DataType | None, mid: ir.DataType) -> bool:
    """Whether every ``src`` value converts to ``mid`` exactly (float widening only)."""
    if src is None or src not in _WIDTH or mid not in _WIDTH:
        return src is mid
    return src is mid or _WIDTH[mid] > _WIDTH[src]


def _is_cast(node: ir.Node | None) -> bool:
    return node is not None and node.op_type == "Cast" and node.domain in ("", "ai.onnx") and \
        "to" in node.attributes


def cleanup_casts(graph: ir.Graph, graphs: list[ir.Graph] | None = None) -> int:
    """Simplify casts in ``graph`` and all subgraphs (``graphs``: ``graph_list(graph)`` when the caller
    has it); return how many Cast nodes were removed."""
    removed = 0
    changed = True
    graphs = graphs if graphs is not None else graph_list(graph)
    while changed:
        changed = False
        for g in graphs:
            for node in list(g):
                if not _is_cast(node) or node.graph is not g:
                    continue
                src = node.inputs[0]
                if src is None:
                    continue
                first = src.producer()
                if _is_cast(first) and first is not None and first.inputs[0] is not None and \
                        _lossless(first.inputs[0].dtype, ir.DataType(first.attributes["to"].value)):
                    node.replace_input_with(0, first.inputs[0])
                    src = first.inputs[0]
                    changed = True
                out = node.outputs[0]
                if src.dtype is out.dtype and src.dtype is not None and not out.is_graph_output():
                    out.replace_all_uses_with(src)
                    g.remove(node, safe=True)
                    removed += 1
                    changed = True
                    continue
                if not out.uses() and not out.is_graph_output():
                    g.remove(node, safe=True)
                    removed += 1
                    changed = True
    return removed
