"""Checks that a cached tree of files is exactly what it should be (used by :mod:`workers.revision.revisions`
and :mod:`workers.revision.snapshots`).

The revision cache may be written by code under test; these functions find what differs from a commit's
tree or from a snapshot's rules, and remove a tree that does, so a changed tree is never imported from.
File hashes are remembered in this process only, by (path, inode, size, mtime, ctime): ctime is set to the
present by any change and cannot be set back without root, so a changed file is always hashed again, and
an unchanged tree costs a walk and one ``lstat`` per file.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from collections.abc import Collection, Mapping
from pathlib import Path

#: Git blob ids of files this process hashed, by (path, inode, size, mtime_ns, ctime_ns).
_BLOBS: dict[tuple[str, int, int, int, int], str] = {}


def blob_id(path: str, st: os.stat_result) -> str:
    """Git's blob id of a file (its bytes) or of a symbolic link (its target); ``st`` is its ``lstat``."""
    key = (path, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    got = _BLOBS.get(key)
    if got is None:
        data = os.fsencode(os.readlink(path)) if stat.S_ISLNK(st.st_mode) else Path(path).read_bytes()
        got = hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()
        if len(_BLOBS) > 100_000:
            _BLOBS.clear()
        _BLOBS[key] = got
    return got


def tree_problems(root: Path, expected: Mapping[str, tuple[str, str]], skip: Collection[str] = (),
                  limit: int = 5) -> list[str]:
    """How the files under ``root`` differ from ``expected`` (``git ls-tree -r`` of a commit:
    ``{path: (mode, blob id)}``), at most ``limit`` of them; empty when they are the same.

    Every expected path must be a regular file (a symbolic link for mode 120000; a folder for a
    submodule, whose content is not looked at) with that blob id, and nothing else may be there: no
    untracked or ignored file or folder, no bytecode, no link; only the names in ``skip`` at the top
    are not looked at.
    """
    problems: list[str] = []
    modules = {rel for rel, (mode, _) in expected.items() if mode == "160000"}
    folders = set(modules)
    for rel in expected:
        cut = rel.rfind("/")
        while cut > 0 and rel[:cut] not in folders:
            folders.add(rel[:cut])
            cut = rel.rfind("/", 0, cut)
    seen: set[str] = set()
    stack = [(str(root), "")]
    while stack and len(problems) < limit:
        folder, prefix = stack.pop()
        try:
            items = list(os.scandir(folder))
        except OSError as exc:
            problems.append(f"cannot list {prefix or '.'}: {exc.strerror}")
            continue
        for item in items:
            rel = f"{prefix}{item.name}"
            if not prefix and item.name in skip:
                continue
            st = item.stat(follow_symlinks=False)
            want = expected.get(rel)
            if stat.S_ISDIR(st.st_mode):
                if rel not in folders:
                    problems.append(f"foreign folder {rel}/")
                elif rel not in modules:
                    stack.append((item.path, rel + "/"))
                seen.add(rel)
                continue
            if want is None:
                problems.append(f"foreign file {rel}")
            elif (want[0] == "120000") != stat.S_ISLNK(st.st_mode) or not (
                    stat.S_ISLNK(st.st_mode) or stat.S_ISREG(st.st_mode)):
                problems.append(f"{rel} is not a {'link' if want[0] == '120000' else 'file'}")
            elif blob_id(item.path, st) != want[1]:
                problems.append(f"{rel} changed")
            seen.add(rel)
    if len(problems) < limit:
        problems += [f"{rel} missing" for rel in sorted(set(expected) - seen)]
    return problems[:limit]


def snapshot_layout_problems(path: Path, package: str, skip: Collection[str] = (), limit: int = 5) -> list[str]:
    """What a snapshot ``path`` holds besides ``package/`` (and ``skip`` at its top) made of plain files and
    folders: any other entry, and any ``__pycache__``, ``.pyc``/``.pyo``, link or special file inside."""
    problems = [f"foreign {p.name}" for p in path.iterdir() if p.name != package and p.name not in skip]
    for p in (path / package).rglob("*"):
        if p.is_symlink() or p.name == "__pycache__" or p.suffix in (".pyc", ".pyo") or not (
                p.is_dir() or p.is_file()):
            problems.append(f"foreign {p.relative_to(path).as_posix()}")
            if len(problems) >= limit:
                break
    return problems[:limit]


def remove_tree(path: Path) -> bool:
    """Remove a file, link or folder tree, also one whose folders were made read-only; whether it is gone."""
    def retry(_func: object, name: str, _exc: object) -> None:
        os.chmod(os.path.dirname(name), stat.S_IRWXU)
        if os.path.isdir(name) and not os.path.islink(name):
            os.chmod(name, stat.S_IRWXU)
            shutil.rmtree(name, ignore_errors=True)
        else:
            os.unlink(name)

    try:
        if path.is_symlink() or not path.is_dir():
            path.unlink(missing_ok=True)
        else:
            shutil.rmtree(path, onerror=retry)
    except OSError:
        pass
    return not (path.exists() or path.is_symlink())
