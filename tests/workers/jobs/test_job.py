"""``run_job`` ends every job with the right status and a precise message, and never raises."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import test_cache_dir
from tests.workers.fakes import fake_pass, write_manifest
from workers.jobs.job import run_job
from workers.jobs.spec import JobSpec
from workers.result import JobResult
from workers.revision.config import WorkerConfig

MANIFEST = '''
[defaults.tolerance]
fp16 = { atol = 1e-3, rtol = 1e-2 }

[models.rnn]
source = { synthetic = "stateful_rnn" }
inputs.x = { shape = [1, 8] }
inputs.h = { shape = [1, 32], dist = "zeros" }
stateful = { state = { h = "h_new" }, steps = 40, cap = 0.5 }

[models.leaky]
source = { synthetic = "leaky_integrator" }
inputs.x = { shape = [1, 8], dist = "uniform", low = 0.5, high = 1.5 }
inputs.s = { shape = [1, 8], dist = "zeros" }
stateful = { state = { s = "s_new" }, steps = 64, cap = 1000.0 }

[models.loop]
source = { synthetic = "loop_if" }
inputs.x = { shape = [1, 8] }
inputs.trip = { shape = [], dtype = "int64", value = 8 }
loop = { trip_input = "trip", output = "trace", steps = 48, cap = 0.5 }

[models.conv]
source = { synthetic = "conv_net" }
inputs.x = { shape = [4, 3, 32, 32] }
task = "top1"

[models.wrong_inputs]
source = { synthetic = "conv_net" }
inputs.image = { shape = [4, 3, 32, 32] }
'''


@pytest.fixture
def settings(tmp_path: Path) -> WorkerConfig:
    return WorkerConfig(cache_dir=tmp_path / "cache", latency_runs=2, latency_warmup=1,
                    convert_timeout=120.0)


@pytest.fixture
def zoo(tmp_path: Path) -> Path:
    return write_manifest(tmp_path / "zoo.toml", MANIFEST)


def _job(model: str, zoo: Path, settings: WorkerConfig, pass_root: Path | None, dtype: str = "fp16",
         target: str = "cpu") -> JobResult:
    result = run_job(JobSpec(model=model, dtype=dtype, target=target, pass_root=pass_root, zoo_path=zoo), settings)
    assert JobResult.from_json(result.to_json()) == result
    assert result.timings["total_s"] >= result.timings["exec_s"] > 0 or result.status not in ("pass",)
    assert result.environment["onnxruntime"] and result.environment["python"]
    return result


def test_pass_with_convergence_latency_graph_facts_and_cached_reference(tmp_path: Path, zoo: Path,
                                                                         settings: WorkerConfig) -> None:
    root = fake_pass(tmp_path / "naive", "naive_fp16")
    r = _job("rnn", zoo, settings, root)
    assert r.status == "pass", r.message
    assert r.accuracy is not None and r.accuracy.mode == "emulation" and r.accuracy.passed
    assert 0 < r.accuracy.worst.max_abs < 1e-2 and r.accuracy.worst.cosine > 0.999
    assert set(r.accuracy.per_output) == {"y", "h_new"}
    assert r.convergence is not None and r.convergence.steps == 40 and not r.convergence.diverged
    assert 0 < r.convergence.max_error < 0.05
    assert r.to_dict()["convergence"]["error_unit"] == "relative"  # stored with the result: never compared across units
    assert r.latency is not None and len(r.latency.samples_ms) == 2 and len(r.latency.fp32_samples_ms) == 2
    assert r.latency.p50_ms > 0 and r.latency.speedup > 0 and r.latency.peak_rss_mb
    assert r.graph is not None and r.graph.kept_fp32[0]["reason"] == "test"
    assert r.model_sha256 and r.timings["reference_cached"] == 0.0
    again = _job("rnn", zoo, settings, root)
    assert again.timings["reference_cached"] == 1.0
    assert again.accuracy is not None and again.accuracy.worst.max_abs == r.accuracy.worst.max_abs


def test_loop_model_convergence_over_the_trip_count(tmp_path: Path, zoo: Path, settings: WorkerConfig) -> None:
    r = _job("loop", zoo, settings, fake_pass(tmp_path / "naive", "naive_fp16"))
    assert r.status == "pass", r.message
    assert r.convergence is not None and r.convergence.steps == 48 and len(r.convergence.step_errors) == 48
    assert r.convergence.error_unit == "relative"
    assert not r.convergence.diverged and 0 < r.convergence.max_error < 0.05
    assert r.accuracy is not None and set(r.accuracy.per_output) == {"y", "trace"}


def test_model_built_to_diverge_in_fp16_is_diverged(tmp_path: Path, zoo: Path, settings: WorkerConfig) -> None:
    r = _job("leaky", zoo, settings, fake_pass(tmp_path / "naive", "naive_fp16"))
    assert r.status == "diverged", r.message
    assert r.convergence is not None and r.convergence.diverged and "grows steadily" in r.convergence.reason
    errors = r.convergence.step_errors
    assert errors[-1] > 2.5 * errors[len(errors) // 4]  # absolute drift ~t^2 on a state of size ~t: relative ~t


def test_inaccurate_conversion_is_fail_accuracy(tmp_path: Path, zoo: Path, settings: WorkerConfig) -> None:
    r = _job("conv", zoo, settings, fake_pass(tmp_path / "perturb", "perturb"))
    assert r.status == "fail_accuracy"
    assert "emulation: prob: max abs error" in r.message
    assert r.accuracy is not None and not r.accuracy.passed and r.accuracy.worst.task_metric is not None


@pytest.mark.parametrize(("behaviour", "status", "match"), [
    ("reject", "convert_error", "rejected the input: amp_pass: error: policy 'nope' does not exist"),
    ("internal", "convert_error", r"failed \(exit 1\): RuntimeError: walk: node has no producer"),
    ("no_model", "convert_error", "wrote no model"),
    ("invalid", "convert_error", "wrote an invalid model: .*Gemm"),
    ("segfault", "crash", "killed by SIGSEGV"),
    ("memory", "crash", "out of memory"),
    # whose failure: a dependency the worker's interpreter has but the sandbox could not import is ampci's ...
    ("hidden_dependency", "error", "^infrastructure: the sandbox cannot import onnx.inliner.*re-run"),
    # ... the pass's own module, or one no interpreter has, is the pass's
    ("own_import", "convert_error", "No module named 'amp_pass.no_such_module'"),
    ("missing_dependency", "convert_error", "No module named 'no_such_dependency_anywhere'"),
])
def test_pass_failures_become_statuses(tmp_path: Path, zoo: Path, settings: WorkerConfig, behaviour: str, status: str,
                                       match: str) -> None:
    import dataclasses

    limited = dataclasses.replace(settings, convert_memory=1024**3)
    r = _job("conv", zoo, limited, fake_pass(tmp_path / behaviour, behaviour))
    assert r.status == status
    assert pytest.importorskip("re").search(match, r.message), r.message
    assert r.accuracy is None and r.latency is None
    if behaviour == "internal":  # the pass's own traceback, not only its last line (issue 43)
        lines = r.stderr_tail.splitlines()
        assert lines[0].startswith("Traceback") and lines[-1] == "RuntimeError: walk: node has no producer"
        assert JobResult.from_json(r.to_json()).stderr_tail == r.stderr_tail


def test_hanging_pass_times_out(tmp_path: Path, zoo: Path, settings: WorkerConfig) -> None:
    import dataclasses

    t0 = time.monotonic()
    r = _job("conv", zoo, dataclasses.replace(settings, convert_timeout=1.5), fake_pass(tmp_path / "hang", "hang"))
    assert r.status == "timeout" and "1.5s" in r.message
    assert time.monotonic() - t0 < 30


def _local_entry(tmp_path: Path, name: str, data: bytes, inputs: str) -> Path:
    (tmp_path / f"{name}.onnx").write_bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    return write_manifest(tmp_path / f"{name}.toml", f'''
        [models.{name}]
        source = {{ path = "{name}.onnx" }}
        sha256 = "{sha}"
        {inputs}
    ''')


def test_bad_model_missing_or_corrupt_file(tmp_path: Path, settings: WorkerConfig) -> None:
    man = _local_entry(tmp_path, "corrupt", b"\x08\x07garbage" * 10, "inputs.x = { shape = [1] }")
    r = _job("corrupt", man, settings, None)
    assert r.status == "bad_model" and "corrupt.onnx is not a valid ONNX model" in r.message
    (tmp_path / "corrupt.onnx").unlink()
    r = _job("corrupt", man, settings, None)
    assert r.status == "bad_model" and "does not exist" in r.message


def test_bad_spec_unknown_dtype_model_target_and_wrong_inputs(zoo: Path, settings: WorkerConfig) -> None:
    assert "unknown dtype 'fp8'" in _job("conv", zoo, settings, None, dtype="fp8").message
    r = run_job(JobSpec(model="conv", dtype="fp16", target="tpu", zoo_path=zoo), settings)
    assert r.status == "bad_spec" and "unknown target 'tpu'" in r.message
    r = _job("nope", zoo, settings, None)
    assert r.status == "bad_spec" and "unknown model 'nope'" in r.message
    r = _job("wrong_inputs", zoo, settings, None)
    assert r.status == "bad_spec" and "model inputs without a spec: x" in r.message


def test_reference_error_when_fp32_model_cannot_run(tmp_path: Path, settings: WorkerConfig) -> None:
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [7])],
        [numpy_helper.from_array(np.array([7], np.int64), "shape")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    man = _local_entry(tmp_path, "broken", model.SerializeToString(), "inputs.x = { shape = [2, 3] }")
    r = _job("broken", man, settings, None)
    assert r.status == "reference_error" and "fp32 model" in r.message and "Reshape" in r.message


@pytest.mark.realmodel
@pytest.mark.slow
def test_real_stateful_model_with_if_subgraphs(tmp_path: Path, settings: WorkerConfig) -> None:
    """silero VAD (25 If nodes, LSTM state) converted by this checkout's pass: accurate and bounded."""
    import dataclasses

    real = dataclasses.replace(settings, cache_dir=test_cache_dir(), latency_runs=1)
    r = run_job(JobSpec(model="silero_vad", dtype="fp16", steps=24), real)
    if r.status == "bad_model" and "cannot fetch" in r.message:
        pytest.skip(r.message)
    assert r.status == "pass", r.message
    assert r.convergence is not None and r.convergence.steps == 24 and not r.convergence.diverged
    assert r.accuracy is not None and set(r.accuracy.per_output) == {"output", "stateN"}
    assert r.graph is not None and r.graph.nodes_total > 0


