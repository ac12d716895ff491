"""`ampci sweep` embedded (local pool, SQLite) on a scratch history of the pass: ampci's own failures are ``error``
cells that are never a baseline nor a flaky flip and make the run neither green nor red, and a ``cuda`` cell on
this machine without a usable CUDA device is ``unmeasured``, said in one line, never ``pass``.

The infrastructure failure is injected as a sandbox that hides the interpreter's ``site-packages`` gives it: the
pass's process fails importing ``onnx.inliner``, a module the worker's interpreter has.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from service.cli.main import main
from service.db import Store
from service.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
CPU, CUDA = ("conv_net", "fp16", "default", "cpu"), ("conv_net", "fp16", "default", "cuda")
SWEEP = """name = "whose"
models = ["conv_net"]
dtypes = ["fp16"]
policies = ["default"]
targets = [{targets}]
repeats = 6
"""
HIDDEN = '''

def run_convert(args):  # noqa: ANN001, ANN201 - what a sandbox hiding site-packages gives
    raise ModuleNotFoundError("No module named 'onnx.inliner'")
'''


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=repo, check=True,
                          capture_output=True, text=True).stdout.strip()


def commit(repo: Path, message: str, append: tuple[str, str] = ("__init__.py", "")) -> str:
    name, text = append
    with open(repo / "amp_pass" / name, "a") as fh:
        fh.write(text or f"# {message}\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ("AMPCI_DATABASE_URL", "AMPCI_BROKER_URL", "AMPCI_THRESHOLDS_FILE", "AMPCI_AUTO_BISECT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AMPCI_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("AMPCI_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("AMPCI_JOB_TIMEOUT", "120")
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "amp_pass", repo / "amp_pass", ignore=shutil.ignore_patterns("__pycache__"))
    git(tmp_path, "init", "-q", "-b", "main", str(repo))
    monkeypatch.setenv("AMPCI_PASS_REPO", str(repo))
    return tmp_path


def sweep(capsys: pytest.CaptureFixture[str], env: Path, targets: str, *args: str) -> tuple[int, dict, str]:
    """Exit code, JSON output and stderr of one ``ampci sweep``."""
    (env / "sweep.toml").write_text(SWEEP.format(targets=targets))
    code = main(["sweep", "--config", str(env / "sweep.toml"), "--workers", "1", "--json", *args])
    got = capsys.readouterr()
    assert got.out.strip(), (code, got.err)
    return code, json.loads(got.out), got.err


def store_of(env: Path) -> Store:
    from service.orchestration.jobs import open_store

    return open_store(Settings(data_dir=env / "data"))


def test_ampcis_failures_are_error_cells_never_a_baseline_nor_flaky(env: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from service.orchestration.judge import run_verdict

    repo = env / "repo"
    base = commit(repo, "base")
    code, out, _ = sweep(capsys, env, '"cpu"', "--revision", base)
    assert code == 0 and [r["status"] for r in out["results"]] == ["pass"]
    broken = commit(repo, "sandbox hides site-packages", ("cli.py", HIDDEN))
    code, out, _ = sweep(capsys, env, '"cpu"', "--revision", broken)
    (result,) = out["results"]
    assert result["status"] == "error", result  # never convert_error: not the pass's failure
    assert result["message"].startswith("infrastructure: the sandbox cannot import onnx.inliner")
    store = store_of(env)
    verdict = run_verdict(store, out["run"]["id"])
    assert (verdict.state, code) == ("error", 1) and "re-run" in verdict.headline()
    assert verdict.decision.known_failures == () and not out["regressions"]
    git(repo, "revert", "--no-edit", "HEAD")
    fixed = commit(repo, "noise")
    code, out, _ = sweep(capsys, env, '"cpu"', "--revision", fixed, "--no-baseline-run")
    assert code == 0 and out["comparison"]["baseline_revisions"] == [base]  # the error result was skipped
    assert not store.regressions(run_id=out["run"]["id"], category="flaky")
    store.dispose()


def test_a_cuda_cell_without_a_cuda_device_is_unmeasured_and_said_in_one_line(
        env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from service.cli.worker_cmd import cuda_device_here
    from service.orchestration.judge import run_verdict

    if cuda_device_here():
        pytest.skip("this machine has a usable CUDA device")
    base = commit(env / "repo", "base")
    code, out, _ = sweep(capsys, env, '"cpu", "cuda"', "--revision", base)
    statuses = {tuple(r[k] for k in ("model", "dtype", "policy", "target")): r["status"] for r in out["results"]}
    assert statuses == {CPU: "pass", CUDA: "unmeasured"}  # never pass
    assert "1 cuda cell not measured: no CUDA device where they ran" in out["gate"]["reasons"]
    store = store_of(env)
    verdict = run_verdict(store, out["run"]["id"])
    assert (verdict.state, code) == ("error", 1)  # not green for the cuda cell, and not a failure of the pass
    assert run_verdict(store, out["run"]["id"]).decision.measured == 1
    store.dispose()
    code, out, _ = sweep(capsys, env, '"cpu"', "--revision", base)  # a CPU-only sweep of cpu cells still passes
    assert code == 0 and [r["status"] for r in out["results"]] == ["pass"]
