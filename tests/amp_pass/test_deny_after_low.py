"""A deny-list op fed by a low-precision producer stays fp32 (the DENY branch of painting taints the node):
a Softmax after an fp16 MatMul reads fp32 through a cast, computes in fp32, and so does what follows it."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from tests.amp_pass.models import proto_graphs

LOW = {"fp16": T.FLOAT16, "bf16": T.BFLOAT16}


def _matmul_softmax_matmul() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w1 = onnx.numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), "W1")
    w2 = onnx.numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), "W2")
    g = h.make_graph(
        [h.make_node("MatMul", ["X", "W1"], ["mm1"], name="mm1"),
         h.make_node("Softmax", ["mm1"], ["sm"], axis=-1, name="softmax"),
         h.make_node("MatMul", ["sm", "W2"], ["Y"], name="mm2")],
        "deny_after_low", [h.make_tensor_value_info("X", T.FLOAT, [4, 16])],
        [h.make_tensor_value_info("Y", T.FLOAT, [4, 16])], [w1, w2])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


def _elem_types(m: onnx.ModelProto) -> dict[str, int]:
    """Element type of every value (graph inputs/outputs, value infos, initializers, cast outputs)."""
    out: dict[str, int] = {}
    for g in proto_graphs(m.graph):
        for v in list(g.input) + list(g.output) + list(g.value_info):
            out[v.name] = v.type.tensor_type.elem_type
        out.update({t.name: t.data_type for t in g.initializer})
        for n in g.node:
            if n.op_type == "Cast":
                out[n.output[0]] = next(a.i for a in n.attribute if a.name == "to")
    return out


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_softmax_after_low_precision_matmul_stays_fp32(convert, dtype: str) -> None:  # type: ignore[no-untyped-def]
    r = convert(_matmul_softmax_matmul(), dtype)
    m = r.model
    nodes = {n.name: n for n in m.graph.node}
    types = _elem_types(m)
    assert types[nodes["mm1"].output[0]] == LOW[dtype]  # the producer is low precision ...
    sm = nodes["softmax"]
    assert types[sm.input[0]] == T.FLOAT, "Softmax (DENY) reads its low-precision producer without a cast back"
    assert types[sm.output[0]] == T.FLOAT  # ... and the deny-list op computes in fp32
