"""The sandbox's pass process: its privileges, limits and conversions (standard library only; loaded by
file path).

PID 1 of the sandbox's PID namespace (:func:`pass_main`) mounts its own ``/proc``, joins a fresh session
keyring, drops to the session's uid (root) or nests a user namespace (non-root), sets ``PR_SET_NO_NEW_PRIVS``,
the limits and the system-call filter, takes the allow-listed environment, imports the pass once (with the
worker's trusted bytecode of it where the session has some: :func:`use_bytecode`), and forks
one conversion per request; a conversion closes the protocol pipes before any pass code runs.
"""

import json
import os
import resource
import runpy
import signal
import sys
import traceback

_kernel = sys.modules["_ampci_kernel"]  # loaded first, by _sandbox.py (workers/sandbox/_kernel.py: load_sibling)
_seccomp = _kernel.load_sibling("_seccomp")
_unpriv = _kernel.load_sibling("_unprivileged")


def session_uid(spec):
    """The uid of this session's pass (see :data:`_kernel.SESSION_UID_BASE`) where this process is root and that uid
    is mapped in its user namespace (a remapped container maps fewer); else ``spec["uid"]``, shared."""
    uid = _kernel.SESSION_UID_BASE + os.getpid()
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


def set_limits(spec):
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    size = int(spec["max_file_bytes"])
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    if os.geteuid() != 0:  # root is not bound by RLIMIT_NPROC; the sandbox uid is
        procs = int(spec["max_procs"])
        resource.setrlimit(resource.RLIMIT_NPROC, (procs, procs))


def own_user_namespace(what):
    """Unshare a user namespace in which this process keeps its uid and gid (no other id mapped, setgroups
    denied); returns (uid, gid).  Without a /proc to write the maps to (a container's masked one), the ids stay
    unmapped: the process shows as the overflow uid."""
    uid, gid = os.geteuid(), os.getegid()
    _kernel.unshare(_kernel.CLONE_NEWUSER, what)
    if os.path.exists("/proc/self/uid_map"):
        _kernel.write_file("/proc/self/setgroups", "deny")
        _kernel.write_file("/proc/self/uid_map", f"{uid} {uid} 1")
        _kernel.write_file("/proc/self/gid_map", f"{gid} {gid} 1")
    return uid, gid


def enter_namespaces(spec):
    """Unshare the sandbox's mount, network and PID namespaces (inside a user namespace of its own when this
    process is not root); returns ``spec`` with the uid/gid the pass will have where that changed them."""
    if os.geteuid() != 0:
        uid, gid = own_user_namespace("user namespace")
        spec = dict(spec, uid=uid, gid=gid)
    _kernel.unshare(_kernel.CLONE_NEWNS | _kernel.CLONE_NEWNET | _kernel.CLONE_NEWPID, "mount, network and PID namespaces")
    return spec


def drop_privileges(spec, full):
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
        own_user_namespace("nested user namespace")
    set_limits(spec)
    _kernel.prctl(_kernel.PR_SET_NO_NEW_PRIVS, 1)
    try:  # after the drop, before any code of the pass: see workers/sandbox/_seccomp.py for what it denies
        _seccomp.install()
    except OSError as exc:
        raise _kernel.SandboxError(f"system-call filter: {exc}") from exc


def init_namespace(spec, full):
    """In PID 1 of the sandbox (and the probe's): its own /proc, then :func:`drop_privileges`.

    A non-root worker in a container whose /proc has masked entries (Docker's default) may not mount a new
    proc from a user namespace (the kernel refuses a proc less covered than the one it can see): the pass
    then gets an empty read-only /proc (it sees no process at all, not the worker's)."""
    if full:
        try:
            _kernel.mount("proc", "/proc", "proc", _kernel.MS_NOSUID | _kernel.MS_NODEV | _kernel.MS_NOEXEC)
        except _kernel.SandboxError:
            if os.geteuid() == 0:
                raise
            _kernel.mount("tmpfs", "/proc", "tmpfs", _kernel.MS_RDONLY | _kernel.MS_NOSUID | _kernel.MS_NODEV | _kernel.MS_NOEXEC, "size=4k,mode=555")
    drop_privileges(spec, full)


