"""The sandbox the pass under test runs in (standard library only; loaded by file path).

The pass at a pull request's revision is untrusted code.  The conversions of one job run in one sandbox
*session*, made by :func:`supervise` in a process freshly forked from a zygote (trusted: it never imports the
pass):

* the **supervisor** (trusted; root where the worker is root) leaves the worker's session, keeps only its
  two protocol pipes (stdin/stdout/stderr become ``/dev/null``), and in ``full`` mode unshares a mount, network
  and PID namespace: every mount becomes read-only, ``/tmp`` an empty size-capped tmpfs that holds the only
  writable directory (``/tmp/.ampci/out``), ``/dev`` a handful of harmless nodes, and each ``hide`` path (the
  data and cache directories, ``/run``) an empty read-only tmpfs; the pass roots are bound read-only under
  ``/tmp/.ampci/lib``, and every directory the interpreter imports from that these mounts would hide (a venv or
  ``site-packages`` under ``/tmp`` or inside a hidden directory: :func:`import_roots`) is bound back read-only
  at its own path, alone -- nothing else of the directory that holds it;
* the **pass process** (PID 1 of the new PID namespace) mounts its own ``/proc``, drops to the sandbox uid/gid
  with no groups and no capabilities (root), or nests a user namespace (non-root), sets ``PR_SET_NO_NEW_PRIVS``,
  its parent-death signal and the resource limits (processes, file size, no core files), takes the
  allow-listed environment, imports ``amp_pass`` from the revision's root once, and then forks one
  **conversion** per request (its own address-space limit and stdout/stderr files).

For each request the supervisor copies the inputs in (read-only for the pass), rewrites argv to the in-sandbox
paths, times the conversion, copies the outputs (each capped in size) out of the tmpfs into the job's directory,
and writes one line to the zygote: ``{"code", "cpu_s", "wall_s"}``.  **The times are the trusted side's alone**:
the pass process runs the pass's import-time code, so nothing it or a conversion writes is taken as a time.  The
supervisor waits until the pass process has a child (the conversion it pre-forks before saying it is ready and
before each end line), opens pidfds to its children, then writes the request; the wall clock stops when the pass
process's ``E code`` / ``S signal`` line has arrived *and* every one of those children has exited, so a forged
line cannot end it before the conversion process really does.  CPU seconds are the change, between the request
and that moment, of the kernel's account of every process of the sandbox: the ``cpu.stat`` of a cgroup v2 group
the pass process is put in before it runs anything (:class:`_Cgroup`: microseconds, auto-reaped processes
included; where this process may make one), else the user + system time (with reaped children's) of every
process below the supervisor in the host's /proc (clock ticks: 10 ms steps; descendants before parents): work
the pass moves into the pass process's threads or other processes is counted.  The conversion process closes the protocol
pipes before the pass's code runs; the next conversion's fork lies inside each window (a constant per
conversion); the end line's only use is the exit code (anything else on the pipe, or a line over
:data:`MAX_LINE` bytes, is dropped).  Not covered: the pass's import-time code in the pass process may keep state
across a job's conversions (say, a cache of the first conversion's output for its repeats); without a cgroup,
the CPU time of a process auto-reaped by the kernel (its parent ignores ``SIGCHLD``) is in no account.  When the session ends (the zygote closes its pipe) or its
supervisor is killed (a timeout), the pass process dies, and with it, being the namespace's init, every process
left in the namespace: no process of the pass outlives its job's conversions, and nothing of one job's pass
reaches another's.

``best-effort`` mode (no namespaces: a container without the permission) keeps the environment allowlist,
the descriptor closing, the system-call filter, the limits and the process-group kill, and says so
(:func:`probe`); a root worker's pass still drops to its session uid, in a scratch directory the supervisor makes
and copies the outputs out of by the same rules (:mod:`workers.sandbox._unprivileged`), and every process of that uid is
killed when the session ends.  Its supervisor is a child subreaper, so the timing above holds there too (orphans
of the pass are its children).  In both modes the session's processes are in a cgroup of their own with
``pids.max`` and a memory limit where the host offers one (:mod:`workers.sandbox._cglimits`).
"""

import ctypes
import json
import os
import resource
import runpy
import signal
import sys
import time
import traceback

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 36, 38

#: A root supervisor runs its session's pass as ``SESSION_UID_BASE + its own pid`` (a uid no other live session
#: has): the kernel's per-uid state -- ``RLIMIT_NPROC``'s count, keyrings, inotify and signal quotas -- is then
#: per job, so one job's pass at its process limit never stops another's from forking.
SESSION_UID_BASE = 0x20000000

#: Where the pass sees its world inside the sandbox (a tmpfs over /tmp).
BASE = "/tmp/.ampci"
DEV_NODES = ("null", "zero", "full", "random", "urandom")

_libc = None


