"""Pass revisions: sha validation before git, hooks never run, LRU worktree cache, WORKTREE snapshots,
names resolved through git, one bare clone per repository."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from workers.revision.git_commands import RevisionError, validate_sha
from workers.revision.revisions import RevisionCache, describe, repo_key
from workers.revision.snapshots import content_key


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=repo, check=True,
                          capture_output=True, text=True).stdout.strip()


def _commit(repo: Path, value: str) -> str:
    (repo / "amp_pass").mkdir(parents=True, exist_ok=True)
    (repo / "amp_pass" / "__init__.py").write_text(f"VALUE = {value!r}\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", f"value {value}")
    return _git(repo, "rev-parse", "HEAD")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    r = tmp_path / "src"
    r.mkdir()
    _git(r, "init", "-q", "-b", "main")
    return r


@pytest.mark.parametrize("bad", ["", "HEAD", "abc123", "--upload-pack=touch /tmp/x", "G" * 40, "A" * 40,
                                 "0" * 39, "0" * 41, "0" * 40 + "\n"])
def test_invalid_shas_are_rejected_before_git(bad: str, tmp_path: Path) -> None:
    with pytest.raises(RevisionError):
        validate_sha(bad)
    cache = RevisionCache(str(tmp_path / "no-such-repo"), tmp_path / "cache")
    with pytest.raises(RevisionError, match="not a full commit sha|not a valid revision"):
        cache.checkout(bad)
    assert not cache.bare.exists()  # no git call was made


def test_checkout_gives_the_pass_at_each_revision(repo: Path, tmp_path: Path) -> None:
    one, two = _commit(repo, "one"), _commit(repo, "two")
    cache = RevisionCache(str(repo), tmp_path / "cache", size=4)
    assert cache.resolve("main") == two
    assert "VALUE = 'one'" in (cache.checkout(one) / "amp_pass" / "__init__.py").read_text()
    assert "VALUE = 'two'" in (cache.checkout(two) / "amp_pass" / "__init__.py").read_text()
    three = _commit(repo, "three")  # not in the bare clone yet: fetched on demand
    assert "three" in (cache.checkout(three) / "amp_pass" / "__init__.py").read_text()
    assert describe(cache, three)["parents"] == [two]
    with pytest.raises(RevisionError, match="not in the pass repository"):
        cache.checkout("0" * 40)


def test_lru_eviction_keeps_the_most_recently_used(repo: Path, tmp_path: Path) -> None:
    shas = [_commit(repo, str(i)) for i in range(4)]
    cache = RevisionCache(str(repo), tmp_path / "cache", size=2)
    cache.checkout(shas[0])
    cache.checkout(shas[1])
    cache.checkout(shas[0])  # touch: shas[1] is now least recently used
    cache.checkout(shas[2])
    assert cache.cached() == [shas[2], shas[0]]
    cache.checkout(shas[3])
    assert cache.cached() == [shas[3], shas[2]]
    worktrees = subprocess.run(["git", "worktree", "list"], cwd=cache.bare,
                               capture_output=True, text=True, check=True).stdout
    assert shas[0] not in worktrees and shas[3] in worktrees


def test_git_hooks_never_run(repo: Path, tmp_path: Path) -> None:
    one = _commit(repo, "one")
    cache = RevisionCache(str(repo), tmp_path / "cache")
    cache.resolve("main")  # creates the bare clone
    marker = tmp_path / "hook-ran"
    for hook in ("post-checkout", "reference-transaction", "post-index-change"):
        path = cache.bare / "hooks" / hook
        path.write_text(f"#!/bin/sh\ntouch {marker}\n")
        path.chmod(0o755)
    cache.checkout(one)
    two = _commit(repo, "two")
    cache.checkout(two)
    assert not marker.exists()


def test_worktree_snapshot_is_content_addressed(repo: Path, tmp_path: Path) -> None:
    _commit(repo, "one")
    (repo / "amp_pass" / "__init__.py").write_text("VALUE = 'dirty'\n")
    (repo / "amp_pass" / "__pycache__").mkdir()
    (repo / "amp_pass" / "__pycache__" / "x.pyc").write_bytes(b"ignored")
    cache = RevisionCache(str(repo), tmp_path / "cache")
    key = cache.snapshot(repo)
    assert len(key) == 64 and key == content_key(repo)
    assert "dirty" in (cache.checkout(key) / "amp_pass" / "__init__.py").read_text()
    assert cache.snapshot(repo) == key
    (repo / "amp_pass" / "__init__.py").write_text("VALUE = 'dirtier'\n")
    assert cache.snapshot(repo) != key
    with pytest.raises(RevisionError, match="not on this machine"):
        RevisionCache(str(repo), tmp_path / "other").checkout(key)


def test_names_resolve_to_full_shas_through_git(repo: Path, tmp_path: Path) -> None:
    one = _commit(repo, "one")
    _git(repo, "tag", "v1", one)
    two = _commit(repo, "two")
    _git(repo, "branch", "some-branch", one)
    cache = RevisionCache(str(repo), tmp_path / "cache")
    assert cache.resolve("HEAD") == cache.resolve("main") == cache.resolve(two[:7]) == two
    assert cache.resolve("some-branch") == cache.resolve("v1") == cache.resolve(one[:10]) == one
    assert cache.resolve("HEAD~1") == one and cache.resolve(one) == one
    for unknown in ("deadbeef", "no-such-branch", "0" * 40):
        with pytest.raises(RevisionError, match="unknown revision|not in the pass repository"):
            cache.resolve(unknown)
    # a detached commit on no branch is fetched into the clone when named
    _git(repo, "checkout", "-q", "--detach")
    three = _commit(repo, "three")
    assert cache.resolve("HEAD") == three
    assert "three" in (cache.checkout(three) / "amp_pass" / "__init__.py").read_text()


def test_first_parents_follow_git_history(repo: Path, tmp_path: Path) -> None:
    shas = [_commit(repo, str(i)) for i in range(5)]
    _git(repo, "checkout", "-q", "-b", "side", shas[2])
    (repo / "side.txt").write_text("side\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "side")
    side = _git(repo, "rev-parse", "HEAD")
    _git(repo, "checkout", "-q", "main")
    _git(repo, "merge", "-q", "--no-ff", "-m", "merge side", "side")
    merge = _git(repo, "rev-parse", "HEAD")
    cache = RevisionCache(str(repo), tmp_path / "cache")
    chain = cache.first_parents(merge, depth=10)
    assert [c for c, _ in chain] == [merge, *reversed(shas)]
    assert chain[0][1] == (shas[-1], side) and chain[-1][1] == ()
    assert [c for c, _ in cache.first_parents(merge, depth=3)] == [merge, shas[4], shas[3]]


def test_each_repository_gets_its_own_clone(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for r in (a, b):
        r.mkdir()
        _git(r, "init", "-q", "-b", "main")
    head_a, head_b = _commit(a, "a"), _commit(b, "b")
    shared = tmp_path / "cache"
    ca, cb = RevisionCache(str(a), shared), RevisionCache(str(b), shared)
    assert ca.bare != cb.bare and repo_key(str(a)) != repo_key(str(b))
    assert repo_key(str(a)) == repo_key(str(a) + "/") == repo_key(str(b / ".." / "a"))
    assert ca.resolve("HEAD") == head_a and cb.resolve("HEAD") == head_b
    assert "'a'" in (ca.checkout(head_a) / "amp_pass" / "__init__.py").read_text()
    assert "'b'" in (cb.checkout(head_b) / "amp_pass" / "__init__.py").read_text()
    with pytest.raises(RevisionError, match="not in the pass repository"):
        cb.checkout(head_a)  # repo b does not have repo a's commit
    # a clone whose origin is another repository is never used
    _git(cb.bare, "config", "remote.origin.url", str(a))
    with pytest.raises(RevisionError, match="is a clone of"):
        cb.resolve("HEAD")


def test_a_worktree_half_made_by_a_killed_worker_is_made_again(repo: Path, tmp_path: Path) -> None:
    """`git worktree add` writes the worktree's .git file before the files: a worker killed in between
    (the compose deploy test kills one mid-job) must not leave a tree without the pass for later jobs."""
    sha = _commit(repo, "one")
    cache = RevisionCache(str(repo), tmp_path / "cache", size=4)
    tree = cache.checkout(sha)
    for item in tree.iterdir():  # what a kill during the checkout leaves: .git, no files, no use stamp,
        if item.name != ".git":  # and git's registration of the worktree still locked ("initializing")
            subprocess.run(["rm", "-rf", str(item)], check=True)
    (admin,) = (cache.bare / "worktrees").iterdir()
    (admin / "locked").write_text("initializing")
    again = RevisionCache(str(repo), tmp_path / "cache", size=4).checkout(sha)
    assert "VALUE = 'one'" in (again / "amp_pass" / "__init__.py").read_text()