@pytest.mark.realmodel
@pytest.mark.slow
def test_real_stateful_model_in_bf16_judges_its_state_by_convergence(tmp_path: Path, settings: WorkerConfig) -> None:
    """silero VAD in bf16 (Conv/LSTM at opset 22): the speech probability is accurate and the LSTM state
    stays bounded relative to its own magnitude over 64 steps, so the job passes; held to the one-step
    tolerance (``judge_state = true``) the state's single-element error fails it, and says where."""
    import dataclasses

    from workers.zoo.manifest import load_zoo

    real = dataclasses.replace(settings, cache_dir=test_cache_dir(), latency_runs=1)
    r = run_job(JobSpec(model="silero_vad", dtype="bf16"), real)
    if r.status == "bad_model" and "cannot fetch" in r.message:
        pytest.skip(r.message)
    assert r.status == "pass", r.message
    assert r.graph is not None and r.graph.compute_low > 0  # bf16 compute really ran
    assert r.accuracy is not None and r.accuracy.not_judged == {"stateN": "state output: judged by the convergence check"}
    assert r.accuracy.per_output["output"].max_abs < 2e-3  # the task output
    assert r.accuracy.per_output["stateN"].max_abs > r.accuracy.per_output["output"].max_abs  # still measured
    assert r.convergence is not None and r.convergence.steps == 64 and not r.convergence.diverged
    assert r.convergence.max_error < 0.5

    entry = load_zoo().get("silero_vad")
    src = entry.source
    zoo = write_manifest(tmp_path / "zoo.toml", f"""
        [models.silero_vad]
        source = {{ package = "{src.ref}", member = "{src.member}" }}
        sha256 = "{entry.sha256}"
        inputs.input = {{ shape = [1, 512], dist = "normal", std = 0.1 }}
        inputs.state = {{ shape = [2, 1, 128], dist = "zeros" }}
        inputs.sr = {{ shape = [], dtype = "int64", dist = "constant", value = 16000 }}
        stateful = {{ state = {{ state = "stateN" }}, steps = 8, judge_state = true }}
        tolerance = {{ bf16 = {{ atol = 8e-3, rtol = 8e-2, min_cosine = 0.99 }} }}
        """)
    strict = run_job(JobSpec(model="silero_vad", dtype="bf16", zoo_path=zoo), real)
    assert strict.status == "fail_accuracy" and "stateN: max abs error" in strict.message, strict.message
    assert strict.accuracy is not None and strict.accuracy.not_judged == {}