def pass_main(spec, lib_paths, req_r, ready_w, full):
    """PID 1 of the sandbox (see the module doc): mounts its /proc, drops privileges, then becomes the pass
    process of the session (:func:`pass_zygote`).  Being the namespace's init, no signal from inside reaches it
    (a conversion cannot kill the process that reports it), and when it exits, or its supervisor kills it, the
    kernel kills everything left in the namespace.  Never returns."""
    try:
        init_namespace(spec, full)
        _kernel.prctl(_kernel.PR_SET_PDEATHSIG, signal.SIGKILL)
        pass_zygote(spec, lib_paths, req_r, ready_w, full)
    finally:
        os._exit(1)


def pass_zygote(spec, lib_paths, req_r, ready_w, full):
    """The pass process of one sandbox session: its environment, import roots and import (once), then one forked
    child per request line (the conversions of one job), each ended with ``E code`` or ``S signal`` on
    ``ready_w`` (after the next conversion is pre-forked).  The import runs the pass's code in this process, so
    the line is untrusted: the supervisor takes from it only the exit code, never a time.  Never returns."""
    try:
        os.environ.clear()
        os.environ.update(spec["env"])
        home = f"{_kernel.BASE}/home" if full else spec["home"]
        os.environ.update(HOME=home, TMPDIR=home)
        os.chdir(home if os.path.isdir(home) else "/")
        sys.dont_write_bytecode = True
        sys.meta_path[:] = [f for f in sys.meta_path
                            if not (getattr(f, "__module__", "") or "").startswith("__editable__")]
        for name in [m for m in sys.modules if m.split(".")[0] in spec["fresh_modules"]]:
            del sys.modules[name]
        sys.path[:0] = lib_paths
        import importlib

        if spec.get("pyc"):
            use_bytecode(spec["pyc"])
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
        lines = _kernel.Lines(req_r)
        child = prefork_conversion(req_r, failed, ready_w)  # before "ready": the supervisor watches it
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
            reap()  # orphans the conversion left (this is their init): no zombie holds the process limit
            # the next conversion is forked before the end line, so its fork always lies inside the
            # supervisor's window (a constant per conversion), never partly in, partly out
            try:
                child = prefork_conversion(req_r, failed, ready_w)
            except OSError:  # the pass's processes hold the process limit: no further conversion here
                child = None
            os.write(ready_w, f"{end}\n".encode())  # always the last line of a conversion
            if child is None:
                os._exit(0)
    finally:
        os._exit(1)


def use_bytecode(roots):
    """Import the modules under each pass root in ``roots`` (its path here -> the directory of its trusted
    bytecode here, read-only: :mod:`workers.sandbox.bytecode`) with that bytecode: a finder for those roots
    whose loader reads ``x.cpython-3NN.pyc`` from that directory where it would read ``__pycache__/...``.  The
    bytecode is checked-hash (PEP 552): the importer hashes the source and runs the bytecode only when it was
    compiled from exactly that source, else compiles the source (and writes nothing: ``dont_write_bytecode``).
    Every other import (the standard library, site-packages) is as before."""
    from importlib import machinery

    def within(path):
        for lib, pyc in roots.items():
            if path == lib or path.startswith(lib + "/"):
                return lib, pyc
        return None

    class Loader(machinery.SourceFileLoader):
        def get_data(self, path):
            if path.endswith(".pyc"):
                cache_dir, name = os.path.split(path)
                src_dir, cache = os.path.split(cache_dir)
                found = within(src_dir) if cache == "__pycache__" else None
                if found is not None:
                    path = os.path.join(found[1], os.path.relpath(src_dir, found[0]), name)
            return super().get_data(path)

    details = [(machinery.ExtensionFileLoader, machinery.EXTENSION_SUFFIXES),
               (Loader, machinery.SOURCE_SUFFIXES),
               (machinery.SourcelessFileLoader, machinery.BYTECODE_SUFFIXES)]

    def hook(path):
        if within(path) is None:
            raise ImportError("not a pass root")
        return machinery.FileFinder(path, *details)

    sys.path_hooks.insert(0, hook)
    for path in list(sys.path_importer_cache):
        if within(path) is not None:
            del sys.path_importer_cache[path]


def reap():
    """Reap every child that has exited (without waiting)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def prefork_conversion(req_r, failed, ready_w):
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
            data = _kernel.read_all(r)
            os.close(r)
            if not data.strip():
                os._exit(0)
            run_conversion(json.loads(data), failed)
        finally:
            os._exit(1)
    os.close(r)
    return pid, w


def run_conversion(req, failed):
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
