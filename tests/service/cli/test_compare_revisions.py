"""``ampci compare`` takes revisions as ``--revision`` does (branch, tag, short sha, through git), and a
revision that exists without results says so, naming the revisions that have results."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from service.cli.main import main
from tests.service.factories import make_result, migrated_store, run_with

CELL = ("tiny_mlp", "fp16", "default", "cpu")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=repo, check=True,
                          capture_output=True, text=True).stdout.strip()


@pytest.fixture
def world(sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A pass repository main: c0 (tag v1) - c1 - c2, branch ``feature`` at c2; results at c0 and c2 only."""
    repo = tmp_path / "passrepo"
    (repo / "amp_pass").mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    shas = []
    for i in range(3):
        (repo / "amp_pass" / "__init__.py").write_text(f"VALUE = {i}\n")
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", f"c{i}")
        shas.append(_git(repo, "rev-parse", "HEAD"))
    _git(repo, "tag", "v1", shas[0])
    _git(repo, "branch", "feature", shas[2])
    store = migrated_store(sqlite_url)
    for i, sha in enumerate(shas):
        store.upsert_revision(sha, [shas[i - 1]] if i else [], "main", "t", f"c{i}")
    run_with(store, shas[0], [make_result(CELL)])
    run_with(store, shas[2], [make_result(CELL, max_abs=2e-3, seed=1)])
    store.dispose()
    for key, value in (("AMPCI_DATABASE_URL", sqlite_url), ("AMPCI_PASS_REPO", str(repo)),
                       ("AMPCI_CACHE_DIR", str(tmp_path / "cache")), ("AMPCI_DATA_DIR", str(tmp_path / "data"))):
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AMPCI_BROKER_URL", raising=False)
    return shas


def test_compare_takes_branches_and_tags(world: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "v1", "feature", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert (got["a"], got["b"]) == (world[0], world[2]) and len(got["cells"]) == 1
    assert main(["compare", "v1", "main", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["b"] == world[2]
    assert main(["compare", world[0][:7], "HEAD", "--json"]) == 0  # a short sha and HEAD of the pass repository
    assert json.loads(capsys.readouterr().out)["b"] == world[2]


def test_a_revision_without_results_says_so_naming_those_with_results(world: list[str],
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "v1", "main~1"]) == 2
    err = capsys.readouterr().err
    assert f"revision main~1 ({world[1][:12]}) exists but has no results" in err
    assert f"revisions with results (newest first): {world[2][:12]}, {world[0][:12]}" in err
    assert main(["compare", world[1], "main"]) == 2  # a full sha the store knows, without results
    assert "exists but has no results" in capsys.readouterr().err


def test_an_unknown_revision_is_one_clear_line(world: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "no-such-branch", "main"]) == 2
    err = capsys.readouterr().err.strip()
    assert "unknown revision no-such-branch: not in the results database, and no branch" in err and len(err.splitlines()) == 1
