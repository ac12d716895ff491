"""The sandbox's mount namespace: what the pass sees (standard library only; loaded by file path).

:func:`build_mounts`, in the supervisor after the mount namespace is unshared: every mount read-only, ``/tmp``
an empty size-capped tmpfs holding the only writable directories, ``/dev`` a handful of harmless nodes, each
``hide`` path an empty read-only tmpfs, the pass roots bound read-only under ``/tmp/.ampci/lib`` (their trusted
bytecode under ``/tmp/.ampci/pyc``), and every
directory the interpreter imports from that these mounts would hide bound back read-only at its own path,
alone (:func:`import_roots`).
"""

import os
import sys

_kernel = sys.modules["_ampci_kernel"]  # loaded first, by _sandbox.py (workers/sandbox/_kernel.py: load_sibling)


def blocked_ancestor(path, uid):
    """The first ancestor directory of ``path`` that ``uid`` may not traverse (None: all traversable)."""
    if uid == 0:
        return None
    parts = os.path.abspath(path).split("/")[1:]
    here = "/"
    for part in parts[:-1]:
        here = os.path.join(here, part)
        try:
            st = os.stat(here)
        except OSError:
            return None
        if not (st.st_mode & 0o001 or (st.st_uid == uid and st.st_mode & 0o100)):
            return here
    return None


def new_dir(path, mode=0o755):
    os.makedirs(path, exist_ok=True)
    os.chmod(path, mode)


def locked_flags(path):
    """The flags of the mount at ``path`` a remount must keep (a user namespace cannot clear them)."""
    try:
        f = os.statvfs(path).f_flag
    except OSError:
        return 0
    flags = f & (_kernel.MS_NOSUID | _kernel.MS_NODEV | _kernel.MS_NOEXEC)
    for st, ms in ((os.ST_NOATIME, 1024), (os.ST_NODIRATIME, 2048), (os.ST_RELATIME, 1 << 21)):
        if f & st:
            flags |= ms
    return flags


def bind(fd, target, writable=False):
    """Bind the file or directory open as ``fd`` onto ``target`` (read-only unless ``writable``)."""
    _kernel.mount(f"/proc/self/fd/{fd}", target, None, _kernel.MS_BIND)
    if not writable:
        _kernel.mount(None, target, None, _kernel.MS_REMOUNT | _kernel.MS_BIND | _kernel.MS_RDONLY | _kernel.MS_NOSUID | _kernel.MS_NODEV)


def readable_by(path, uid):
    """Why the sandbox uid could not read the directory ``path`` (None: it can)."""
    st = os.stat(path)
    if uid == 0 or st.st_uid == uid or st.st_mode & 0o005 == 0o005:
        return None
    return (f"the pass root {path} is not readable by the sandbox's uid {uid} (mode {st.st_mode & 0o777:o}): "
            "make it world-readable (chmod o+rx)")


def within(path, top):
    """Whether ``path`` is ``top`` or lies below it (both absolute, resolved)."""
    return path == top or path.startswith(top.rstrip("/") + "/")


def import_roots(spec, search_path=None):
    """Every directory (or zip file) this interpreter imports from -- the existing entries of ``sys.path`` (the
    standard library, ``site-packages``, what ``.pth`` files and editable installs added) and the interpreter's
    trees of ``spec["interpreter"]`` (its prefixes) -- resolved, as ``(covered, kept)``: ``covered``, those the
    sandbox's mounts would hide (under /tmp, which becomes an empty tmpfs, or under a ``hide`` directory), to be
    bound back read-only at the same path, outermost only; ``kept``, the others.  A tree that holds /tmp or a
    ``hide`` directory is never bound back (it would show what is hidden)."""
    hidden = [os.path.realpath(h) for h in spec["hide"]]
    roots = set()
    for entry in [*(sys.path if search_path is None else search_path), *spec["interpreter"]]:
        if isinstance(entry, str) and os.path.isabs(entry) and os.path.exists(entry):
            roots.add(os.path.realpath(entry))
    covered, kept = [], []
    for root in sorted(roots):
        if any(within(h, root) for h in [*hidden, "/tmp"]):
            continue
        if within(root, "/tmp") or any(within(root, h) for h in hidden):
            if not any(within(root, c) for c in covered):
                covered.append(root)
        else:
            kept.append(root)
    return covered, kept


def open_import_roots(spec):
    """O_PATH descriptors of :func:`import_roots`' ``covered`` roots, by path (opened in the sandbox's mount
    namespace before anything is hidden, as bind sources must be)."""
    return {root: os.open(root, os.O_PATH) for root in import_roots(spec)[0]}


def bind_back(roots):
    """Bind each import root (path -> O_PATH descriptor) read-only at its own path, over the tmpfs that hid it
    (the directories leading to it are made, mode 755, in that tmpfs)."""
    for root, fd in sorted(roots.items()):
        os.makedirs(os.path.dirname(root), mode=0o755, exist_ok=True)
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            os.makedirs(root, mode=0o755, exist_ok=True)
        elif not os.path.exists(root):
            os.close(os.open(root, os.O_CREAT | os.O_WRONLY, 0o444))
        bind(fd, root)
        os.close(fd)


