"""``ampci convert --policy auto / --calibration-data``, ``python -m workers.revision.autoconvert``, and the job.

A job with policy ``auto`` runs the search in its conversion subprocess; a pass revision that makes
``auto`` keep more nodes fp32 shows up as a coverage regression of that cell.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from service.cli.main import main
from service.regressions.rules import CellSample, coverage_rule
from service.regressions.thresholds import Thresholds
from tests.auto.conftest import assert_valid
from tests.auto.models import feeds_for, overflow_chain
from workers.jobs.job import run_job
from workers.jobs.spec import JobSpec
from workers.result import JobResult
from workers.revision.config import WorkerConfig

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def hot(tmp_path: Path) -> Path:
    model = overflow_chain(layers=10, hot=3, width=128)
    path = tmp_path / "hot.onnx"
    onnx.save(model, str(path))
    np.savez(tmp_path / "hot.npz", **feeds_for(model))
    return path


def test_ampci_convert_policy_auto(hot: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, rep = tmp_path / "out.onnx", tmp_path / "rep.json"
    assert main(["convert", str(hot), "-o", str(out), "--policy", "auto", "--tolerance", "cosine=0.9995",
                 "--calibration-data", str(tmp_path / "hot.npz"), "--report", str(rep)]) == 0
    assert "auto met cosine=0.9995: 1 forced fp32" in capsys.readouterr().out
    data = json.loads(rep.read_text())
    assert data["policy"] == "auto" and data["low_precision_compute_fraction"] == 0.9
    assert data["auto"]["met"] and [f["node"] for f in data["auto"]["forced_fp32"]] == ["m3"]
    assert data["auto"]["default"]["cosine"] < 0.9 and data["auto"]["final"]["cosine"] >= 0.9995
    assert data["calibration"]["source"].endswith("hot.npz") and data["calibration"]["measured"]
    assert_valid(onnx.load(str(out)))


def test_ampci_convert_policy_auto_on_a_zoo_model_uses_zoo_inputs(tmp_path: Path, real_model_path) -> None:  # type: ignore[no-untyped-def]
    out, rep = tmp_path / "out.onnx", tmp_path / "rep.json"
    assert main(["convert", str(real_model_path("ppocr_mobile_cls")), "-o", str(out), "--policy", "auto",
                 "--report", str(rep)]) == 0
    data = json.loads(rep.read_text())
    assert data["calibration"]["source"] == "zoo:ppocr_mobile_cls"
    assert data["auto"]["met"] and data["auto"]["forced_fp32"] == [] and data["low_precision_compute_fraction"] == 1
    assert_valid(onnx.load(str(out)))


def test_ampci_convert_calibration_data_with_default_policy(hot: Path, tmp_path: Path) -> None:
    out, rep = tmp_path / "out.onnx", tmp_path / "rep.json"
    assert main(["convert", str(hot), "-o", str(out), "--calibration-data", str(tmp_path / "hot.npz"),
                 "--report", str(rep), "--json"]) == 0
    data = json.loads(rep.read_text())
    assert data["policy"] == "default" and "auto" not in data
    reasons = [k["reason"] for k in data["kept_fp32"] if k["reason"].startswith("calibration")]
    assert len(reasons) == 2 and "output 'm3' observed |x| max" in reasons[0]  # the MatMul
    assert "input 'm3' observed |x| max" in reasons[1]  # the Div reading it
    assert_valid(onnx.load(str(out)))


@pytest.mark.parametrize(("extra", "message"), [
    (["--policy", "auto", "--tolerance", "cosine=high"], "bad tolerance 'cosine=high'"),
    (["--calibration-data", "MISSING"], "cannot read calibration data"),
    (["--calibration-data", "WRONG"], "lacks model inputs: x"),
])
def test_bad_input_is_one_line_and_writes_nothing(hot: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  extra: list[str], message: str) -> None:
    np.savez(tmp_path / "wrong.npz", y=np.zeros(3, np.float32))
    extra = [{"MISSING": str(tmp_path / "none.npz"), "WRONG": str(tmp_path / "wrong.npz")}.get(a, a) for a in extra]
    out = tmp_path / "out.onnx"
    assert main(["convert", str(hot), "-o", str(out), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not out.exists()


def _revision_forcing_more(tmp_path: Path) -> Path:
    """A pass revision whose hook keeps every node of a forced node's op type fp32 (a coverage bug)."""
    root = tmp_path / "rev"
    shutil.copytree(ROOT / "amp_pass", root / "amp_pass", ignore=shutil.ignore_patterns("__pycache__"))
    cal = root / "amp_pass" / "calibration.py"
    text = cal.read_text()
    old = "    return {by_key[k]: (f\"{reason}: {k}\", True) for k in sorted(wanted)}\n"
    assert old in text
    cal.write_text(text.replace(old, old.replace("    return", "    ops = {by_key[k].op_type for k in wanted}\n"
                                                  "    by_key = {k: n for k, n in by_key.items() if n.op_type in ops}\n"
                                                  "    wanted = set(by_key)\n    return")))
    return root


