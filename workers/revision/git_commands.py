"""Git as the revision cache runs it, and what it reads from a commit.

Guarantees: :func:`git` runs with hooks disabled (``-c core.hooksPath=/dev/null``), no ``fsmonitor``, no
``ext::`` transport, no credential prompts and no system or global config, and never executes anything from a
checkout; a credential reaches one call through its environment only and is scrubbed from its error; a failure
or timeout is a :class:`RevisionError` naming the git command.  :func:`validate_sha` admits exactly 40
lower-case hex digits, so a revision string can never become a git option or a path.  :func:`commit_tree` lists
a commit's tree once per process (a commit's tree never changes).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from workers.revision.pass_source import GitCredential

SHA_RE = re.compile(r"\A[0-9a-f]{40}\Z")
_GIT_CONFIG = ("-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false",
               "-c", "protocol.ext.allow=never", "-c", "advice.detachedHead=false")


class RevisionError(Exception):
    """A revision is malformed, unknown to the pass repository, or cannot be checked out."""

    exit_code = 2


def validate_sha(sha: str) -> str:
    """Return ``sha`` if it is exactly 40 lower-case hex digits, else raise RevisionError."""
    if not isinstance(sha, str) or not SHA_RE.match(sha):
        raise RevisionError(f"not a full commit sha (40 hex digits): {sha!r}")
    return sha


def git(args: list[str], cwd: Path | None = None, timeout: float = 300.0,
        credential: GitCredential | None = None) -> str:
    """Run git without hooks or prompts; return stdout; raise RevisionError with stderr on failure.

    ``credential`` reaches this one git call through its environment only (:meth:`GitCredential.env`),
    and is scrubbed from the error message."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_TERMINAL_PROMPT="0", GIT_CONFIG_NOSYSTEM="1", GIT_ASKPASS="/bin/false",
               GIT_CONFIG_GLOBAL="/dev/null")
    if credential is not None:
        env.update(credential.env())
    try:
        proc = subprocess.run(["git", *_GIT_CONFIG, *args], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RevisionError(f"git {args[0]} timed out after {timeout:.0f}s") from None
    if proc.returncode != 0:
        msg = error_line(proc.stderr)
        if credential is not None:
            msg = credential.scrub(msg)
        raise RevisionError(f"git {args[0]} failed: {msg}")
    return proc.stdout


def error_line(stderr: str) -> str:
    """The line of git's ``stderr`` that says what went wrong: its first ``fatal:`` line, else its first
    ``error:`` line, else its last line (git follows a fatal line with advice such as "Please make sure you have
    the correct access rights / and the repository exists.", whose last line alone says nothing)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for prefix in ("fatal:", "error:"):
        found = next((line for line in lines if line.startswith(prefix)), None)
        if found is not None:
            return found
    return lines[-1] if lines else "(no message)"


#: ``git ls-tree`` of commits, by (bare clone, sha): a commit's tree never changes.
_TREES: dict[tuple[str, str], dict[str, tuple[str, str]]] = {}


def commit_tree(bare: Path, sha: str) -> dict[str, tuple[str, str]]:
    """``{path: (mode, object id)}`` of every entry of commit ``sha``'s tree, recursively."""
    key = (str(bare), validate_sha(sha))
    if key not in _TREES:
        entries = {}
        for record in git(["ls-tree", "-r", "-z", "--full-tree", sha], cwd=bare).split("\0"):
            if record:
                meta, rel = record.split("\t", 1)
                mode, _kind, obj = meta.split()
                entries[rel] = (mode, obj)
        _TREES[key] = entries
    return _TREES[key]
