"""Pass revisions on a worker: a bare clone of the pass repository and an LRU cache of worktrees.

A job names the revision of ``amp_pass`` it must run.  :class:`RevisionCache` turns that name into a
directory whose ``amp_pass`` package is the pass at exactly that revision; the job puts the directory
first on the conversion subprocess's import path.

Guarantees:

* A commit sha is validated (exactly 40 lower-case hex digits) before any git command sees it, so a
  revision string can never become a git option or a path.
* Git runs with hooks disabled (``-c core.hooksPath=/dev/null``), no credential prompts, no
  ``fsmonitor``, and never executes anything from the checkout (:mod:`workers.revision.git_commands`); only
  the pass module is imported later, by the conversion subprocess.
* One bare clone per pass repository: ``root/<key>/repo.git`` where ``key`` is a hash of the
  repository's resolved absolute path (or its URL), and a clone whose ``remote.origin.url`` is not
  that repository is never used (RevisionError), so two checkouts sharing one cache directory each
  test their own commits.
* The pass repository of a webhook run may be the repository that sent it (a clone URL checked by
  :func:`workers.revision.pass_source.check_clone_url`); its credential reaches only the git calls that talk to it
  (clone, fetch), through their environment, and never a URL, an argument, the clone's config or an error.
* Every revision a user names (branch, tag, full or short sha, ``HEAD``) is resolved to a full sha
  that exists in the repository (:meth:`RevisionCache.resolve`); an unknown one is a RevisionError.
* At most ``size`` worktrees are kept; the least recently used one is removed first.  The cache is
  safe to share between processes on one machine (an exclusive ``flock`` serialises git calls).
* ``WORKTREE`` revisions (a developer's uncommitted tree) are content-addressed snapshots of the
  ``amp_pass`` directory, keyed by the sha256 (64 hex digits) of its paths and bytes
  (:mod:`workers.revision.snapshots`); the same content always gives the same key, and a snapshot is
  written atomically (temp dir + rename).
  Snapshots are shared by all repositories (``root/trees/<key>``): their key is their content.
* A cached tree is verified on every use, since code under test may be able to write the cache (the
  whole tree is on the conversion's import path): a worktree must hold exactly the files of its commit's
  tree with their git blob ids and nothing else (no untracked or ignored file, no ``__pycache__``: the
  pass runs with bytecode writing off) besides git's ``.git`` file and the use stamp.  It is compared
  with ``git ls-tree`` of the commit in the bare clone, not with ``git status``, which trusts the
  worktree's index (an edit marked ``--assume-unchanged`` there is invisible to it); see
  :mod:`workers.revision.tree_verify`.  A worktree that differs is removed and checked out afresh (one log
  line).  A snapshot must hash to its key and hold nothing but ``amp_pass/`` without bytecode or
  symbolic links (:func:`workers.revision.snapshots.snapshot_problems`); one that differs is removed and
  refused (RevisionError), or made again by :meth:`RevisionCache.snapshot`.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from workers.revision.git_commands import SHA_RE, RevisionError, commit_tree, git, validate_sha
from workers.revision.pass_source import GitCredential, check_clone_url
from workers.revision.snapshots import (
    LAST_USED,
    PASS_PACKAGE,
    WORKTREE_KEY_RE,
    content_key,
    snapshot_files,
    snapshot_problems,
)
from workers.revision.tree_verify import remove_tree, tree_problems

if TYPE_CHECKING:
    from workers.revision.config import WorkerConfig

log = logging.getLogger(__name__)


def default_pass_repo() -> str:
    """The repository this code was installed from (the default ``AMPCI_PASS_REPO``)."""
    return str(Path(__file__).resolve().parents[2])


def repo_identity(repo: str) -> str:
    """The canonical name of a pass repository: the resolved absolute path of a local directory,
    else the URL as given (trailing slashes removed).  Its bare clone's ``remote.origin.url``."""
    path = Path(repo).expanduser()
    if path.is_dir():
        return str(path.resolve())
    return repo.rstrip("/") or repo


def repo_key(repo: str) -> str:
    """The cache directory name of a pass repository: 16 hex digits of sha256 of :func:`repo_identity`."""
    return hashlib.sha256(repo_identity(repo).encode()).hexdigest()[:16]