def open_bytecode(spec):
    """O_PATH descriptors of the pass roots' trusted bytecode directories (``spec["bytecode"]``, aligned with
    ``spec["lib"]``; :mod:`workers.sandbox.bytecode`), by the index of their root; one that is gone (a cleaned
    cache) is left out: that root's pass is compiled from source."""
    got = {}
    for i, path in enumerate(spec.get("bytecode") or []):
        if path:
            try:
                got[i] = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW)
            except OSError:
                pass
    return got


def build_mounts(spec, libs, roots=None, pycs=None):
    """In the supervisor, after unsharing the mount namespace: see the module doc.  ``libs``: O_PATH
    descriptors of the pass roots, ``roots``: of the interpreter's import roots that the mounts hide
    (:func:`open_import_roots`), ``pycs``: of the roots' bytecode directories by root index, bound read-only at
    ``/tmp/.ampci/pyc/<index>`` (:func:`open_bytecode`), all opened before anything was hidden."""
    uid = spec["uid"]
    roots = roots or {}
    # the interpreter's own trees must stay readable for the sandbox uid: an untraversable ancestor
    # (e.g. /root, 0700, holding a pyenv) is replaced by an empty tmpfs with just that tree bound back
    keep = {}
    covered, kept = import_roots(spec)
    for tree in [*kept, *(c for c in covered if not within(c, "/tmp"))]:  # /tmp's dirs are remade, 755
        blocked = blocked_ancestor(os.path.join(tree, "x"), uid)
        if blocked:
            child = os.path.join(blocked, os.path.relpath(tree, blocked).split("/")[0])
            children = keep.setdefault(blocked, {})
            if child not in children:  # two trees under one child: one descriptor, never one overwritten
                children[child] = os.open(child, os.O_PATH)
    _kernel.mount(None, "/", None, _kernel.MS_REC | _kernel.MS_PRIVATE)
    for point in reversed(_kernel.mountpoints()):
        try:
            _kernel.mount(None, point, None, _kernel.MS_REMOUNT | _kernel.MS_BIND | _kernel.MS_RDONLY | locked_flags(point))
        except _kernel.SandboxError:
            if point in ("/", "/proc", "/sys"):
                raise
    for blocked, children in sorted(keep.items()):
        _kernel.mount("tmpfs", blocked, "tmpfs", _kernel.MS_NOSUID | _kernel.MS_NODEV, "size=64k,mode=755")
        for child, fd in children.items():
            new_dir(child)
            bind(fd, child)
            os.close(fd)
        _kernel.mount(None, blocked, None, _kernel.MS_REMOUNT | _kernel.MS_RDONLY | _kernel.MS_NOSUID | _kernel.MS_NODEV)
    hides = [h for h in spec["hide"] if os.path.isdir(h)]
    for hidden in hides:  # made read-only once the import roots inside are bound back
        _kernel.mount("tmpfs", hidden, "tmpfs", _kernel.MS_NOSUID | _kernel.MS_NODEV | _kernel.MS_NOEXEC, "size=4k,mode=555")
    dev_fds = {n: os.open(f"/dev/{n}", os.O_PATH) for n in _kernel.DEV_NODES if os.path.exists(f"/dev/{n}")}
    gpu = [n for n in os.listdir("/dev") if n.startswith("nvidia")] if os.path.isdir("/dev") else []
    dev_fds.update({n: os.open(f"/dev/{n}", os.O_PATH) for n in gpu})
    _kernel.mount("tmpfs", "/dev", "tmpfs", _kernel.MS_NOSUID | _kernel.MS_NOEXEC, "size=64k,mode=755")
    for name, fd in dev_fds.items():
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            new_dir(f"/dev/{name}")
        else:
            os.close(os.open(f"/dev/{name}", os.O_CREAT | os.O_WRONLY, 0o666))
        _kernel.mount(f"/proc/self/fd/{fd}", f"/dev/{name}", None, _kernel.MS_BIND)
        os.close(fd)
    _kernel.mount(None, "/dev", None, _kernel.MS_REMOUNT | _kernel.MS_RDONLY | _kernel.MS_NOSUID | _kernel.MS_NOEXEC)
    _kernel.mount("tmpfs", "/tmp", "tmpfs", _kernel.MS_NOSUID | _kernel.MS_NODEV, f"size={int(spec['scratch_bytes'])},mode=1777")
    for sub in ("lib", "in", "out", "home"):
        new_dir(f"{_kernel.BASE}/{sub}", 0o755)
    for i, fd in enumerate(libs):
        new_dir(f"{_kernel.BASE}/lib/{i}")
        bind(fd, f"{_kernel.BASE}/lib/{i}")
        os.close(fd)
    if pycs:
        new_dir(f"{_kernel.BASE}/pyc", 0o755)
    for i, fd in sorted((pycs or {}).items()):
        new_dir(f"{_kernel.BASE}/pyc/{i}")
        bind(fd, f"{_kernel.BASE}/pyc/{i}")
        os.close(fd)
    for sub in ("out", "home"):
        os.chown(f"{_kernel.BASE}/{sub}", uid, spec["gid"])
        os.chmod(f"{_kernel.BASE}/{sub}", 0o700)
    bind_back(roots)
    for hidden in hides:
        try:
            _kernel.mount(None, hidden, None, _kernel.MS_REMOUNT | _kernel.MS_RDONLY | _kernel.MS_NOSUID | _kernel.MS_NODEV | _kernel.MS_NOEXEC)
        except _kernel.SandboxError:
            if not within(hidden, "/tmp"):  # under /tmp it is covered by /tmp's tmpfs anyway
                raise
