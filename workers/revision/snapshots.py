"""``WORKTREE`` revisions: content-addressed snapshots of a developer's uncommitted ``amp_pass`` directory.

Guarantees: :func:`content_key` is the sha256 (64 hex digits) of the relative paths and bytes of
``tree/amp_pass`` without bytecode or ``__pycache__`` (:func:`snapshot_files`), so the same content always gives
the same key and a key names its content; :func:`snapshot_problems` is empty exactly when a snapshot holds
nothing but ``amp_pass/`` (and the cache's use stamp :data:`LAST_USED`), no bytecode or symbolic links, and
hashes to its key.  The snapshots themselves are written and kept by
:meth:`workers.revision.revisions.RevisionCache.snapshot`.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from workers.revision.git_commands import RevisionError
from workers.revision.tree_verify import snapshot_layout_problems

WORKTREE_KEY_RE = re.compile(r"\A[0-9a-f]{64}\Z")  # sha256 content hash; git commit shas are 40 hex
WORKTREE = "WORKTREE"
PASS_PACKAGE = "amp_pass"
#: The use stamp the revision cache writes in each of its trees (when it was last used, for LRU eviction).
LAST_USED = ".ampci-last-used"


def content_key(tree: Path) -> str:
    """sha256 (64 hex) over the relative paths and bytes of ``tree/amp_pass`` (caches excluded)."""
    pkg = tree / PASS_PACKAGE
    if not pkg.is_dir():
        raise RevisionError(f"{tree} has no {PASS_PACKAGE}/ directory to snapshot")
    h = hashlib.sha256()
    for path in snapshot_files(pkg):
        rel = path.relative_to(tree).as_posix()
        h.update(rel.encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def snapshot_files(pkg: Path) -> list[Path]:
    """The files of the package directory ``pkg`` a snapshot holds, sorted: all but bytecode and ``__pycache__``."""
    return sorted(p for p in pkg.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                  and p.suffix not in {".pyc", ".pyo"})


def snapshot_problems(path: Path, key: str) -> list[str]:
    """How the snapshot ``path`` differs from its key: anything besides ``amp_pass/`` and the use stamp,
    bytecode, ``__pycache__`` or links inside (a snapshot is copied as plain files without them:
    :func:`workers.revision.tree_verify.snapshot_layout_problems`), or content whose :func:`content_key` is not
    ``key``; empty when it is intact."""
    problems = snapshot_layout_problems(path, PASS_PACKAGE, skip=(LAST_USED,))
    if not problems and content_key(path) != key:
        problems.append(f"{PASS_PACKAGE}/ content hashes to another key")
    return problems
