"""`ampci sweep` and `ampci bisect` on a scratch git history of the pass, embedded (local pool, SQLite):
revisions resolved through git, the baseline run for cells it lacks, new failing cells fail the gate,
one revision cache per repository, and a bisection driven to its first bad commit.

Each scratch repository holds a copy of this checkout's ``amp_pass/``; the injected bug makes every
conversion fail (``convert_error``), which the one synthetic cell swept (conv_net fp16) shows at once.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path

import pytest

from service.cli.main import main
from service.db import Store
from service.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
CELL = ("conv_net", "fp16", "default", "cpu")
SWEEP = """name = "gate"
models = ["conv_net"]
dtypes = ["fp16"]
policies = ["default"]
targets = ["cpu"]
repeats = 8
"""
BUG = '''

def run_convert(args):  # noqa: ANN001, ANN201 - BUG(test): every conversion fails
    raise RuntimeError("injected bug: conversion broken")
'''


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=repo, check=True,
                          capture_output=True, text=True).stdout.strip()


def make_repo(path: Path, bug: bool = False) -> str:
    """A repository whose first commit is this checkout's amp_pass (with the bug: broken); returns it."""
    shutil.copytree(ROOT / "amp_pass", path / "amp_pass", ignore=shutil.ignore_patterns("__pycache__"))
    git(path.parent, "init", "-q", "-b", "main", str(path))
    return commit(path, "base", bug=bug)


def commit(repo: Path, message: str, bug: bool = False) -> str:
    if bug:
        with open(repo / "amp_pass" / "cli.py", "a") as fh:
            fh.write(BUG)
    else:
        with open(repo / "amp_pass" / "__init__.py", "a") as fh:
            fh.write(f"# {message}\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")  # shared by the module's tests: models, revision clones


