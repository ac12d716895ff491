"""A push payload gives no parent links: a pushed merge or a truncated commit list is read from git.

GitHub's ``push`` payload lists at most 2,048 commits, oldest first, without parents, and a pushed merge lists
the merged branch's commits in line with the branch's own.  The delivery stores none of them as parents; before
the run is judged, the worker that finishes it reads the head's first-parent history with every parent link
from the webhook's repository (a bare repository served as ``file://``).  Each test goes from the delivery
(parsed as the intake does) through the dispatcher, the jobs' results and the finisher, on PostgreSQL, and
compares what is stored with ``git rev-list --parents``.
"""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from service.api.dispatch import RunDispatcher
from service.db import Store
from service.db.queries import first_parent_line
from service.github.events import RunRequest, parse_event
from service.orchestration import scheduler
from service.orchestration.jobs import complete_job, finish_if_complete
from service.orchestration.judge import baseline_revisions
from service.settings import Settings
from tests.service.api.helpers import REPO, encode, push_payload
from tests.service.factories import make_result, migrated_store, run_with

ZERO = "0" * 40


def _git(*args: str, cwd: Path) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()


def _commit(work: Path, name: str) -> str:
    (work / f"{name}.txt").write_text(name + "\n")
    _git("add", f"{name}.txt", cwd=work)
    _git("commit", "-q", "-m", name, cwd=work)
    return _git("rev-parse", "HEAD", cwd=work)


class _Repo:
    """main: A0 - A1 - M(merge of feature: A0 - F1 - F2) - C1 - C2 - C3 - C4, served bare as ``file://``."""

    def __init__(self, tmp: Path) -> None:
        work = tmp / "work"
        work.mkdir()
        _git("init", "-q", "-b", "main", cwd=work)
        self.a0 = _commit(work, "a0")
        _git("checkout", "-q", "-b", "feature", cwd=work)
        self.f1, self.f2 = _commit(work, "f1"), _commit(work, "f2")
        _git("checkout", "-q", "main", cwd=work)
        self.a1 = _commit(work, "a1")
        _git("merge", "-q", "--no-ff", "-m", "merge feature", "feature", cwd=work)
        self.m = _git("rev-parse", "HEAD", cwd=work)
        self.c = [_commit(work, f"c{i}") for i in range(1, 5)]
        self.work = work
        bare = tmp / "pass.git"
        _git("clone", "-q", "--bare", str(work), str(bare), cwd=tmp)
        self.url = f"file://{bare}"

    def parents(self, sha: str) -> tuple[str, ...]:
        return tuple(_git("rev-list", "--parents", "-n", "1", sha, cwd=self.work).split()[1:])

    def first_parents(self, sha: str) -> list[str]:
        return _git("rev-list", "--first-parent", sha, cwd=self.work).split()


CELL = ("conv_net", "fp16", "default", "cpu")


def _settings(pg_url: str, tmp: Path, **kw: Any) -> Settings:
    return Settings(**{**dict(database_url=pg_url, allowed_repos=REPO, tracked_branches="main,release",
                              github_api_url="http://127.0.0.1:9", baseline_runs=False, confirm_pairs=0,
                              pass_repo_allow_file=True, cache_dir=tmp / "cache"), **kw})


def _push_run(settings: Settings, store: Store, url: str, after: str, before: str, commits: list[str],
              branch: str = "main", created: bool = False, repo: _Repo | None = None) -> int:
    """Deliver a push (parsed as the intake parses it), dispatch it, write its jobs' results and finish it as a
    worker does; return the run id.  With ``repo``: while the run is queued, no link the delivery stored for the
    listed commits contradicts git (what other runs' baselines walk meanwhile)."""
    payload = push_payload(after, before=before, branch=branch, commits=commits, created=created)
    payload["repository"]["clone_url"] = url
    request = parse_event("push", encode(payload), settings)
    assert isinstance(request, RunRequest)
    plan = [c for c in scheduler.load_sweep(sweep="smoke").expand(scheduler.zoo_catalog()) if c.cell == CELL]
    dispatcher = RunDispatcher(settings, store, planner=lambda _: plan, dispatch=lambda *_: None, mode="broker")
    run_id = dispatcher.submit(request, request.dedup_key or after).run_id
    if repo is not None:
        queued = _stored_links(store, commits)
        assert queued == {s: repo.parents(s) for s in queued}
    for job in store.jobs(run_id):
        start = store.begin_job(job.id, "w:1")
        assert start is not None
        complete_job(store, start.run, start.job, make_result(job.cell))
    assert finish_if_complete(store, run_id, settings)
    return run_id


