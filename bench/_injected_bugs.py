"""Bug code that benchmarks and tests inject into a copy of ``amp_pass`` (appended to ``converter.py``, which
imports ``onnx``): one definition, so the bench that measures detection and the tests of the confirmation
job slow models down the same way.  Not a benchmark script (the leading underscore keeps it out of
``tests/test_bench_quick.py``)."""

from __future__ import annotations

#: Source of ``_redundant_work(model) -> model``: the model with its first output routed through a 400-step
#: Loop of exact no-ops (the same outputs, more work per inference; the trip count is the initializer
#: ``slow_trip``).  Needs ``onnx`` in the scope it is appended to or executed in.
REDUNDANT_LOOP_FN = '''

def _redundant_work(model: onnx.ModelProto) -> onnx.ModelProto:
    """BUG(latency): route the first output through a 400-step Loop of exact no-ops."""
    from onnx import TensorProto, helper

    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    out = g.output[0]
    inner = out.name + "__pre_slow"
    for n in g.node:
        for i, o in enumerate(n.output):
            if o == out.name:
                n.output[i] = inner
    elem = out.type.tensor_type.elem_type
    body = helper.make_graph(
        [helper.make_node("Sub", ["v", "v"], ["z"]), helper.make_node("Add", ["v", "z"], ["v_out"]),
         helper.make_node("Identity", ["c"], ["c_out"])],
        "slow_body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v", elem, None)],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", elem, None)])
    g.initializer.extend([helper.make_tensor("slow_trip", TensorProto.INT64, [], [400]),
                          helper.make_tensor("slow_cond", TensorProto.BOOL, [], [True])])
    g.node.append(helper.make_node("Loop", ["slow_trip", "slow_cond", inner], [out.name], body=body))
    return m
'''
