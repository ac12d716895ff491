"""A trusted bytecode cache of the pass under test (trusted side; standard library only).

A revision's tree holds no bytecode and the pass runs with ``dont_write_bytecode``, so every sandbox session
compiled the revision's ``amp_pass`` from source (~30 ms of each job).  :func:`bytecode_for` compiles it once,
here, in the worker -- ``compile()`` only: nothing of the pass is executed -- into a directory under the cache
directory keyed by the SHA-256 of everything the bytecode depends on (the interpreter's magic number and cache tag,
and each source file's path and bytes), written to a temporary directory and renamed into place whole.  The
sandbox then makes that directory visible to the pass process *read-only* and sets ``sys.pycache_prefix`` to it
before the import (:mod:`workers.sandbox._passproc`):

* **content-keyed, checked**: every ``.pyc`` is hash-based and *checked* (PEP 552,
  ``PycInvalidationMode.CHECKED_HASH``): the importer hashes the source it is about to run and uses the bytecode
  only when that hash is the one the ``.pyc`` was compiled from, so a stale or mismatched ``.pyc`` is recompiled
  from source, never run;
* **written by trusted code only**: the cache lies under the cache directory, which the sandbox hides; the pass
  sees its own revision's directory alone, bound read-only (``full``) or copied into its session's scratch
  directory, read-only, where it runs as a session uid (``best-effort`` as root).  A ``best-effort`` worker that is
  not root runs the pass as its own uid, which could write the cache: it gets none (:func:`usable`);
* **no file outside the tree**: only regular files (opened without following a symlink) under real directories
  of ``amp_pass`` are compiled; a symlink's target is never read, so no file of the worker's can reach the pass
  through a ``.pyc``;
* **bounded**: at most :data:`MAX_FILES` files of :data:`MAX_FILE_BYTES` each; a tree over that, or a file that
  does not compile, leaves that file (or the tree) without bytecode: the pass then compiles it itself, as before;
  at most :data:`MAX_KEEP` trees are kept, the least recently used removed first.

The bytecode changes no result: it is what the importer would have compiled from the same source.
"""

from __future__ import annotations

import hashlib
import importlib.util
import marshal
import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path

#: The package whose bytecode is cached (the revision's pass), relative to a pass root.
PACKAGE = "amp_pass"
#: Bounds on what the worker compiles for one tree (files, bytes per file).
MAX_FILES, MAX_FILE_BYTES = 2000, 4 << 20
#: Directories kept (one per revision tree, ~0.2 MB each); the least recently used go first.
MAX_KEEP = 64
#: A marker written last into a complete directory.
COMPLETE = ".complete"

_SEEN: dict[tuple[str, str, tuple[tuple[str, int, int, int], ...]], str | None] = {}


def usable(full: bool) -> bool:
    """Whether a session may get the cache: ``full`` mode (bound read-only), or ``best-effort`` where the worker
    is root (the pass runs as a session uid, on a read-only copy); not a non-root ``best-effort`` worker."""
    return full or (hasattr(os, "geteuid") and os.geteuid() == 0)


def _sources(root: Path) -> list[tuple[str, bytes]] | None:
    """(path relative to ``root``, bytes) of every regular ``.py`` file under ``root/amp_pass`` (not through a
    symlink), sorted; None when there is none or the tree is over the bounds."""
    top = root / PACKAGE
    try:
        if not stat.S_ISDIR(os.lstat(top).st_mode):
            return None
    except OSError:
        return None
    found: list[tuple[str, bytes]] = []
    for here, dirs, files in os.walk(top):  # never follows a directory symlink
        dirs.sort()
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            if len(found) >= MAX_FILES:
                return None
            path = os.path.join(here, name)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:
                continue  # a symlink (ELOOP) or unreadable: left to the pass to compile (or fail on)
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_FILE_BYTES:
                    continue
                with os.fdopen(os.dup(fd), "rb") as fh:
                    data = fh.read(MAX_FILE_BYTES + 1)
            finally:
                os.close(fd)
            if len(data) <= MAX_FILE_BYTES:
                found.append((os.path.relpath(path, root), data))
    return found or None