def _stored_links(store: Store, shas: list[str]) -> dict[str, tuple[str, ...]]:
    return {s: store.get_revision(s).parents for s in shas if store.get_revision(s).parents}


def _line(store: Store, sha: str) -> list[str]:
    with store.transaction() as conn:
        return [s for s, _ in first_parent_line(conn, sha, 50)]


@pytest.fixture
def repo(tmp_path: Path) -> _Repo:
    return _Repo(tmp_path)


def test_a_pushed_merge_is_linked_as_git_links_it(pg_url: str, tmp_path: Path, repo: _Repo) -> None:
    settings = _settings(pg_url, tmp_path)
    store = migrated_store(pg_url)
    try:
        run_with(store, repo.a1, [make_result(CELL)])
        # GitHub lists the merged branch's commits too, oldest first, then the merge
        run = _push_run(settings, store, repo.url, repo.m, repo.a1, [repo.f1, repo.f2, repo.m], repo=repo)
        everything = [repo.a0, repo.f1, repo.f2, repo.a1, repo.m]
        stored = _stored_links(store, everything)
        assert stored == {s: repo.parents(s) for s in stored}  # no link git does not have
        assert stored[repo.m] == (repo.a1, repo.f2)  # the merge: both parents, main's first
        assert _line(store, repo.m) == repo.first_parents(repo.m)  # the drift line: git's, not the branch's
        assert baseline_revisions(store, run) == {CELL: repo.a1}
        # the same merge on a new branch (no `before`): its baseline is found along git's first parents
        fresh = _push_run(settings, store, repo.url, repo.m, ZERO, [repo.f1, repo.f2, repo.m], branch="release",
                          created=True)
        assert baseline_revisions(store, fresh) == {CELL: repo.a1}
    finally:
        store.dispose()


def test_a_truncated_commit_list_is_completed_from_git(pg_url: str, tmp_path: Path, repo: _Repo) -> None:
    settings = _settings(pg_url, tmp_path)
    store = migrated_store(pg_url)
    try:
        run_with(store, repo.m, [make_result(CELL)])
        c1, c2, c3, c4 = repo.c
        # a new branch at c4 whose payload lists c3 and c4 only: its baseline is M, three commits past c3
        fresh = _push_run(settings, store, repo.url, c4, ZERO, [c3, c4], branch="release", created=True,
                           repo=repo)
        assert baseline_revisions(store, fresh) == {CELL: repo.m}
        # four commits pushed to main, the payload lists the last two only
        run = _push_run(settings, store, repo.url, c4, repo.m, [c3, c4], repo=repo)
        stored = _stored_links(store, [repo.m, *repo.c])
        assert stored == {s: repo.parents(s) for s in [repo.m, *repo.c]}
        assert _line(store, c4) == repo.first_parents(c4)
        assert baseline_revisions(store, run) == {CELL: repo.m}
    finally:
        store.dispose()


def test_a_repository_git_cannot_read_leaves_the_payloads_baseline_and_says_so(
        pg_url: str, tmp_path: Path, repo: _Repo, caplog: pytest.LogCaptureFixture) -> None:
    settings = _settings(pg_url, tmp_path)
    store = migrated_store(pg_url)
    try:
        run_with(store, repo.a1, [make_result(CELL)])
        caplog.set_level(logging.WARNING)
        gone = f"file://{tmp_path / 'gone.git'}"
        run = _push_run(settings, store, gone, repo.m, repo.a1, [repo.f1, repo.f2, repo.m])
        assert _stored_links(store, [repo.f1, repo.f2, repo.m]) == {}  # nothing invented
        assert baseline_revisions(store, run) == {CELL: repo.a1}  # `before`, as the payload said
        lines = [r.getMessage() for r in caplog.records if "ancestry of run" in r.getMessage()]
        assert len(lines) == 1 and f"run {run} not read" in lines[0]
    finally:
        store.dispose()