def _sample(r: JobResult) -> CellSample:
    assert r.graph is not None
    return CellSample(status=r.status, low_precision_fraction=r.graph.low_precision_compute_fraction,
                      casts_inserted=r.graph.casts_inserted)


def _zoo_entry(model: Path, name: str, tmp_path: Path, body: str) -> tuple[Path, WorkerConfig]:
    """A manifest in ``tmp_path`` with entry ``name`` for the file ``model`` (``body``: its inputs etc.),
    and job settings with a private cache."""
    sha = hashlib.sha256(model.read_bytes()).hexdigest()
    zoo = tmp_path / "zoo.toml"
    zoo.write_text(f'[models.{name}]\nsource = {{ path = "{model.name}" }}\nsha256 = "{sha}"\n{body}')
    settings = WorkerConfig(cache_dir=tmp_path / "cache", latency_runs=2,
                        latency_warmup=1, convert_timeout=300.0)
    return zoo, settings


def test_job_policy_auto_and_coverage_regression(hot: Path, tmp_path: Path) -> None:
    zoo, settings = _zoo_entry(hot, "hot", tmp_path, 'inputs.x = { shape = [4, 128] }\n')
    default = run_job(JobSpec(model="hot", dtype="fp16", policy="default", zoo_path=zoo), settings)
    auto = run_job(JobSpec(model="hot", dtype="fp16", policy="auto", zoo_path=zoo), settings)
    assert default.status == "fail_accuracy", default.message
    assert auto.status == "pass", auto.message
    assert auto.graph is not None and auto.graph.compute_low == 9 and auto.graph.compute_nodes == 10
    assert any("auto: calibration: output 'm3'" in k["reason"] for k in auto.graph.kept_fp32)
    worse = run_job(JobSpec(model="hot", dtype="fp16", policy="auto", zoo_path=zoo,
                            pass_root=_revision_forcing_more(tmp_path), revision="bad"), settings)
    assert worse.status == "pass", worse.message
    assert worse.graph is not None and worse.graph.compute_low == 0
    findings = coverage_rule(_sample(auto), _sample(worse), Thresholds(), "hot", "fp16")
    assert [(f.kind, f.category, f.metric) for f in findings] == [("coverage", "regression",
                                                                   "low_precision_fraction")]