def test_state_outputs_left_to_convergence_only_when_other_outputs_exist(tmp_path: Path) -> None:
    from workers.jobs.stateful import state_outputs_not_judged
    from workers.zoo.manifest import load_zoo

    base = 'source = { synthetic = "stateful_rnn" }\ninputs.x = { shape = [1, 8] }\ninputs.h = { shape = [1, 32] }\n'
    zoo = load_zoo(write_manifest(tmp_path / "zoo.toml", (
        f"[models.a]\n{base}stateful = {{ state = {{ h = 'h_new' }} }}\n"
        f"[models.b]\n{base}stateful = {{ state = {{ h = 'h_new' }}, judge_state = true }}\n"
        f"[models.c]\n{base}")))
    both = {"y": 0, "h_new": 0}
    assert state_outputs_not_judged(zoo.get("a"), both) == {"h_new": "state output: judged by the convergence check"}
    assert state_outputs_not_judged(zoo.get("a"), {"h_new": 0}) == {}  # only state: judged on it
    assert state_outputs_not_judged(zoo.get("b"), both) == {}
    assert state_outputs_not_judged(zoo.get("c"), both) == {}


def test_a_cuda_cell_without_a_cuda_device_is_unmeasured_never_pass(tmp_path: Path, zoo: Path,
                                                                    settings: WorkerConfig) -> None:
    from workers.measure.sessions import cuda_usable

    if cuda_usable():
        pytest.skip("this machine has a usable CUDA device")
    r = _job("conv", zoo, settings, fake_pass(tmp_path / "naive", "naive_fp16"), target="cuda")
    assert (r.status, r.target) == ("unmeasured", "cuda") and r.message.startswith("no CUDA device"), r.message
    assert r.accuracy is None and r.latency is None and r.graph is None  # nothing ran


