"""Best-effort mode without root's powers (standard library only; loaded by file path beside ``_sandbox.py``).

Where no namespace can be made (``AMPCI_SANDBOX=best-effort``), a root worker still never runs the pass as
root: the pass process drops to the session's unprivileged uid/gid (``_sandbox.SESSION_UID_BASE`` + the
supervisor's pid, else 65534) with no groups, hence no capabilities, and ``PR_SET_NO_NEW_PRIVS``.  What it must
write lives in a **scratch directory** of the session (:func:`make_scratch`), made by the trusted supervisor:

* ``TOP`` (``$TMPDIR/ampci-pass-XXXX``, root's, mode 755: the pass cannot rename what is in it);
* ``TOP/in`` (root's, 755): the inputs, copied in read-only (0444);
* ``TOP/out`` and ``TOP/home`` (the pass uid's, 700): its outputs and its ``HOME``/``TMPDIR``/cwd, copied out
  by the supervisor with the full sandbox's rules (``O_NOFOLLOW|O_NONBLOCK``, ``fstat``: a regular file) and,
  here, only a file the pass uid owns with one link (``/tmp`` shares a filesystem with the host's files: a hard
  link to one of them must not come out);
* ``TOP/lib/N``: a read-only copy (root's) of a pass root the pass uid could not read in place (an ancestor it
  may not traverse, such as pytest's ``/tmp/pytest-of-root``); a root it can read is used in place.

The interpreter's own import trees behind a directory the pass uid may not traverse (a pyenv under ``/root``,
mode 700) are reached through ``O_PATH`` descriptors opened before the drop (:func:`reach_import_trees`):
``sys.path`` names them ``/proc/self/fd/N/...``; a descriptor gives exactly its tree (``..`` from it is looked
up with the pass uid's rights).  Those descriptors are the only ones in the pass beyond the protocol's.

When the session ends, :func:`kill_uid` signals every process of the session's uid (a uid no other session
has): a ``setsid`` daemon the pass left goes too; a session whose supervisor was killed (a timeout) leaves them to
:func:`sweep_orphans`, run as each best-effort session starts and when the worker stops its zygotes.  Not protected in this mode (see docs/security.md): the
network and path sockets (the system-call filter denies ``socket``/``connect``), files and directories any user
may read or write, the host's process list, and whatever the kernel shares per uid with the shared 65534 uid
where the session uid is not mapped.
"""

import os
import shutil
import tempfile

#: The most a copied pass root may hold (bytes, files): a larger one is refused, one line.
COPY_MAX_BYTES, COPY_MAX_FILES = 256 << 20, 20000

PR_SET_DUMPABLE = 4
KEYCTL_JOIN_SESSION_KEYRING = 1


class ScratchError(Exception):
    """The scratch directory could not be made (one line saying why)."""


def blocked_ancestor(path, uid):
    """The first directory on the way to ``path`` (itself included) that ``uid`` may not traverse, by the mode
    bits (owner or other; the pass has no groups); None when every one is traversable."""
    here = "/"
    for part in os.path.abspath(path).split("/")[1:]:
        here = os.path.join(here, part)
        try:
            st = os.stat(here)
        except OSError:
            return None
        if os.path.stat.S_ISDIR(st.st_mode) and not (st.st_mode & 0o001 or (st.st_uid == uid
                                                                           and st.st_mode & 0o100)):
            return here
    return None


def _readable_in_place(root, uid):
    """Whether ``uid`` can reach the pass root ``root`` and list and read it and its ``amp_pass`` package in place
    (the checks the full sandbox makes of its pass roots; a file of the pass's own it cannot read is its own
    import error)."""
    if blocked_ancestor(root, uid):
        return False
    for path in (root, os.path.join(root, "amp_pass")):
        try:
            st = os.stat(path)
        except FileNotFoundError:
            continue
        if st.st_uid != uid and st.st_mode & 0o005 != 0o005:
            return False
    return True


def _copy_tree(src, dest):
    """A read-only copy of the pass root ``src`` (symlinks copied as links, never followed as root)."""
    total, count = 0, 0
    for top, _, files in os.walk(src):
        for name in files:
            count += 1
            total += os.lstat(os.path.join(top, name)).st_size
            if total > COPY_MAX_BYTES or count > COPY_MAX_FILES:
                raise ScratchError(f"the pass root {src} is too large to copy for the best-effort sandbox "
                                   f"(over {COPY_MAX_BYTES >> 20} MiB or {COPY_MAX_FILES} files): make it readable "
                                   "by the sandbox's uid in place (chmod o+rx on its directories)")
    shutil.copytree(src, dest, symlinks=True)
    for top, _dirs, files in os.walk(dest):
        for name in files:
            p = os.path.join(top, name)
            if not os.path.islink(p):
                os.chmod(p, 0o444)
        os.chmod(top, 0o555)


def make_scratch(spec):
    """The session's scratch directory (see the module doc); returns ``(top, lib_paths)``: ``lib_paths``, the
    path the pass imports each of ``spec["lib"]`` from."""
    uid, gid = spec["uid"], spec["gid"]
    top = tempfile.mkdtemp(prefix="ampci-pass-")
    try:
        os.chmod(top, 0o755)
        for sub, mode, owned in (("in", 0o755, False), ("lib", 0o755, False), ("out", 0o700, True),
                                 ("home", 0o700, True)):
            os.mkdir(os.path.join(top, sub), mode)
            os.chmod(os.path.join(top, sub), mode)
            if owned and os.geteuid() == 0:
                os.chown(os.path.join(top, sub), uid, gid)
        lib_paths = []
        for i, root in enumerate(spec["lib"]):
            if os.geteuid() != 0 or _readable_in_place(root, uid):
                lib_paths.append(root)
            else:
                dest = os.path.join(top, "lib", str(i))
                _copy_tree(root, dest)
                lib_paths.append(dest)
        os.chmod(os.path.join(top, "lib"), 0o555)
        return top, lib_paths
    except BaseException:
        remove_scratch(top)
        raise


