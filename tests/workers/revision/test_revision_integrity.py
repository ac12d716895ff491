"""Cached pass trees are verified before use: a worktree that differs from its commit is checked out
afresh, a snapshot that differs from its key is refused, and planted code never runs (issue 31)."""

from __future__ import annotations

import importlib.util
import logging
import marshal
import os
import subprocess
import sys
from pathlib import Path

import pytest

from workers.revision.git_commands import RevisionError
from workers.revision.revisions import RevisionCache

EVIL = "open({marker!r}, 'w').write('ran')\nVALUE = 'evil'\n"


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=repo, check=True,
                          capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    r = tmp_path / "src"
    (r / "amp_pass" / "sub").mkdir(parents=True)
    (r / "amp_pass" / "__init__.py").write_text("VALUE = 'one'\n")
    (r / "amp_pass" / "sub" / "__init__.py").write_text("")
    (r / ".gitignore").write_text("__pycache__/\n*.pyc\n")
    _git(r, "init", "-q", "-b", "main")
    _git(r, "add", "-A")
    _git(r, "commit", "-q", "-m", "one")
    return r


def _pass_value(root: Path) -> str:
    """``amp_pass.VALUE`` as the conversion subprocess imports it: ``root`` first on the path, no bytecode written."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(root), PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run([sys.executable, "-c", "import amp_pass; print(amp_pass.VALUE)"], cwd=root.parent,
                          env=env, capture_output=True, text=True, check=True).stdout.strip()


def _plant_bytecode(pkg: Path, marker: Path) -> None:
    """A ``__pycache__`` entry for ``pkg/__init__.py`` holding other code, stamped with the source's mtime
    and size so Python takes it instead of the source."""
    src = pkg / "__init__.py"
    st = src.stat()
    code = compile(EVIL.format(marker=str(marker)), str(src), "exec")
    data = (importlib.util.MAGIC_NUMBER + (0).to_bytes(4, "little") + int(st.st_mtime).to_bytes(4, "little")
            + (st.st_size & 0xFFFFFFFF).to_bytes(4, "little") + marshal.dumps(code))
    cached = Path(importlib.util.cache_from_source(str(src)))
    cached.parent.mkdir(exist_ok=True)
    cached.write_bytes(data)


def _tamper(tree: Path, how: str, marker: Path) -> None:
    init = tree / "amp_pass" / "__init__.py"
    if how == "appended":
        init.write_text(init.read_text() + EVIL.format(marker=str(marker)))
    elif how == "hidden_from_git_status":  # an edit git status does not show: the worktree's index says so
        init.write_text(init.read_text() + EVIL.format(marker=str(marker)))
        _git(tree, "update-index", "--assume-unchanged", "amp_pass/__init__.py")
        status = _git(tree, "status", "--porcelain", "--untracked-files=all", "--ignored")
        assert status == "?? .ampci-last-used"  # our use stamp only: the edit is invisible to git status
    elif how == "bytecode":  # ignored by .gitignore, read by the import system
        _plant_bytecode(tree / "amp_pass", marker)
    elif how == "sitecustomize":  # untracked, and run at the start of every interpreter with the tree on its path
        (tree / "sitecustomize.py").write_text(EVIL.format(marker=str(marker)))
    elif how == "module_replaced_by_link":
        evil = tree.parent / "evil.py"
        evil.write_text(EVIL.format(marker=str(marker)))
        init.unlink()
        init.symlink_to(evil)
    else:
        raise AssertionError(how)


@pytest.mark.parametrize("how", ["appended", "hidden_from_git_status", "bytecode", "sitecustomize",
                                 "module_replaced_by_link"])
def test_a_changed_worktree_is_checked_out_afresh_and_its_code_never_runs(
        repo: Path, tmp_path: Path, how: str, caplog: pytest.LogCaptureFixture) -> None:
    sha = _git(repo, "rev-parse", "HEAD")
    cache = RevisionCache(str(repo), tmp_path / "cache")
    tree = cache.checkout(sha)
    marker = tmp_path / "planted-code-ran"
    _tamper(tree, how, marker)
    _pass_value(tree)
    assert marker.exists()  # the planted code would run
    marker.unlink()
    with caplog.at_level(logging.WARNING, logger="workers.revision.revisions"):
        again = RevisionCache(str(repo), tmp_path / "cache").checkout(sha)
    assert again == tree
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [f"worktree {tree} differs from commit {sha}"]
    assert _pass_value(again) == "one" and not marker.exists()
    assert not (again / "sitecustomize.py").exists() and not (again / "amp_pass" / "__pycache__").exists()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="workers.revision.revisions"):
        assert cache.checkout(sha) == tree  # intact now: used as it is
    assert not caplog.records


def test_the_use_stamp_is_never_written_through_a_planted_link(repo: Path, tmp_path: Path) -> None:
    sha = _git(repo, "rev-parse", "HEAD")
    cache = RevisionCache(str(repo), tmp_path / "cache")
    tree = cache.checkout(sha)
    victim = tmp_path / "victim.py"
    victim.write_text("KEEP = 1\n")
    (tree / ".ampci-last-used").unlink()
    (tree / ".ampci-last-used").symlink_to(victim)
    assert cache.checkout(sha) == tree
    assert victim.read_text() == "KEEP = 1\n" and not (tree / ".ampci-last-used").is_symlink()


@pytest.mark.parametrize("how", ["edited", "bytecode", "sitecustomize"])
def test_a_changed_snapshot_is_refused_and_made_again(repo: Path, tmp_path: Path, how: str) -> None:
    (repo / "amp_pass" / "__init__.py").write_text("VALUE = 'dirty'\n")
    cache = RevisionCache(str(repo), tmp_path / "cache")
    key = cache.snapshot(repo)
    snap = cache.checkout(key)
    marker = tmp_path / "planted-code-ran"
    if how == "edited":
        (snap / "amp_pass" / "__init__.py").write_text(EVIL.format(marker=str(marker)))
    else:
        _tamper(snap, how, marker)
    _pass_value(snap)
    assert marker.exists()  # the planted code would run
    marker.unlink()
    with pytest.raises(RevisionError, match=f"worktree snapshot {key} at {snap} differs from its key"):
        cache.checkout(key)
    assert not snap.exists()
    assert cache.snapshot(repo) == key  # made again from the developer's tree
    assert _pass_value(cache.checkout(key)) == "dirty" and not marker.exists()
    if how != "edited":  # snapshot() itself checks a snapshot it finds
        _tamper(snap, how, marker)
        assert cache.snapshot(repo) == key and _pass_value(cache.checkout(key)) == "dirty" and not marker.exists()