class RevisionCache:
    """Bare clone of one pass repository plus an LRU cache of worktrees keyed by revision.

    ``root`` holds ``<repo key>/repo.git`` (the bare clone of ``repo``), ``<repo key>/trees/<sha>/``
    (its worktrees), ``trees/<worktree-key>/`` (content-addressed WORKTREE snapshots, shared by all
    repositories) and lock files.
    """

    def __init__(self, repo: str, root: Path, size: int = 8, credential: GitCredential | None = None) -> None:
        if size < 1:
            raise ValueError("worktree cache size must be >= 1")
        self.credential = credential  # for the calls that reach the repository (clone, fetch) only
        self.repo = repo_identity(repo)
        self.root = Path(root)
        self.size = size
        self.home = self.root / repo_key(repo)
        self.bare = self.home / "repo.git"
        self.trees = self.home / "trees"
        self.snapshots = self.root / "trees"

    @classmethod
    def from_config(cls, config: WorkerConfig) -> RevisionCache:
        """The cache under ``config.cache_dir/revisions`` for the job's pass repository: ``config.pass_repo``
        when set (``AMPCI_PASS_REPO``), else the clone URL the run's webhook delivery named
        (``config.pass_repo_url``, checked again with :func:`workers.revision.pass_source.check_clone_url`: a URL that
        may not be cloned is a RevisionError) with ``config.pass_repo_token`` as its credential, else this
        repository."""
        root = Path(config.cache_dir) / "revisions"
        if config.pass_repo or not config.pass_repo_url:
            return cls(config.pass_repo or default_pass_repo(), root, config.worktree_cache_size)
        try:
            url = check_clone_url(config.pass_repo_url, allow_file=config.pass_repo_allow_file)
        except ValueError as exc:
            raise RevisionError(f"pass repository of the delivery refused: {exc}") from None
        return cls(url, root, config.worktree_cache_size,
                   credential=GitCredential.for_url(url, config.pass_repo_token))

    @contextmanager
    def _locked(self, where: Path | None = None) -> Iterator[None]:
        where = where or self.home
        where.mkdir(parents=True, exist_ok=True)
        with open(where / ".lock", "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def checkout(self, revision: str) -> Path:
        """Return a directory whose ``amp_pass`` is the pass at ``revision`` (a sha or worktree key).

        Fetches from the pass repository only when the commit is not in the bare clone yet.
        Raises RevisionError for a malformed or unknown revision.
        """
        if WORKTREE_KEY_RE.match(revision or ""):
            path = self.snapshots / revision
            if not (path / PASS_PACKAGE).is_dir():
                raise RevisionError(f"worktree snapshot {revision} is not on this machine "
                                    f"(expected {path}); WORKTREE sweeps need a shared cache directory")
            problems = snapshot_problems(path, revision)
            if problems:
                log.warning("worktree snapshot %s differs from its key (%s); removed", path, "; ".join(problems))
                _remove(path)
                raise RevisionError(f"worktree snapshot {revision} at {path} differs from its key "
                                    f"({'; '.join(problems)}); it was removed: snapshot the tree again")
            _touch(path)
            return path
        sha = validate_sha(revision)
        with self._locked():
            path = self.trees / sha
            # complete only once `worktree add` returned: its .git file appears before the files are
            # checked out, and the use stamp is written after (a worker killed in between left it half made)
            if (path / ".git").exists() and (path / LAST_USED).exists():
                problems = self._worktree_problems(path, sha)
                if not problems:
                    _touch(path)
                    return path
                log.warning("worktree %s differs from commit %s (%s); checking it out afresh", path, sha,
                            "; ".join(problems))
            self._ensure_commit(sha)
            if path.exists() or path.is_symlink():  # a half-made or changed worktree
                _remove(path)
            git(["worktree", "prune"], cwd=self.bare)
            self.trees.mkdir(parents=True, exist_ok=True)
            # --force twice: a killed `worktree add` leaves its registration locked ("initializing"),
            # which prune keeps and a single --force refuses; we hold the lock, nobody else uses it
            git(["worktree", "add", "--detach", "--force", "--force", str(path), sha], cwd=self.bare)
            problems = self._worktree_problems(path, sha)
            if problems:
                raise RevisionError(f"a fresh checkout of {sha} at {path} differs from the commit "
                                    f"({'; '.join(problems)}): .gitattributes that change file contents on "
                                    "checkout are not supported")
            _touch(path)
            self._evict(self.trees, keep=path)
            return path

    def snapshot(self, tree: Path) -> str:
        """Copy ``tree/amp_pass`` into the cache as a content-addressed revision; return its key."""
        key = content_key(tree)
        dest = self.snapshots / key
        if (dest / PASS_PACKAGE).is_dir():
            problems = snapshot_problems(dest, key)
            if not problems:
                _touch(dest)
                return key
            log.warning("worktree snapshot %s differs from its key (%s); making it again", dest, "; ".join(problems))
            _remove(dest)
        self.snapshots.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".snap-", dir=self.snapshots))
        tmp.chmod(0o755)  # mkdtemp's 0700 would keep the sandboxed pass (another uid) from reading it
        try:
            src = tree / PASS_PACKAGE
            for path in snapshot_files(src):
                target = tmp / path.relative_to(tree)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target)
            if content_key(tmp) != key:
                raise RevisionError(f"{src} changed while it was being snapshotted; try again")
            try:
                os.rename(tmp, dest)
            except OSError:  # another process made the same snapshot first
                if not (dest / PASS_PACKAGE).is_dir():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        _touch(dest)
        with self._locked(self.root):
            self._evict(self.snapshots, keep=dest)
        return key

    def resolve(self, rev: str) -> str:
        """Resolve a branch, tag, full or short sha (or ``HEAD``) of the pass repository to the full
        40-hex sha of a commit that is in the bare clone.

        ``rev`` must look like a ref name (no leading ``-``, no whitespace or ``..``), so it cannot
        be taken as a git option.  Names are looked up in the repository itself when it is a local
        directory (so ``HEAD`` is its checked-out commit), else in the clone after a fetch.
        RevisionError when nothing in the repository has that name.
        """
        rev = (rev or "").strip()
        if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_./+@{}~^-]*", rev) or ".." in rev:
            raise RevisionError(f"not a valid revision name: {rev!r}")
        with self._locked():
            if SHA_RE.match(rev):
                self._ensure_commit(rev)
                return rev
            local = Path(self.repo)
            if local.is_dir():
                sha = self._rev_parse(rev, local)
                self._ensure_commit(sha)
                return sha
            self._ensure_clone()
            self._fetch()
            return self._rev_parse(rev, self.bare)

    def _rev_parse(self, rev: str, cwd: Path) -> str:
        try:
            out = git(["rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}"], cwd=cwd)
        except RevisionError:
            out = ""
        if not SHA_RE.match(out.strip()):
            raise RevisionError(f"unknown revision {rev!r}: no branch, tag or commit of that name in the pass "
                                f"repository {self.repo}")
        return out.strip()

    def first_parents(self, sha: str, depth: int = 500) -> list[tuple[str, tuple[str, ...]]]:
        """``(commit, parents)`` for ``sha`` and its first-parent ancestors, newest first, at most
        ``depth`` commits (all parents of each commit; position 0 is the first parent)."""
        validate_sha(sha)
        if depth < 1:
            return []
        with self._locked():
            self._ensure_commit(sha)
            out = git(["rev-list", "--first-parent", "--parents", f"--max-count={int(depth)}", sha, "--"],
                      cwd=self.bare)
        chain = []
        for line in out.splitlines():
            parts = line.split()
            if parts and all(SHA_RE.match(p) for p in parts):
                chain.append((parts[0], tuple(parts[1:])))
        return chain

    def cached(self) -> list[str]:
        """Commit shas currently in this repository's worktree cache, most recently used first."""
        if not self.trees.is_dir():
            return []
        items = [p for p in self.trees.iterdir() if p.is_dir() and not p.name.startswith(".")]
        return [p.name for p in sorted(items, key=_last_used, reverse=True)]

    def _worktree_problems(self, path: Path, sha: str) -> list[str]:
        """:func:`tree_problems` of the worktree ``path`` against commit ``sha``, plus its ``.git`` file,
        which must be a file naming this clone's administrative folder for it."""
        problems = tree_problems(path, commit_tree(self.bare, sha), skip=(".git", LAST_USED))
        dotgit = path / ".git"
        try:
            link = dotgit.read_text().strip() if dotgit.is_file() and not dotgit.is_symlink() else ""
        except OSError:
            link = ""
        admin = os.path.dirname(link.removeprefix("gitdir: ")) if link.startswith("gitdir: ") else ""
        if not admin or os.path.realpath(admin) != os.path.realpath(self.bare / "worktrees"):
            problems.insert(0, f".git does not point into {self.bare / 'worktrees'}")
        return problems

    # -- internals (called with the lock held) -------------------------------------------------
    def _ensure_clone(self) -> None:
        if (self.bare / "HEAD").exists():
            try:
                origin = git(["config", "--get", "remote.origin.url"], cwd=self.bare).strip()
            except RevisionError:
                origin = ""
            if origin != self.repo:
                raise RevisionError(f"the revision cache {self.bare} is a clone of {origin or '(no origin)'}, "
                                    f"not of {self.repo}; remove it")
            return
        tmp = self.home / f".clone-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        git(["clone", "--bare", "--quiet", "--end-of-options", self.repo, str(tmp)], credential=self.credential)
        os.rename(tmp, self.bare)

    def _has_commit(self, sha: str) -> bool:
        try:
            git(["cat-file", "-e", f"{sha}^{{commit}}"], cwd=self.bare)
            return True
        except RevisionError:
            return False

    def _fetch(self) -> None:
        git(["fetch", "--quiet", "--prune", "--force", "origin", "+refs/heads/*:refs/heads/*",
             "+refs/tags/*:refs/tags/*"], cwd=self.bare, credential=self.credential)

    def _ensure_commit(self, sha: str) -> None:
        self._ensure_clone()
        if self._has_commit(sha):
            return
        self._fetch()
        if not self._has_commit(sha):
            try:  # e.g. a pull-request head not on any branch; servers may allow fetching by sha
                git(["fetch", "--quiet", "origin", sha], cwd=self.bare, credential=self.credential)
            except RevisionError:
                pass
        if not self._has_commit(sha):
            raise RevisionError(f"commit {sha} is not in the pass repository {self.repo}")

    def _evict(self, where: Path, keep: Path) -> None:
        items = [p for p in where.iterdir() if p.is_dir() and not p.name.startswith(".")]
        items.sort(key=_last_used, reverse=True)
        for old in [p for p in items if p != keep][self.size - 1:]:
            if SHA_RE.match(old.name):
                try:
                    git(["worktree", "remove", "--force", str(old)], cwd=self.bare)
                except RevisionError:
                    pass
            shutil.rmtree(old, ignore_errors=True)
        if (self.bare / "HEAD").exists():
            git(["worktree", "prune"], cwd=self.bare)


def _remove(path: Path) -> None:
    if not remove_tree(path):
        raise RevisionError(f"cannot remove {path} from the revision cache")


def _touch(path: Path) -> None:
    """Write the use stamp; never through a symbolic link planted in its place."""
    stamp = path / LAST_USED
    if stamp.is_symlink() or (stamp.exists() and not stamp.is_file()):
        _remove(stamp)
    fd = os.open(stamp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as fh:
        fh.write(f"{time.time():.6f}\n")


def _last_used(path: Path) -> float:
    try:
        return float((path / LAST_USED).read_text().strip())
    except (OSError, ValueError):
        return 0.0


def describe(cache: RevisionCache, sha: str) -> dict[str, object]:
    """Parents, author, subject and commit time of a commit already in the bare clone."""
    validate_sha(sha)
    out = git(["show", "-s", "--format=%P%x00%an <%ae>%x00%s%x00%cI", sha, "--"], cwd=cache.bare)
    parents, author, subject, when = (out.rstrip("\n").split("\0") + ["", "", "", ""])[:4]
    return {"parents": [p for p in parents.split() if SHA_RE.match(p)], "author": author or None,
            "message": subject or None, "committed_at": when or None}