def copy_bytecode(spec, top, lib_paths):
    """Best effort, root: a read-only copy of each pass root's trusted bytecode directory (``spec["bytecode"]``:
    :mod:`workers.sandbox.bytecode`) in the scratch directory ``top``, as ``{the root's lib path: its copy}``
    (the pass, a session uid, can read but not write it).  Not root: none (the pass runs as this uid, which
    could write the cache; the spec holds none then).  A directory that is gone is left out."""
    got = {}
    if os.geteuid() != 0:
        return got
    for i, path in enumerate(spec.get("bytecode") or []):
        if not path or not os.path.isdir(path) or os.path.islink(path):
            continue
        if not got:
            os.mkdir(os.path.join(top, "pyc"), 0o755)
            os.chmod(os.path.join(top, "pyc"), 0o755)
        dest = os.path.join(top, "pyc", str(i))
        try:
            _copy_tree(path, dest)
        except (OSError, ScratchError):
            continue
        got[lib_paths[i]] = dest
    return got


def remove_scratch(top):
    """Remove the scratch directory (its read-only copies included).  Never raises."""
    for here, dirs, _ in os.walk(top):
        for d in dirs:
            try:
                os.chmod(os.path.join(here, d), 0o755)
            except OSError:
                pass
    shutil.rmtree(top, ignore_errors=True)


def reach_import_trees(roots, uid):
    """In the pass process, as root, before the drop: for each import root in ``roots`` (``sys.path`` entries
    and the interpreter's trees) that ``uid`` could not reach, an ``O_PATH`` descriptor of the directory just
    below the untraversable one, and ``sys.path`` and every imported package's ``__path__`` (where its
    submodules are found) rewritten to reach it as ``/proc/self/fd/N/...``.  Returns the descriptors (kept open
    for the pass's life)."""
    import sys

    via = {}  # the directory below a blocked one -> its descriptor
    for root in roots:
        if not (isinstance(root, str) and os.path.isabs(root) and os.path.exists(root)):
            continue
        blocked = blocked_ancestor(root, uid)
        if not blocked or blocked == os.path.abspath(root):
            continue
        child = os.path.join(blocked, os.path.relpath(root, blocked).split("/")[0])
        if child not in via:
            via[child] = os.open(child, os.O_PATH | os.O_DIRECTORY)

    def moved(entry):
        for child, fd in via.items():
            if isinstance(entry, str) and (entry == child or entry.startswith(child + "/")):
                return f"/proc/self/fd/{fd}" + entry[len(child):]
        return entry

    sys.path[:] = [moved(e) for e in sys.path]
    for mod in list(sys.modules.values()):  # an imported package finds its submodules on its own __path__
        path = getattr(mod, "__path__", None)
        if isinstance(path, list):
            path[:] = [moved(e) for e in path]
    return list(via.values())


def join_new_session_keyring(nr_keyctl):
    """Give this process a fresh anonymous session keyring (``keyctl(KEYCTL_JOIN_SESSION_KEYRING, NULL)``;
    ``nr_keyctl``: the architecture's number): nothing of the worker's keyrings is the pass's.  Returns None,
    or why not (a container profile that denies ``keyctl``: the pass's own filter denies every keyring call
    anyway)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    if libc.syscall(ctypes.c_long(nr_keyctl), ctypes.c_long(KEYCTL_JOIN_SESSION_KEYRING), ctypes.c_long(0)) < 0:
        return os.strerror(ctypes.get_errno())
    return None


def set_dumpable():
    """After the drop: ``/proc/self`` belongs to the pass uid again (the kernel made it root's on the uid change),
    so ``/proc/self/fd/N`` paths resolve for it.  The pass may already read its own memory; nothing more."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(ctypes.c_int(PR_SET_DUMPABLE), ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0),
               ctypes.c_ulong(0))


def kill_uid(uid, tries=5):
    """Kill every process of ``uid`` (a uid of this session alone): a child of this process takes the uid and
    signals ``-1`` (every process it may signal: those of its uid), a few times (a fork racing the first).
    Root only; a no-op otherwise."""
    import signal

    if os.geteuid() != 0 or uid <= 0 or uid == 65534:  # never root's, never the shared uid's processes
        return
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            for _ in range(tries):
                try:
                    os.kill(-1, signal.SIGKILL)
                except ProcessLookupError:
                    break
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def sweep_orphans(base, span=1 << 22):
    """Kill the processes left by sessions whose supervisor is gone (killed on a timeout, it could not kill its
    uid's processes itself): every process whose uid is ``base + pid`` (a session uid) for a ``pid`` that no
    longer exists.  Root only; never raises."""
    import signal

    if os.geteuid() != 0:
        return
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as fh:
                uid = next(int(ln.split()[1]) for ln in fh if ln.startswith("Uid:"))
        except (OSError, StopIteration, ValueError, IndexError):
            continue
        if not base <= uid < base + span:
            continue
        try:
            os.kill(uid - base, 0)
            continue  # its supervisor is alive: its session's own
        except ProcessLookupError:
            pass
        except OSError:
            continue
        try:
            os.kill(int(pid), signal.SIGKILL)
        except OSError:
            pass

