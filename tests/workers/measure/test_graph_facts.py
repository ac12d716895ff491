"""Graph facts are measured from the converted model, inside every subgraph, by the workers' own op list."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from amp_pass.converter import convert_model
from amp_pass.options import ConversionOptions
from tests.amp_pass import graphs as G
from tests.workers.fakes import fake_pass
from workers.measure.graph_facts import (
    COMPUTE_OPS,
    COMPUTE_OPS_VERSION,
    attach_report,
    count_graph,
    measure_graph,
)
from workers.result import GraphFacts, JobResult
from workers.revision.convert import convert_in_subprocess
from workers.zoo.synthetic import synthetic_model_path

LOW = {"fp16": T.FLOAT16, "bf16": T.BFLOAT16}


def test_every_compute_op_is_a_real_default_domain_schema() -> None:
    assert COMPUTE_OPS and all(onnx.defs.has(op) for op in COMPUTE_OPS)
    assert "MatMulInteger" not in COMPUTE_OPS  # integer compute is not float compute


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("build, compute", [(G.if_inside_loop, {"MatMul": 2}),
                                            (G.loop_with_captured_weights, {"MatMul": 2}),
                                            (G.scan_model, {"MatMul": 1}),
                                            (G.conv_loop_if, {"Conv": 1, "MatMul": 2})])
def test_compute_inside_if_loop_scan_bodies_is_counted_low(build, compute: dict[str, int], dtype: str) -> None:
    m = build()
    out = convert_model(m, ConversionOptions(dtype=dtype)).model
    onnx.checker.check_model(out, full_check=True)
    f = measure_graph(out, m, dtype)
    n = sum(compute.values())
    assert (f.compute_nodes, f.compute_low, f.low_precision_compute_fraction) == (n, n, 1.0)
    assert f.compute_by_op == {op: {"total": k, "low": k} for op, k in compute.items()}
    assert f.graphs > 1 and f.source == "measured" and f.compute_ops_version == COMPUTE_OPS_VERSION
    assert f.casts_total == f.casts_inserted > 0 and f.casts_original == 0
    unconverted = measure_graph(m, m, dtype)  # the fp32 model itself: same compute, none of it low
    assert (unconverted.compute_nodes, unconverted.compute_low) == (n, 0)
    assert unconverted.low_precision_compute_fraction == 0.0 and unconverted.casts_inserted == 0
    assert unconverted.nodes_kept_fp32 > 0 and unconverted.kept_fp32_by_op["MatMul"] == compute.get("MatMul")


def _nested_if_model(low: int) -> onnx.ModelProto:
    """If -> If -> MatMul two levels down, the MatMul's weight (outer scope) and output in ``low``;
    no value_info anywhere, so types inside the bodies come from inference and outer scopes only."""
    inner_then = h.make_graph([h.make_node("MatMul", ["Xl", "W"], ["mm"], name="deep_mm")], "inner_then", [],
                              [h.make_tensor_value_info("mm", low, [2, 4])])
    inner_else = h.make_graph([h.make_node("Identity", ["Xl"], ["id"])], "inner_else", [],
                              [h.make_tensor_value_info("id", low, [2, 4])])
    outer_then = h.make_graph([h.make_node("If", ["c"], ["r"], then_branch=inner_then, else_branch=inner_else)],
                              "outer_then", [], [h.make_tensor_value_info("r", low, [2, 4])])
    outer_else = h.make_graph([h.make_node("Identity", ["Xl"], ["e"])], "outer_else", [],
                              [h.make_tensor_value_info("e", low, [2, 4])])
    w = nh.from_array(np.ones((4, 4), np.float32), "W32")
    g = h.make_graph(
        [h.make_node("Cast", ["X"], ["Xl"], to=low), h.make_node("Cast", ["W32"], ["W"], to=low),
         h.make_node("If", ["c"], ["Yl"], then_branch=outer_then, else_branch=outer_else),
         h.make_node("Cast", ["Yl"], ["Y"], to=T.FLOAT)],
        "main", [h.make_tensor_value_info("X", T.FLOAT, [2, 4]), h.make_tensor_value_info("c", T.BOOL, [])],
        [h.make_tensor_value_info("Y", T.FLOAT, [2, 4])], [w])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(m, full_check=True)
    return m


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_nested_subgraph_compute_uses_outer_scope_types(dtype: str) -> None:
    m = _nested_if_model(LOW[dtype])
    c = count_graph(m, None, dtype)
    assert (c.compute_nodes, c.compute_low, c.graphs) == (1, 1, 5) and c.casts_total == 3
    other = "bf16" if dtype == "fp16" else "fp16"
    assert count_graph(m, None, other).compute_low == 0  # low means *the job's* dtype


def test_policy_denying_matmul_measures_no_low_compute_and_fraction_is_not_one(tmp_path: Path) -> None:
    policy = tmp_path / "deny_mm.toml"
    policy.write_text('[ops]\ndeny = ["MatMul"]\n')
    m = G.if_inside_loop()
    out = convert_model(m, ConversionOptions(dtype="fp16", policy=str(policy))).model
    f = measure_graph(out, m, "fp16")
    assert f.compute_nodes == 2 and f.compute_low == 0
    assert f.low_precision_compute_fraction == 0.0
    assert f.compute_by_op == {"MatMul": {"total": 2, "low": 0}} and f.kept_fp32_by_op["MatMul"] == 2


def test_no_compute_nodes_is_not_applicable_never_one() -> None:
    g = h.make_graph([h.make_node("Relu", ["X"], ["Y"])], "main", [h.make_tensor_value_info("X", T.FLOAT, [2])],
                     [h.make_tensor_value_info("Y", T.FLOAT, [2])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
    out = convert_model(m, ConversionOptions(dtype="fp16")).model
    f = measure_graph(out, m, "fp16")
    assert f.compute_nodes == 0 and f.low_precision_compute_fraction is None
    back = JobResult.from_json(JobResult(model="m", dtype="fp16", policy="default", target="cpu", status="pass",
                                         graph=f).to_json())
    assert back.graph is not None and back.graph.low_precision_compute_fraction is None


def test_original_casts_are_not_counted_as_inserted() -> None:
    m = G.existing_casts()
    before = count_graph(m, m, "fp16")
    assert before.casts_total == before.casts_original > 0 and before.casts_inserted == 0


def test_unknown_dtype_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown dtype 'fp8'"):
        count_graph(G.scan_model(), None, "fp8")


def test_a_lying_pass_report_is_information_only(tmp_path: Path) -> None:
    """The ``perturb`` fake returns the fp32 model and reports 100% compute coverage."""
    src, _ = synthetic_model_path("conv_net", 0, tmp_path / "cache")
    out = convert_in_subprocess(src, tmp_path / "out.onnx", tmp_path / "report.json", "fp16", "default", "cpu",
                                fake_pass(tmp_path / "pass", "perturb"), timeout_s=60.0, memory_bytes=1024**3,
                                repeats=3)
    assert out.status == "ok" and out.report["low_precision_compute_fraction"] == 1.0
    assert len(out.samples_s) == 3 and all(s > 0 for s in out.samples_s) and out.samples_s[0] == out.wall_s
    # the repeats' outputs and the pass's own stdout/stderr files are gone
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["out.onnx", "report.json"]
    original = onnx.load(str(src))
    f = attach_report(measure_graph(onnx.load(str(tmp_path / "out.onnx")), original, "fp16"),
                      {**out.report, "iterations": 100}, out.samples_s)
    assert f.compute_nodes > 0 and f.compute_low == 0 and f.low_precision_compute_fraction == 0.0
    assert f.pass_report["low_precision_compute_fraction"] == 1.0 and f.pass_report["compute_low"] == 1
    assert f.pass_iterations == 100 and f.pass_converged is False  # at the painter's limit: not converged
    assert f.convert_samples_s == [round(s, 6) for s in out.samples_s] and f.convert_seconds == f.convert_samples_s[0]


def test_repeats_stop_at_the_time_budget(tmp_path: Path) -> None:
    src, _ = synthetic_model_path("conv_net", 0, tmp_path / "cache")
    out = convert_in_subprocess(src, tmp_path / "out.onnx", tmp_path / "report.json", "fp16", "default", "cpu",
                                fake_pass(tmp_path / "pass", "perturb"), timeout_s=60.0, memory_bytes=1024**3,
                                repeats=5, repeat_budget_s=0.0)
    assert out.status == "ok" and len(out.samples_s) == 1


def test_report_convergence_and_iterations() -> None:
    f = attach_report(GraphFacts(), {"iterations": 3}, [0.5])
    assert (f.pass_iterations, f.pass_converged) == (3, True)
    f = attach_report(GraphFacts(), {"iterations": 7, "converged": False}, [0.5])
    assert (f.pass_iterations, f.pass_converged) == (7, False)
    f = attach_report(GraphFacts(), {}, [0.5])  # a report that does not say: unknown, not converged
    assert (f.pass_iterations, f.pass_converged) == (None, None)
    report = convert_model(G.scan_model(), ConversionOptions(dtype="fp16")).report.to_dict()
    assert report["converged"] is True and 0 < report["iterations"] < 100


def test_old_result_json_without_measured_fields_still_loads() -> None:
    old = {"model": "m", "dtype": "fp16", "policy": "default", "target": "cpu", "status": "pass",
           "schema_version": 1,
           "graph": {"nodes_total": 5, "nodes_low": 4, "casts_inserted": 2, "casts_removed": 0, "compute_nodes": 2,
                     "compute_low": 2, "low_precision_compute_fraction": 1.0, "kept_fp32": [],
                     "convert_seconds": 0.1, "some_future_key": 1}}
    r = JobResult.from_dict(old)
    assert r.graph is not None and r.graph.source == "report" and not r.graph.measured
    assert r.graph.compute_low == 2 and r.graph.low_precision_compute_fraction == 1.0
    assert r.graph.convert_samples_s == [] and r.graph.pass_iterations is None and r.graph.compute_by_op == {}
    assert JobResult.from_json(r.to_json()) == r
    old["graph"].update(compute_nodes=0, compute_low=0)  # the report's 1.0 for no compute was never a measurement
    assert JobResult.from_dict(old).graph.low_precision_compute_fraction is None  # type: ignore[union-attr]
    measured = GraphFacts(compute_nodes=3, compute_low=1, low_precision_compute_fraction=1 / 3,
                          compute_by_op={"MatMul": {"total": 3, "low": 1}}, convert_samples_s=[0.1, 0.2],
                          pass_iterations=4, pass_converged=True, compute_ops_version="1")
    r = JobResult(model="m", dtype="fp16", policy="default", target="cpu", status="pass", graph=measured)
    assert JobResult.from_json(r.to_json()) == r and r.graph is not None and r.graph.measured


def test_job_result_carries_measured_facts_not_the_report(tmp_path: Path) -> None:
    from tests.workers.fakes import write_manifest
    from workers.jobs.job import run_job
    from workers.jobs.spec import JobSpec
    from workers.revision.config import WorkerConfig

    zoo = write_manifest(tmp_path / "zoo.toml", '''
        [defaults.tolerance]
        fp16 = { atol = 1e-3, rtol = 1e-2 }

        [models.conv]
        source = { synthetic = "conv_net" }
        inputs.x = { shape = [4, 3, 32, 32] }
        ''')
    settings = WorkerConfig(cache_dir=tmp_path / "cache", latency_runs=2, latency_warmup=1, convert_repeats=2)
    r = run_job(JobSpec(model="conv", dtype="fp16", pass_root=fake_pass(tmp_path / "p", "perturb"), zoo_path=zoo),
                settings)
    assert r.graph is not None and r.graph.measured and r.graph.compute_nodes > 0
    assert r.graph.compute_low == 0 and r.graph.low_precision_compute_fraction == 0.0  # the fp32 model came back
    assert r.graph.pass_report["low_precision_compute_fraction"] == 1.0  # what the pass claimed
    assert len(r.graph.convert_samples_s) == 2 and r.graph.convert_seconds == r.graph.convert_samples_s[0]
    assert JobResult.from_json(r.to_json()) == r


def test_each_conversion_sample_is_paired_with_a_reference_workload(tmp_path: Path) -> None:
    """The conversion-time rule divides drift out by a revision-independent workload timed right after each
    conversion sample (as latency divides by the fp32 run); its scratch file does not stay behind."""
    src, _ = synthetic_model_path("conv_net", 0, tmp_path / "cache")
    out = convert_in_subprocess(src, tmp_path / "out.onnx", tmp_path / "report.json", "fp16", "default", "cpu",
                                fake_pass(tmp_path / "pass", "perturb"), timeout_s=60.0, memory_bytes=1024**3,
                                repeats=3, repeat_budget_s=120.0)  # the pairing is tested, not the budget
    # (under load a fake-pass conversion took 3.8 s, and the default 5 s budget stopped at 2 samples)
    assert out.status == "ok" and len(out.reference_s) == len(out.samples_s) == 3
    assert all(0 < r < 5 for r in out.reference_s)
    # the repeats' outputs and the pass's own stdout/stderr files are gone
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["out.onnx", "report.json"]
    f = attach_report(GraphFacts(), out.report, out.samples_s, out.reference_s)
    assert f.convert_reference_s == [round(r, 6) for r in out.reference_s]
    assert attach_report(GraphFacts(), {}, [0.5, 0.6], [0.1]).convert_reference_s == []  # unpaired: dropped
    single = convert_in_subprocess(src, tmp_path / "one.onnx", tmp_path / "one.json", "fp16", "default", "cpu",
                                   fake_pass(tmp_path / "pass", "perturb"), timeout_s=60.0, memory_bytes=1024**3)
    assert single.reference_s == []  # one conversion: nothing for the conversion-time rule, no reference
    r = JobResult(model="m", dtype="fp16", policy="default", target="cpu", status="pass", graph=f)
    assert JobResult.from_json(r.to_json()).graph.convert_reference_s == f.convert_reference_s  # type: ignore[union-attr]