def _load_seccomp(name="_seccomp"):
    """:mod:`workers.sandbox._seccomp` (or another module beside this file), loaded by file path (never through
    ``sys.path``)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        f"_ampci{name}", os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_seccomp = _load_seccomp()
_unpriv = _load_seccomp("_unprivileged")
_cgl = _load_seccomp("_cglimits")


class SandboxError(Exception):
    """The sandbox could not be made (the message says which step and why)."""


def _c():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def _check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise SandboxError(f"{what}: {os.strerror(err)}")


def _mount(src, target, fstype, flags, data=None):
    _check(_c().mount(src.encode() if src else None, target.encode(), fstype.encode() if fstype else None,
                      ctypes.c_ulong(flags), data.encode() if data else None), f"mount {target}")


def _unshare(flags, what):
    _check(_c().unshare(ctypes.c_int(flags)), f"unshare({what})")


def _prctl(option, arg):
    _check(_c().prctl(ctypes.c_int(option), ctypes.c_ulong(arg), ctypes.c_ulong(0), ctypes.c_ulong(0),
                      ctypes.c_ulong(0)), f"prctl({option})")


def _write(path, text):
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _mountpoints():
    points = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            parts = line.split()
            if len(parts) > 4:
                points.append(parts[4].replace("\\040", " "))
    return points


def _close_fds(keep):
    """stdin/stdout/stderr to /dev/null; every descriptor but ``keep`` closed."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        if fd != null:
            os.dup2(null, fd)
    keep = sorted({0, 1, 2, *keep})
    low = 3
    for fd in keep:
        if fd >= low:
            os.closerange(low, fd)
            low = fd + 1
    os.closerange(low, 1 << 16)


def _blocked_ancestor(path, uid):
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


def _new_dir(path, mode=0o755):
    os.makedirs(path, exist_ok=True)
    os.chmod(path, mode)