@pytest.fixture
def env(tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ("AMPCI_DATABASE_URL", "AMPCI_BROKER_URL", "AMPCI_THRESHOLDS_FILE", "AMPCI_AUTO_BISECT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AMPCI_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("AMPCI_CACHE_DIR", str(cache_dir))
    monkeypatch.setenv("AMPCI_JOB_TIMEOUT", "120")  # a midpoint that never finishes fails the test soon
    (tmp_path / "gate.toml").write_text(SWEEP)
    return tmp_path


def sweep(capsys: pytest.CaptureFixture[str], env: Path, *args: str) -> tuple[int, dict]:
    """Exit code and JSON output of one ``ampci sweep`` (stderr, when there is no JSON, under "stderr")."""
    code = main(["sweep", "--config", str(env / "gate.toml"), "--workers", "1", "--json", *args])
    got = capsys.readouterr()
    return code, (json.loads(got.out) if got.out.strip() else {"stderr": got.err})


def store_of(env: Path) -> Store:
    from service.orchestration.jobs import open_store

    return open_store(Settings(data_dir=env / "data"))


def test_revisions_resolve_through_git_and_the_baseline_runs_for_missing_cells(
        env: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    repo = env / "repo"
    base = make_repo(repo)
    git(repo, "tag", "v0")
    tip = commit(repo, "noise 1")
    git(repo, "branch", "some-branch", tip)
    monkeypatch.setenv("AMPCI_PASS_REPO", str(repo))
    # unknown names: one line, exit 2, nothing stored
    for args in (["--revision", "deadbeef"], ["--revision", "main", "--baseline", "deadbeef"],
                 ["--revision", "no-such-branch"], ["--baseline", "nope"]):
        code, out = sweep(capsys, env, *args)
        assert code == 2
        assert "unknown revision" in out["stderr"] and len(out["stderr"].strip().splitlines()) == 1
    store = store_of(env)
    assert store.list_runs() == []
    # a short sha and a tag; the baseline has no results: its run comes first, for the missing cell
    code, out = sweep(capsys, env, "--revision", tip[:8], "--baseline", "v0")
    assert out["run"]["revision_sha"] == tip and out["run"]["baseline_sha"] == base
    assert out["baseline_run"] is not None
    assert store.get_run(out["baseline_run"]).revision_sha == base
    assert [r.cell for r in store.results(run_id=out["baseline_run"])] == [CELL]
    assert out["comparison"]["compared"] == 1 and out["comparison"]["baseline_revisions"] == [base]
    assert out["gate"]["new_cell_failures"] == []
    # a branch and a short sha: the baseline has its result now, nothing more runs
    code, out = sweep(capsys, env, "--revision", "some-branch", "--baseline", base[:7])
    assert out["run"]["revision_sha"] == tip and out["baseline_run"] is None
    assert out["comparison"]["compared"] == 1
    assert len(store.list_runs()) == 3
    # ancestry comes from git although no webhook ever told us
    assert store.first_parent_path(tip, base) == [base, tip]
    # --no-baseline-run: a new baseline commit with no results stays without
    other = commit(repo, "noise 2")
    code, out = sweep(capsys, env, "--revision", "main", "--baseline", tip, "--no-baseline-run")
    assert out["run"]["revision_sha"] == other and out["baseline_run"] is None
    store.dispose()


def test_two_repositories_sharing_a_cache_test_their_own_head_and_new_failing_cells_fail(
        env: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    good, bad = env / "good", env / "bad"
    good_head = make_repo(good)
    bad_head = make_repo(bad, bug=True)  # its only commit: no parent, no baseline
    monkeypatch.setenv("AMPCI_PASS_REPO", str(good))
    code, out = sweep(capsys, env, "--revision", "HEAD", "--no-baseline-run")
    assert code == 0 and out["run"]["revision_sha"] == good_head
    assert [r["status"] for r in out["results"]] == ["pass"]
    monkeypatch.setenv("AMPCI_PASS_REPO", str(bad))  # another checkout, the same AMPCI_CACHE_DIR
    code, out = sweep(capsys, env, "--revision", "HEAD", "--no-baseline-run")
    assert out["run"]["revision_sha"] == bad_head
    assert [r["status"] for r in out["results"]] == ["convert_error"]
    # a new cell that fails has nothing to regress against, and still fails the gate
    assert out["comparison"]["compared"] == 0 and out["regressions"] == []
    assert code == 1 and out["gate"]["new_cell_failures"] == [list(CELL)]
    assert any(r.startswith("new cell fails: conv_net/fp16/default/cpu convert_error") for r in out["gate"]["reasons"])


def test_embedded_bisect_names_the_bug_commit(env: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    repo = env / "repo"
    base = make_repo(repo)
    shas = [base]
    culprit_at = 4
    for i in range(1, 8):
        shas.append(commit(repo, f"BUG {i}" if i == culprit_at else f"noise {i}", bug=i == culprit_at))
    monkeypatch.setenv("AMPCI_PASS_REPO", str(repo))
    code, out = sweep(capsys, env, "--revision", "main", "--baseline", base)  # the baseline runs first
    assert code == 1 and out["baseline_run"] is not None
    (reg,) = [r for r in out["regressions"] if r["kind"] == "conversion"]
    assert reg["baseline_sha"] == base
    # a re-run of the (older) baseline revision does not resolve the tip's finding
    code, _ = sweep(capsys, env, "--revision", base)
    store = store_of(env)
    assert store.get_regression(reg["id"]).state == "open"
    code = main(["bisect", "--run", str(out["run"]["id"]), "--regression", str(reg["id"]), "--json",
                 "--workers", "1"])
    got = capsys.readouterr()
    assert code == 0, got.err
    (state,) = json.loads(got.out)
    assert state["status"] == "found" and state["first_bad"] == shas[culprit_at]
    n = len(shas) - 1  # commits after the baseline up to the regressed revision
    runs = store.list_runs(trigger="bisect")
    assert 1 <= state["midpoints"] == len(runs) <= math.ceil(math.log2(n))
    assert {r.revision_sha for r in runs} <= set(shas[1:-1])
    assert "testing" in got.err and shas[culprit_at][:12] in got.err  # progress on stderr
    assert store.get_regression(reg["id"]).state == "open"  # midpoints never resolve it
    # asked again: the answer is stored, nothing runs
    assert main(["bisect", "--run", str(out["run"]["id"]), "--regression", str(reg["id"])]) == 0
    assert f"first bad commit {shas[culprit_at]}" in capsys.readouterr().out
    assert len(store.list_runs(trigger="bisect")) == len(runs)
    store.dispose()