def test_autoconvert_module_exit_codes(hot: Path, tmp_path: Path) -> None:
    base = [sys.executable, "-m", "workers.revision.autoconvert", str(hot), "-o", str(tmp_path / "o.onnx")]
    ok = subprocess.run([*base, "--policy", "auto", "--report", str(tmp_path / "r.json")], cwd=ROOT,
                        capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert json.loads((tmp_path / "r.json").read_text())["calibration"]["source"].startswith("synthetic")
    bad = subprocess.run([*base, "--policy", "auto", "--dtype", "fp16", "--tolerance", "snr=3"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and bad.stderr.startswith("autoconvert: error: bad tolerance 'snr=3'")


def test_pass_revision_without_hooks_is_a_clean_convert_error(hot: Path, tmp_path: Path) -> None:
    from workers.revision.convert import convert_in_subprocess

    root = tmp_path / "old"
    shutil.copytree(ROOT / "amp_pass", root / "amp_pass", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "amp_pass" / "calibration.py").unlink()
    out = convert_in_subprocess(hot, tmp_path / "o.onnx", tmp_path / "r.json", "fp16", "auto", "cpu", root,
                                120.0, 8 * 1024**3)
    assert out.status == "convert_error" and "has no policy-auto hooks" in out.message, out.message
    assert "amp_pass.calibration" in out.message and not (tmp_path / "o.onnx").exists()


def test_job_policy_auto_searches_to_the_jobs_own_acceptance_rule(tmp_path: Path) -> None:
    """No overflow here: the default fp16 painting meets the search's default cosine, but not this zoo
    entry's strict max-abs tolerance.  The job hands its own rule to the search, so ``auto`` keeps
    enough nodes fp32 to pass the job, where a cosine-only search would have stopped at the default."""
    from workers.jobs.tolerance_search import search_tolerance
    from workers.measure.autosearch import Tolerance
    from workers.measure.metrics import Tolerance as JobTolerance
    from workers.measure.metrics import compare_outputs, judge
    from workers.zoo.manifest import load_zoo

    model = overflow_chain(layers=6, hot=99, width=64)  # no hot layer: plain MatMul+Tanh layers
    path = tmp_path / "plain.onnx"
    onnx.save(model, str(path))
    zoo, settings = _zoo_entry(path, "plain", tmp_path, 'inputs.x = { shape = [4, 64] }\n'
                               'tolerance = { fp16 = { atol = 1e-5, rtol = 1e-4 } }\n')
    default = run_job(JobSpec(model="plain", dtype="fp16", policy="default", zoo_path=zoo), settings)
    assert default.status == "fail_accuracy", default.message
    assert default.accuracy is not None and default.accuracy.worst.cosine > 0.9995  # the search default is met
    auto = run_job(JobSpec(model="plain", dtype="fp16", policy="auto", zoo_path=zoo), settings)
    assert auto.status == "pass", auto.message
    assert auto.graph is not None and 0 < auto.graph.compute_nodes - auto.graph.compute_low

    # the tolerance string bounds each output exactly where the job's judge does
    entry = load_zoo(zoo).get("plain")
    rng = np.random.default_rng(0)
    ref = {"y": rng.normal(size=(4, 64)).astype(np.float32)}
    base = {"y": ref["y"] + np.float32(1e-6)}
    text = search_tolerance(entry, "fp16", 3.0, ref, base)
    tol = Tolerance.parse(text)
    assert [n for n, _ in tol.output_max_abs] == ["y"] and str(Tolerance.parse(str(tol))) == str(tol)
    bound = dict(tol.output_max_abs)["y"]
    for delta, ok in ((0.999 * bound, True), (1.001 * bound, False)):
        got = {"y": (ref["y"].astype(np.float64) + np.where(np.arange(256).reshape(4, 64) == 7, delta, 0))}
        per, _ = compare_outputs(ref, got, base)
        job_ok, _ = judge(per, ref, JobTolerance(**{**vars(entry.tolerance_for("fp16")), "min_cosine": 0.0}), 3.0)
        assert job_ok is ok and tol.meets([(per["y"], 256)], ["y"]) is ok


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_autoconvert_outputs_honour_the_umask(hot: Path, tmp_path: Path, umask: int) -> None:
    """The auto path writes its model and report like a new file (0o666 & ~umask), not mkstemp's 0600."""
    out, rep = tmp_path / f"o{umask:o}.onnx", tmp_path / f"r{umask:o}.json"
    code = ("import os, runpy, sys; os.umask(int(sys.argv[1], 8)); sys.argv = ['autoconvert', *sys.argv[2:]]; "
            "runpy.run_module('workers.revision.autoconvert', run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", code, oct(umask), str(hot), "-o", str(out), "--report", str(rep),
                           "--calibration-data", str(tmp_path / "hot.npz"), "--tolerance", "cosine=0.9995"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for path in (out, rep):
        assert path.stat().st_mode & 0o777 == 0o666 & ~umask, (path, oct(path.stat().st_mode))