def _locked_flags(path):
    """The flags of the mount at ``path`` a remount must keep (a user namespace cannot clear them)."""
    try:
        f = os.statvfs(path).f_flag
    except OSError:
        return 0
    flags = f & (MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for st, ms in ((os.ST_NOATIME, 1024), (os.ST_NODIRATIME, 2048), (os.ST_RELATIME, 1 << 21)):
        if f & st:
            flags |= ms
    return flags


def _bind(fd, target, writable=False):
    """Bind the file or directory open as ``fd`` onto ``target`` (read-only unless ``writable``)."""
    _mount(f"/proc/self/fd/{fd}", target, None, MS_BIND)
    if not writable:
        _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _readable_by(path, uid):
    """Why the sandbox uid could not read the directory ``path`` (None: it can)."""
    st = os.stat(path)
    if uid == 0 or st.st_uid == uid or st.st_mode & 0o005 == 0o005:
        return None
    return (f"the pass root {path} is not readable by the sandbox's uid {uid} (mode {st.st_mode & 0o777:o}): "
            "make it world-readable (chmod o+rx)")


def _within(path, top):
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
        if any(_within(h, root) for h in [*hidden, "/tmp"]):
            continue
        if _within(root, "/tmp") or any(_within(root, h) for h in hidden):
            if not any(_within(root, c) for c in covered):
                covered.append(root)
        else:
            kept.append(root)
    return covered, kept


def open_import_roots(spec):
    """O_PATH descriptors of :func:`import_roots`' ``covered`` roots, by path (opened in the sandbox's mount
    namespace before anything is hidden, as bind sources must be)."""
    return {root: os.open(root, os.O_PATH) for root in import_roots(spec)[0]}


def _bind_back(roots):
    """Bind each import root (path -> O_PATH descriptor) read-only at its own path, over the tmpfs that hid it
    (the directories leading to it are made, mode 755, in that tmpfs)."""
    for root, fd in sorted(roots.items()):
        os.makedirs(os.path.dirname(root), mode=0o755, exist_ok=True)
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            os.makedirs(root, mode=0o755, exist_ok=True)
        elif not os.path.exists(root):
            os.close(os.open(root, os.O_CREAT | os.O_WRONLY, 0o444))
        _bind(fd, root)
        os.close(fd)


def _build_mounts(spec, libs, roots=None):
    """In the supervisor, after unsharing the mount namespace: see the module doc.  ``libs``: O_PATH
    descriptors of the pass roots, ``roots``: of the interpreter's import roots that the mounts hide
    (:func:`open_import_roots`), all opened before anything was hidden."""
    uid = spec["uid"]
    roots = roots or {}
    # the interpreter's own trees must stay readable for the sandbox uid: an untraversable ancestor
    # (e.g. /root, 0700, holding a pyenv) is replaced by an empty tmpfs with just that tree bound back
    keep = {}
    covered, kept = import_roots(spec)
    for tree in [*kept, *(c for c in covered if not _within(c, "/tmp"))]:  # /tmp's dirs are remade, 755
        blocked = _blocked_ancestor(os.path.join(tree, "x"), uid)
        if blocked:
            child = os.path.join(blocked, os.path.relpath(tree, blocked).split("/")[0])
            children = keep.setdefault(blocked, {})
            if child not in children:  # two trees under one child: one descriptor, never one overwritten
                children[child] = os.open(child, os.O_PATH)
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    for point in reversed(_mountpoints()):
        try:
            _mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | _locked_flags(point))
        except SandboxError:
            if point in ("/", "/proc", "/sys"):
                raise
    for blocked, children in sorted(keep.items()):
        _mount("tmpfs", blocked, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=755")
        for child, fd in children.items():
            _new_dir(child)
            _bind(fd, child)
            os.close(fd)
        _mount(None, blocked, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    hides = [h for h in spec["hide"] if os.path.isdir(h)]
    for hidden in hides:  # made read-only once the import roots inside are bound back
        _mount("tmpfs", hidden, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=555")
    dev_fds = {n: os.open(f"/dev/{n}", os.O_PATH) for n in DEV_NODES if os.path.exists(f"/dev/{n}")}
    gpu = [n for n in os.listdir("/dev") if n.startswith("nvidia")] if os.path.isdir("/dev") else []
    dev_fds.update({n: os.open(f"/dev/{n}", os.O_PATH) for n in gpu})
    _mount("tmpfs", "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,mode=755")
    for name, fd in dev_fds.items():
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            _new_dir(f"/dev/{name}")
        else:
            os.close(os.open(f"/dev/{name}", os.O_CREAT | os.O_WRONLY, 0o666))
        _mount(f"/proc/self/fd/{fd}", f"/dev/{name}", None, MS_BIND)
        os.close(fd)
    _mount(None, "/dev", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NOEXEC)
    _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={int(spec['scratch_bytes'])},mode=1777")
    for sub in ("lib", "in", "out", "home"):
        _new_dir(f"{BASE}/{sub}", 0o755)
    for i, fd in enumerate(libs):
        _new_dir(f"{BASE}/lib/{i}")
        _bind(fd, f"{BASE}/lib/{i}")
        os.close(fd)
    for sub in ("out", "home"):
        os.chown(f"{BASE}/{sub}", uid, spec["gid"])
        os.chmod(f"{BASE}/{sub}", 0o700)
    _bind_back(roots)
    for hidden in hides:
        try:
            _mount(None, hidden, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
        except SandboxError:
            if not _within(hidden, "/tmp"):  # under /tmp it is covered by /tmp's tmpfs anyway
                raise


def _session_uid(spec):
    """The uid of this session's pass (see :data:`SESSION_UID_BASE`) where this process is root and that uid
    is mapped in its user namespace (a remapped container maps fewer); else ``spec["uid"]``, shared."""
    uid = SESSION_UID_BASE + os.getpid()
    if os.geteuid() != 0:
        return spec["uid"]
    try:
        with open("/proc/self/uid_map") as fh:
            for line in fh:
                inside, _, count = (int(x) for x in line.split())
                if inside <= uid < inside + count:
                    return uid
    except (OSError, ValueError):
        pass
    return spec["uid"]


def _limits(spec):
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    size = int(spec["max_file_bytes"])
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    if os.geteuid() != 0:  # root is not bound by RLIMIT_NPROC; the sandbox uid is
        procs = int(spec["max_procs"])
        resource.setrlimit(resource.RLIMIT_NPROC, (procs, procs))


def _own_user_namespace(what):
    """Unshare a user namespace in which this process keeps its uid and gid (no other id mapped, setgroups
    denied); returns (uid, gid).  Without a /proc to write the maps to (a container's masked one), the ids stay
    unmapped: the process shows as the overflow uid."""
    uid, gid = os.geteuid(), os.getegid()
    _unshare(CLONE_NEWUSER, what)
    if os.path.exists("/proc/self/uid_map"):
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
    return uid, gid


def _enter_namespaces(spec):
    """Unshare the sandbox's mount, network and PID namespaces (inside a user namespace of its own when this
    process is not root); returns ``spec`` with the uid/gid the pass will have where that changed them."""
    if os.geteuid() != 0:
        uid, gid = _own_user_namespace("user namespace")
        spec = dict(spec, uid=uid, gid=gid)
    _unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID, "mount, network and PID namespaces")
    return spec


def _drop_privileges(spec, full):
    """Root: the sandbox uid/gid, no groups, hence no capabilities.  Non-root in ``full`` mode: a nested user
    namespace, so the mounts made above belong to a namespace the pass has no capability in.  First a fresh
    session keyring (nothing of the worker's keyrings is the pass's; the filter then denies every keyring call)."""
    if _seccomp.machine() in _seccomp.NUMBERS:
        _unpriv.join_new_session_keyring(_seccomp.number("keyctl"))
    if os.geteuid() == 0:  # best-effort too: the pass never runs as root (workers/sandbox/_unprivileged.py)
        os.setgroups([])
        os.setresgid(spec["gid"], spec["gid"], spec["gid"])
        os.setresuid(spec["uid"], spec["uid"], spec["uid"])
        if spec.get("dumpable"):
            _unpriv.set_dumpable()  # its /proc/self/fd/N import paths (reach_import_trees)
    elif full:
        _own_user_namespace("nested user namespace")
    _limits(spec)
    _prctl(PR_SET_NO_NEW_PRIVS, 1)
    try:  # after the drop, before any code of the pass: see workers/sandbox/_seccomp.py for what it denies
        _seccomp.install()
    except OSError as exc:
        raise SandboxError(f"system-call filter: {exc}") from exc


def _init_namespace(spec, full):
    """In PID 1 of the sandbox (and the probe's): its own /proc, then :func:`_drop_privileges`.

    A non-root worker in a container whose /proc has masked entries (Docker's default) may not mount a new
    proc from a user namespace (the kernel refuses a proc less covered than the one it can see): the pass
    then gets an empty read-only /proc (it sees no process at all, not the worker's)."""
    if full:
        try:
            _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        except SandboxError:
            if os.geteuid() == 0:
                raise
            _mount("tmpfs", "/proc", "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=555")
    _drop_privileges(spec, full)


def _read_all(fd):
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


class _Lines:
    """Lines read from a pipe descriptor (one ``os.read`` buffer kept between calls)."""

    def __init__(self, fd):
        self.fd, self.buf = fd, b""

    def next(self):
        """The next line without its newline, or None at end of file."""
        while b"\n" not in self.buf:
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line


def _pass_main(spec, lib_paths, req_r, ready_w, full):
    """PID 1 of the sandbox (see the module doc): mounts its /proc, drops privileges, then becomes the pass
    process of the session (:func:`_pass_zygote`).  Being the namespace's init, no signal from inside reaches it
    (a conversion cannot kill the process that reports it), and when it exits, or its supervisor kills it, the
    kernel kills everything left in the namespace.  Never returns."""
    try:
        _init_namespace(spec, full)
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        _pass_zygote(spec, lib_paths, req_r, ready_w, full)
    finally:
        os._exit(1)


def _pass_zygote(spec, lib_paths, req_r, ready_w, full):
    """The pass process of one sandbox session: its environment, import roots and import (once), then one forked
    child per request line (the conversions of one job), each ended with ``E code`` or ``S signal`` on
    ``ready_w`` (after the next conversion is pre-forked).  The import runs the pass's code in this process, so
    the line is untrusted: the supervisor takes from it only the exit code, never a time.  Never returns."""
    try:
        os.environ.clear()
        os.environ.update(spec["env"])
        home = f"{BASE}/home" if full else spec["home"]
        os.environ.update(HOME=home, TMPDIR=home)
        os.chdir(home if os.path.isdir(home) else "/")
        sys.dont_write_bytecode = True
        sys.meta_path[:] = [f for f in sys.meta_path
                            if not (getattr(f, "__module__", "") or "").startswith("__editable__")]
        for name in [m for m in sys.modules if m.split(".")[0] in spec["fresh_modules"]]:
            del sys.modules[name]
        sys.path[:0] = lib_paths
        import importlib

        importlib.invalidate_caches()
        failed = None
        try:  # the pass's own code runs from here on; modules after the first are optional
            for i, name in enumerate(spec["preimport"]):
                try:
                    importlib.import_module(name)
                except ImportError as exc:
                    if i == 0 or exc.name != name:
                        raise
        except BaseException:  # noqa: BLE001 - reported as each conversion's error once it is asked for
            failed = traceback.format_exc()
        import gc

        gc.collect()
        gc.freeze()  # the conversions inherit the imported pass without the collector copying its pages
        lines = _Lines(req_r)
        child = _prefork_conversion(req_r, failed, ready_w)  # before "ready": the supervisor watches it
        os.write(ready_w, b"r")
        while True:
            line = lines.next()
            if line is None:
                os._exit(0)
            pid, to_child = child
            os.write(to_child, line + b"\n")
            os.close(to_child)
            _, status = os.waitpid(pid, 0)
            end = f"S {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"E {os.WEXITSTATUS(status)}"
            _reap()  # orphans the conversion left (this is their init): no zombie holds the process limit
            # the next conversion is forked before the end line, so its fork always lies inside the
            # supervisor's window (a constant per conversion), never partly in, partly out
            try:
                child = _prefork_conversion(req_r, failed, ready_w)
            except OSError:  # the pass's processes hold the process limit: no further conversion here
                child = None
            os.write(ready_w, f"{end}\n".encode())  # always the last line of a conversion
            if child is None:
                os._exit(0)
    finally:
        os._exit(1)


def _reap():
    """Reap every child that has exited (without waiting)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _prefork_conversion(req_r, failed, ready_w):
    """Fork the next conversion now: it waits for its request on a pipe of its own (EOF: exit quietly).
    The child closes the pass process's protocol descriptors first (``req_r``, ``ready_w``): the conversion's
    code holds no channel to the supervisor.  Returns (its pid, the pipe's write end)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(w)
            os.close(req_r)
            os.close(ready_w)
            data = _read_all(r)
            os.close(r)
            if not data.strip():
                os._exit(0)
            _run_conversion(json.loads(data), failed)
        finally:
            os._exit(1)
    os.close(r)
    return pid, w


def _run_conversion(req, failed):
    """One conversion, in a child of the pass process: its limits, streams and ``python -m MODULE ARGV``; exits
    with the module's exit code.  It reports nothing: its time is the supervisor's to measure.  Never returns."""
    code = 1
    try:
        memory = int(req["memory"])
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
            f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(f, fd)
            os.close(f)
        if failed is not None:
            sys.stderr.write(failed)
        else:
            import gc

            gc.disable()  # a short-lived child: its exit frees everything
            sys.argv = [f"python -m {req['module']}", *req["argv"]]
            code = 0
            try:
                runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                if not isinstance(exc.code, int | None):
                    print(exc.code, file=sys.stderr)
            except BaseException:  # noqa: BLE001 - report like the interpreter would, then exit 1
                traceback.print_exc()
                code = 1
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code & 0xFF if isinstance(code, int) else 1)

#: The longest protocol line the supervisor reads from the pass process (longer: garbage, dropped).
MAX_LINE = 64


class _EndLines:
    """The pass process's ``E code`` / ``S signal`` lines on a pipe, read without blocking once readable.
    Untrusted: anything else, or a line over :data:`MAX_LINE` bytes, is dropped; the buffer never grows past it."""

    def __init__(self, fd):
        self.fd, self.buf, self.eof = fd, b"", False
        os.set_blocking(fd, False)

    def read(self):
        """The valid end lines readable now, as ("E" | "S", int); sets ``eof`` at end of file."""
        got = []
        while not self.eof:
            try:
                chunk = os.read(self.fd, 1 << 12)
            except BlockingIOError:
                break
            if not chunk:
                self.eof = True
                break
            self.buf += chunk
            *lines, self.buf = self.buf.split(b"\n")
            if len(self.buf) > MAX_LINE:
                self.buf = b""
            for line in lines:
                words = line.split()
                if (len(line) <= MAX_LINE and len(words) == 2 and words[0] in (b"E", b"S")
                        and words[1].isdigit() and len(words[1]) <= 3):
                    got.append((words[0].decode(), int(words[1])))
        return got

    def drain(self):
        """Drop whatever is readable now."""
        self.read()


def _children(proc, pid):
    """Host pids of ``pid``'s children (of every thread; zombies included), read through the host's /proc
    (``proc``).  Empty when ``pid`` is gone."""
    out = []
    try:
        tasks = os.open(f"{pid}/task", os.O_RDONLY | os.O_DIRECTORY, dir_fd=proc)
    except OSError:
        return out
    try:
        tids = os.listdir(tasks)
    finally:
        os.close(tasks)
    for tid in tids:
        try:
            out.extend(int(c) for c in _read_small(proc, f"{pid}/task/{tid}/children").split())
        except (OSError, ValueError):
            continue
    return out


def _read_small(proc, path):
    fd = os.open(path, os.O_RDONLY, dir_fd=proc)
    try:
        return os.read(fd, 1 << 16)
    finally:
        os.close(fd)


#: Processes of a sandbox whose CPU time one snapshot reads at most (the sandbox uid's RLIMIT_NPROC is less).
MAX_TREE = 4096


def _tree_cpu(proc, root):
    """CPU seconds (user + system, with those of reaped children) of every descendant of ``root``, from the
    kernel's accounting in the host's /proc: the pass process, its threads, every process of the sandbox
    (zombies included).  Descendants are read before their parents, so a process reaped during the read is
    counted at worst twice (in itself and in its parent), never lost."""
    order, stack = [], _children(proc, root)
    while stack and len(order) < MAX_TREE:
        pid = stack.pop()
        order.append(pid)
        stack.extend(_children(proc, pid))
    ticks = 0
    for pid in reversed(order):
        try:
            fields = _read_small(proc, f"{pid}/stat").rsplit(b")", 1)[1].split()
            ticks += sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
        except (OSError, IndexError, ValueError):
            continue
    return ticks / os.sysconf("SC_CLK_TCK")


def _session_cpu(cgroup, proc):
    """CPU seconds the session's processes spent so far: its cgroup's account (microseconds) where it has one,
    else :func:`_tree_cpu` (clock ticks)."""
    return cgroup.cpu_s() if cgroup is not None else _tree_cpu(proc, os.getpid())


def _pidfds(pids):
    """Descriptors that become readable when each of ``pids`` exits (those already gone are left out)."""
    fds = []
    for pid in pids:
        try:
            fds.append(os.pidfd_open(pid))
        except OSError:
            continue
    return fds


def _await_child(proc, pid1, pid1_fd):
    """``pid1``'s children once it has one (the conversion it pre-forks before it says it is ready and before
    each end line; a line alone, which the pass's code may forge, is not taken as a sign of it); empty when
    ``pid1`` exited first (``pid1_fd``: its pidfd)."""
    import select

    while True:
        children = _children(proc, pid1)
        if children or select.select([pid1_fd], [], [], 0.001)[0]:
            return children


def _await_end(said, watched):
    """Wait until the pass process's end line arrived *and* every process in ``watched`` (pidfds of the
    conversion it had pre-forked) has exited; returns (the line or None at end of file, the time.perf_counter()
    then).  A line alone, forged by the pass's code, cannot end the wait before the conversion process ends.
    Closes ``watched``."""
    import select

    poller = select.poll()
    poller.register(said.fd, select.POLLIN)
    for fd in watched:
        poller.register(fd, select.POLLIN)
    pending, end = set(watched), None
    try:
        while (end is None or pending) and not said.eof:
            for fd, _ in poller.poll():
                if fd == said.fd:
                    lines = said.read()
                    end = end or (lines[0] if lines else None)
                    if said.eof:
                        poller.unregister(fd)
                elif fd in pending:
                    pending.discard(fd)
                    poller.unregister(fd)
        return (end if not pending else None), time.perf_counter()
    finally:
        for fd in watched:
            os.close(fd)


def _kill(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


#: The cgroup v2 group of a session is named for its supervisor's pid, under the supervisor's own group.
CGROUP_PREFIX = "ampci-sandbox-"


def _own_cgroup_dir():
    """The path of this process's cgroup v2 group (None: no cgroup v2 here)."""
    mount = None
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            parts = line.split()
            if "-" in parts and parts[parts.index("-") + 1:][:1] == ["cgroup2"]:
                mount = parts[4]
                break
    if mount is None:
        return None
    with open("/proc/self/cgroup") as fh:
        rel = next((ln.split("::", 1)[1].strip() for ln in fh if ln.startswith("0::")), None)
    return None if rel is None else os.path.join(mount, rel.lstrip("/"))


class _Cgroup:
    """A cgroup v2 group of one session (where this process may make one: root, a writable cgroup2): every
    process of the sandbox is put in it from its start, so its ``cpu.stat`` is the kernel's microsecond account
    of all of them, those auto-reaped included.  Its descriptors are opened before the sandbox's mounts (which
    make /sys read-only in the supervisor's namespace)."""

    def __init__(self):
        base = _own_cgroup_dir()
        if base is None:
            raise OSError("no cgroup v2")
        sweep_session_cgroups(base)
        self.parent = os.open(base, os.O_PATH | os.O_DIRECTORY)
        self.name = f"{CGROUP_PREFIX}{os.getpid()}"
        try:
            os.mkdir(self.name, 0o755, dir_fd=self.parent)
            self.procs = os.open(f"{self.name}/cgroup.procs", os.O_WRONLY, dir_fd=self.parent)
            self.stat = os.open(f"{self.name}/cpu.stat", os.O_RDONLY, dir_fd=self.parent)
        except OSError:
            self.remove()
            raise

    def add(self, pid):
        os.write(self.procs, str(pid).encode())

    def cpu_s(self):
        """user + system seconds of every process that was in the group (microseconds)."""
        for line in os.pread(self.stat, 4096, 0).split(b"\n"):
            if line.startswith(b"usage_usec "):
                return int(line.split()[1]) / 1e6
        raise OSError("no usage_usec in cpu.stat")

    def remove(self):
        """Remove the group (once its processes are gone; a few tries) and close its descriptors."""
        for name in ("procs", "stat"):
            fd = self.__dict__.pop(name, None)
            if fd is not None:
                os.close(fd)
        for _ in range(50):
            try:
                os.rmdir(self.name, dir_fd=self.parent)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.01)
        os.close(self.parent)


def sweep_session_cgroups(base=None):
    """Remove the session cgroups (beside this process's own) whose supervisor is gone: a supervisor killed on
    a timeout, or idle when its zygote was stopped, cannot remove its own.  Empty groups only (the kernel
    refuses others).  Never raises."""
    try:
        base = base or _own_cgroup_dir()
        for name in os.listdir(base) if base else ():
            if name.startswith(CGROUP_PREFIX) and name[len(CGROUP_PREFIX):].isdigit():
                try:
                    os.kill(int(name[len(CGROUP_PREFIX):]), 0)
                except ProcessLookupError:
                    try:
                        os.rmdir(os.path.join(base, name))
                    except OSError:
                        pass
                except OSError:
                    pass
    except OSError:
        pass
    _cgl.sweep_all()  # the limit groups of cgroup v1 hierarchies (workers/sandbox/_cglimits.py)
    _unpriv.sweep_orphans(SESSION_UID_BASE)  # best-effort processes of sessions killed on a timeout



def _copy_out(src, host_root, dest, cap, owner=None):
    """Copy ``src`` (inside the sandbox's tmpfs) to ``dest`` (a host path, opened from ``host_root``), at
    most ``cap`` bytes.  Returns None when copied (or not written: the worker sees no file), else why not:
    only a regular file is read -- opened without following a symlink and without blocking (a FIFO never
    stalls the supervisor), then checked with ``fstat`` -- and a sparse one (far fewer blocks than bytes: it
    cost the pass nothing and would cost the host its size) is refused.  ``owner`` (best effort, whose scratch
    directory shares a filesystem with the host's files): the file must be that uid's, with one link (a hard
    link the pass made to a file of the host's is refused)."""
    try:
        fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None  # not written: the worker sees no file
    except OSError as exc:  # a symlink (ELOOP), a device it may not open, ...
        return f"not a regular file: {os.strerror(exc.errno or 0)}"
    try:
        st = os.fstat(fd)
        if not os.path.stat.S_ISREG(st.st_mode):
            return "not a regular file"
        if owner is not None and (st.st_uid != owner or st.st_nlink != 1):
            return "not a file of the pass's own"
        if st.st_size > SPARSE_SLACK and st.st_blocks * 512 < st.st_size // 2:
            return "sparse"
        if st.st_size > cap:
            return "over the size limit"
        out = os.open(dest.lstrip("/"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644,
                      dir_fd=host_root)
        try:
            left = st.st_size
            while left > 0:
                sent = os.sendfile(out, fd, None, min(left, 1 << 24))
                if sent <= 0:
                    break
                left -= sent
        finally:
            os.close(out)
        return None
    finally:
        os.close(fd)


#: The bytes one conversion's outputs may bring out together: ``OUTPUT_FACTOR`` x its inputs + ``OUTPUT_SLACK``.
OUTPUT_FACTOR, OUTPUT_SLACK = 4, 64 << 20

#: A file this small is never called sparse (tmpfs may allocate a small file's pages lazily).
SPARSE_SLACK = 1 << 20


def supervise(spec, req_fd, done_fd):
    """The supervisor of one sandbox session (see the module doc), in a process freshly forked from a zygote:
    makes the sandbox and its pass process, then serves request lines on ``req_fd`` (JSON; the conversions of one
    job), answering each with one JSON line on ``done_fd``.  End of file on ``req_fd`` ends the session: the
    sandbox's init is killed, and with it every process of the pass.  Never returns."""
    code, pid1, full, home, cgroup, limits = 1, None, spec["mode"] == "full", None, None, None
    try:
        os.setsid()
        _close_fds([req_fd, done_fd])
        spec = dict(spec, uid=_session_uid(spec))
        host_root = os.open("/", os.O_PATH | os.O_DIRECTORY)  # the worker's view, for inputs and outputs
        proc = os.open("/proc", os.O_PATH | os.O_DIRECTORY)  # the host's, before the pass mounts its own
        if not full:  # orphans of the pass become this process's children, so they are still counted
            _prctl(PR_SET_CHILD_SUBREAPER, 1)
        if full:
            try:
                cgroup = _Cgroup()
            except OSError:  # no writable cgroup v2: the CPU figure comes from /proc, in clock ticks
                cgroup = None
            limits = _cgl.Limits(spec["max_procs"], cgroup and (cgroup.parent, cgroup.name))
            spec = _enter_namespaces(spec)
            for path in [*spec["lib"], *[os.path.join(p, "amp_pass") for p in spec["lib"][-1:]]]:
                why = os.path.isdir(path) and _readable_by(path, spec["uid"])
                if why:
                    raise SandboxError(why)
            # opened in the new namespace (a bind mount's source must be in the caller's namespace)
            _build_mounts(spec, [os.open(p, os.O_PATH | os.O_DIRECTORY) for p in spec["lib"]],
                          open_import_roots(spec))
            lib_paths = [f"{BASE}/lib/{i}" for i in range(len(spec["lib"]))]
        else:  # best effort: a scratch directory of its own (workers/sandbox/_unprivileged.py), removed at the end
            if os.geteuid() != 0:  # no drop: the pass runs as this process's uid
                spec = dict(spec, uid=os.geteuid(), gid=os.getegid())
            _unpriv.sweep_orphans(SESSION_UID_BASE)  # what sessions killed on a timeout left
            home, lib_paths = _unpriv.make_scratch(spec)
            spec = dict(spec, home=f"{home}/home", scratch=home)
            limits = _cgl.Limits(spec["max_procs"])
        req_r, req_w = os.pipe()
        ready_r, ready_w = os.pipe()
        go_r, go_w = os.pipe()
        pid1 = os.fork()
        if pid1 == 0:
            os.close(req_w)
            os.close(ready_r)
            os.close(go_w)
            # every descriptor of the supervisor's but this process's own pipes (the protocol's, the worker's
            # view of / and /proc, the cgroup's files, any O_PATH descriptor of the mounts)
            _close_fds([req_r, ready_w, go_r])
            if not full and os.geteuid() == 0:  # the import trees the dropped uid could not reach otherwise
                reached = _unpriv.reach_import_trees([*sys.path, *spec["interpreter"]], spec["uid"])
                spec = dict(spec, dumpable=bool(reached))  # their /proc/self/fd/N paths need it
            if not os.read(go_r, 1):  # in its cgroup (when there is one) before anything runs
                os._exit(1)
            os.close(go_r)
            _pass_main(spec, lib_paths, req_r, ready_w, full)
        os.close(req_r)
        os.close(ready_w)
        os.close(go_r)
        if cgroup is not None:
            try:
                cgroup.add(pid1)
            except OSError:
                cgroup.remove()
                cgroup = None
        limits.add(pid1)  # a group of its own, with pids.max and a memory limit (workers/sandbox/_cglimits.py)
        os.write(go_w, b"g")
        os.close(go_w)
        pid1_fd = os.pidfd_open(pid1)
        ready = os.read(ready_r, 1)
        requests, said = _Lines(req_fd), _EndLines(ready_r)
        copied = {}  # host input -> its copy inside (a job's conversions read the same input)
        while True:
            line = requests.next()
            if line is None:
                break
            if not line.strip():
                continue
            if not ready:
                raise SandboxError("the sandboxed pass process ended before it was ready")
            req = json.loads(line)
            inside = dict(req)
            outs = req["outputs"]  # host path -> name inside out/
            base = BASE if full else spec["scratch"]  # best effort: the same layout in its scratch directory
            for name in os.listdir(f"{base}/out"):  # the previous conversion's files
                os.unlink(f"{base}/out/{name}")
            mapping = {h: f"{base}/out/{n}" for h, n in outs.items()}
            for host in req["inputs"]:
                if host not in copied:
                    copied[host] = f"{base}/in/{len(copied)}-{os.path.basename(host)}"
                    _copy_in(host, host_root, copied[host])
                mapping[host] = copied[host]
            mapping.update({p: lib_paths[i] for i, p in enumerate(spec["lib"])})
            inside.update(argv=[mapping.get(a, a) for a in req["argv"]], stdout=f"{base}/out/.stdout",
                          stderr=f"{base}/out/.stderr")
            limits.memory_at_least(int(req["memory"]) + int(spec["scratch_bytes"]))  # its tmpfs pages count
            said.drain()  # lines left from an earlier conversion (or forged) say nothing about this one
            children = _await_child(proc, pid1, pid1_fd)  # the conversion pid1 pre-forked
            cpu_before = _session_cpu(cgroup, proc)
            start = time.perf_counter()
            if children:
                watched = _pidfds(children)
                os.write(req_w, (json.dumps(inside) + "\n").encode())
                end, wall = _await_end(said, watched)
            else:  # the pass process ended (it could fork no further conversion): so does the session
                end, wall = None, start
            wall -= start
            reply = {"wall_s": wall}
            if end is None:  # the pass process closed its pipe or died: this session ends here
                _kill(pid1)
                _, status = os.waitpid(pid1, 0)
                pid1 = None
                reply["signal"] = os.WTERMSIG(status) if os.WIFSIGNALED(status) else signal.SIGKILL
            else:
                cpu = _session_cpu(cgroup, proc) - cpu_before
                if end[0] == "S":
                    reply["signal"] = end[1]
                else:
                    reply["code"] = end[1] & 0xFF
                    reply["cpu_s"] = round(min(max(0.0, cpu), wall * (os.cpu_count() or 1) + 1.0), 6)
            # both modes: the trusted side copies the outputs out, by the same rules
            cap = int(spec["max_file_bytes"])
            # the outputs of one conversion together: a small multiple of its inputs (stdout/stderr: cap each)
            left = [OUTPUT_FACTOR * sum(os.stat(copied[h]).st_size for h in req["inputs"]) + OUTPUT_SLACK]
            refused = []
            for host, name in [*outs.items(), (req["stdout"], ".stdout"), (req["stderr"], ".stderr")]:
                src, total = f"{base}/out/{name}", name in outs.values()
                refused.append((os.path.basename(host),
                                _copy_out(src, host_root, host, min(cap, left[0]) if total else cap,
                                          None if full else spec["uid"])))
                if total and refused[-1][1] is None and os.path.lexists(src):
                    left[0] -= os.lstat(src).st_size
            too_big = [f"{name} ({why})" for name, why in refused if why]
            if too_big:
                reply["oversized"] = too_big
            os.write(done_fd, (json.dumps(reply) + "\n").encode())
            if pid1 is None:
                break
        code = 0
    except BaseException as exc:  # noqa: BLE001 - the zygote reports a failed sandbox as a crash
        try:
            os.write(done_fd, (json.dumps({"sandbox_error": f"{type(exc).__name__}: {exc}"}) + "\n").encode())
        except OSError:
            pass
    finally:
        try:
            if pid1 is not None:  # the session's end: its init, hence every process of the pass
                os.kill(pid1, signal.SIGKILL)
                os.waitpid(pid1, 0)
            if not full and spec.get("uid", 0) >= SESSION_UID_BASE:  # what left the process group: its uid's
                _unpriv.kill_uid(spec["uid"])
            if home is not None:
                _unpriv.remove_scratch(home)
            if limits is not None:
                limits.remove()
            if cgroup is not None:
                cgroup.remove()
            if not full:  # no PID namespace: what the pass left in this process group goes with it
                os.killpg(os.getpgrp(), signal.SIGKILL)
        finally:
            os._exit(code)


def _copy_in(host, host_root, target):
    """Copy the worker's file ``host`` (resolved in the worker's mount namespace through ``host_root``) to
    ``target`` in the sandbox's tmpfs, read-only for the pass (a bind mount cannot take its source from
    another mount namespace)."""
    src = os.open(host.lstrip("/"), os.O_RDONLY | os.O_NOFOLLOW, dir_fd=host_root)
    try:
        out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
        try:
            left = os.fstat(src).st_size
            while left > 0:
                sent = os.sendfile(out, src, None, min(left, 1 << 24))
                if sent <= 0:
                    break
                left -= sent
        finally:
            os.close(out)
    finally:
        os.close(src)


def probe(spec):
    """None when a ``full`` sandbox can be made here, else why not (one line).  Forks a child that makes
    the namespaces and mounts of :func:`supervise` and drops privileges, then exits."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        why = ""
        try:
            spec = _enter_namespaces(spec)
            _build_mounts(spec, [], open_import_roots(spec))
            inner_r, inner_w = os.pipe()
            child = os.fork()
            if child == 0:  # PID 1 of the new PID namespace, as the pass's init: its /proc, then the drop
                os.close(inner_r)
                inner = ""
                try:
                    _init_namespace(spec, True)
                except BaseException as exc:  # noqa: BLE001
                    inner = f"{type(exc).__name__}: {exc}"
                os.write(inner_w, inner.encode()[:500])
                os._exit(0)
            os.close(inner_w)
            why = _read_all(inner_r).decode(errors="replace")
            os.waitpid(child, 0)
        except BaseException as exc:  # noqa: BLE001
            why = f"{type(exc).__name__}: {exc}"
        os.write(w, why.encode()[:500])
        os._exit(0)
    os.close(w)
    why = _read_all(r).decode(errors="replace")
    os.close(r)
    os.waitpid(pid, 0)
    return why or None