def _signature(root: Path) -> tuple[tuple[str, int, int, int], ...]:
    """The stat of every entry under ``root/amp_pass`` (path, size, mtime, inode): a change re-reads the tree."""
    out = []
    for here, dirs, files in os.walk(root / PACKAGE):
        dirs.sort()
        for name in sorted(files):
            try:
                st = os.lstat(os.path.join(here, name))
            except OSError:
                continue
            out.append((os.path.join(here, name), st.st_size, st.st_mtime_ns, st.st_ino))
    return tuple(out)


def digest(sources: list[tuple[str, bytes]]) -> str:
    """The key of a tree's bytecode: the interpreter's magic and cache tag, each file's path and bytes."""
    h = hashlib.sha256(importlib.util.MAGIC_NUMBER + (sys.implementation.cache_tag or "").encode())
    for rel, data in sources:
        h.update(b"\0%d:%s\0%d:" % (len(rel.encode()), rel.encode(), len(data)) + data)
    return h.hexdigest()


def pyc_name(rel: str) -> str:
    """The ``.pyc`` path, relative to the directory given as ``sys.pycache_prefix`` joined with the source's
    directory, of the source ``rel`` (``amp_pass/x.py`` -> ``amp_pass/x.cpython-311.pyc``)."""
    head, name = os.path.split(rel)
    return os.path.join(head, f"{name[:-3]}.{sys.implementation.cache_tag}.pyc")


def checked_pyc(data: bytes, rel: str) -> bytes | None:
    """The checked-hash ``.pyc`` (PEP 552) of the source ``data``, compiled (not run); None when it does not
    compile (the pass's import then reports that, as it would have)."""
    try:
        code = compile(data, rel, "exec", dont_inherit=True, optimize=0)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return None
    flags = 0b11  # hash-based, check_source
    return (importlib.util.MAGIC_NUMBER + flags.to_bytes(4, "little") + importlib.util.source_hash(data)
            + marshal.dumps(code))


def bytecode_for(root: Path, cache_dir: Path | str) -> str | None:
    """The directory of the checked-hash bytecode of ``root``'s ``amp_pass`` under ``cache_dir`` (see the
    module doc), compiled now when missing; None when the tree has none to give or the cache cannot be written
    (the pass then compiles its sources itself).  Never raises for the tree's content."""
    root = Path(root)
    try:
        sig = _signature(root)
    except OSError:
        return None
    key = (str(root), str(cache_dir), sig)
    if key in _SEEN:
        return _SEEN[key]
    got: str | None = None
    try:
        sources = _sources(root)
        if sources is not None:
            got = _ensure(Path(cache_dir), digest(sources), sources)
    except OSError:
        got = None
    if len(_SEEN) > 256:
        _SEEN.clear()
    _SEEN[key] = got
    return got


def _evict(cache: Path, keep: int) -> None:
    """Remove the least recently used bytecode directories of ``cache`` beyond ``keep`` (a session that has one
    bound or copied keeps reading it; a later one compiles from source or gets it compiled again)."""
    try:
        entries = [(e.stat().st_mtime, e.path) for e in os.scandir(cache)
                   if e.is_dir(follow_symlinks=False) and not e.name.startswith(".")]
    except OSError:
        return
    for _, path in sorted(entries)[:max(0, len(entries) - keep)]:
        shutil.rmtree(path, ignore_errors=True)


def _ensure(cache: Path, key: str, sources: list[tuple[str, bytes]]) -> str:
    """``cache/key``, written whole (temporary directory, renamed) when not there yet."""
    final = cache / key
    if (final / COMPLETE).is_file():
        os.utime(final)  # used: the last to be evicted
        return str(final)
    cache.mkdir(parents=True, exist_ok=True)
    _evict(cache, MAX_KEEP - 1)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=cache))
    try:
        for rel, data in sources:
            pyc = checked_pyc(data, rel)
            if pyc is None:
                continue
            dest = tmp / pyc_name(rel)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(pyc)
            dest.chmod(0o444)
        (tmp / COMPLETE).write_text(key)
        for here, _dirs, _files in os.walk(tmp):  # readable by the sandbox's uid (the pass sees it read-only)
            os.chmod(here, 0o755)
        try:
            tmp.rename(final)
        except OSError:  # another worker put it there first (same key, same bytes)
            if not (final / COMPLETE).is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return str(final)