def test_an_unwritable_cache_is_ampcis_failure(tmp_path: Path, zoo: Path, settings: WorkerConfig) -> None:
    import dataclasses

    blocked = tmp_path / "cache-is-a-file"
    blocked.write_text("not a directory")
    r = _job("conv", zoo, dataclasses.replace(settings, cache_dir=blocked), fake_pass(tmp_path / "n", "naive_fp16"))
    assert r.status == "error" and r.message.startswith("infrastructure: internal worker error"), r.message


@pytest.mark.parametrize("where", ["beside", "relative", "absolute"])
def test_external_data_the_pass_names_is_never_read_by_the_worker(tmp_path: Path, zoo: Path, settings: WorkerConfig,
                                                                   monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """Issue 40: a converted model whose initializer's external data is ``secret`` (a file in the worker's working
    directory: onnx.checker accepts it), ``../secret`` or an absolute path is a convert_error naming it; the
    secret's bytes appear nowhere in the result."""
    import struct

    work = tmp_path / "work"
    work.mkdir()
    secret = (work if where == "beside" else tmp_path) / "secret"
    secret.write_bytes(struct.pack("<f", 1234.5678))
    secret.chmod(0o600)
    monkeypatch.chdir(work)  # the worker's working directory: ../secret is beside it
    root = fake_pass(tmp_path / "ext", "external_secret")
    location = {"beside": "secret", "relative": "../secret", "absolute": str(secret)}[where]
    main = root / "amp_pass" / "__main__.py"  # the pass's code is the test's to write: the location baked in
    main.write_text(main.read_text().replace('"../secret"', repr(location)))
    r = _job("conv", zoo, settings, root)
    assert r.status == "convert_error", r
    assert "external data" in r.message and repr(location) in r.message, r.message
    assert "1234.56" not in r.to_json()
