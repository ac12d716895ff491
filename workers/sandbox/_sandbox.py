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
  allow-listed environment, imports ``amp_pass`` from the revision's root once (with the bytecode the worker
  compiled for it, :mod:`workers.sandbox.bytecode`, bound read-only at ``/tmp/.ampci/pyc``), and then forks one
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
the pass process is put in before it runs anything (:class:`workers.sandbox._accounting.SessionCgroup`: microseconds, auto-reaped processes
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

import json
import os
import signal
import sys
import time


def _boot():
    """:mod:`workers.sandbox._kernel`, loaded by file path from beside this file as ``_ampci_kernel`` (once)."""
    mod = sys.modules.get("_ampci_kernel")
    if mod is None:
        import importlib.util

        spec = importlib.util.spec_from_file_location(
            "_ampci_kernel", os.path.join(os.path.dirname(os.path.abspath(__file__)), "_kernel.py"))
        mod = importlib.util.module_from_spec(spec)
        sys.modules["_ampci_kernel"] = mod
        spec.loader.exec_module(mod)
    return mod


_kernel = _boot()
_seccomp = _kernel.load_sibling("_seccomp")
_unpriv = _kernel.load_sibling("_unprivileged")
_cgl = _kernel.load_sibling("_cglimits")
_mounts = _kernel.load_sibling("_mounts")
_passproc = _kernel.load_sibling("_passproc")
_accounting = _kernel.load_sibling("_accounting")

#: What callers of the loaded module use (:mod:`workers.sandbox.policy`, :mod:`workers.sandbox.zygotes`, tests).
SandboxError = _kernel.SandboxError
SESSION_UID_BASE = _kernel.SESSION_UID_BASE
sweep_session_cgroups = _accounting.sweep_session_cgroups
import_roots = _mounts.import_roots
open_import_roots = _mounts.open_import_roots


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
            _kernel.send_all(out, fd, st.st_size)
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
        _kernel.close_fds([req_fd, done_fd])
        spec = dict(spec, uid=_passproc.session_uid(spec))
        host_root = os.open("/", os.O_PATH | os.O_DIRECTORY)  # the worker's view, for inputs and outputs
        proc = os.open("/proc", os.O_PATH | os.O_DIRECTORY)  # the host's, before the pass mounts its own
        if not full:  # orphans of the pass become this process's children, so they are still counted
            _kernel.prctl(_kernel.PR_SET_CHILD_SUBREAPER, 1)
        if full:
            try:
                cgroup = _accounting.SessionCgroup()
            except OSError:  # no writable cgroup v2: the CPU figure comes from /proc, in clock ticks
                cgroup = None
            limits = _cgl.Limits(spec["max_procs"], cgroup and (cgroup.parent, cgroup.name))
            spec = _passproc.enter_namespaces(spec)
            for path in [*spec["lib"], *[os.path.join(p, "amp_pass") for p in spec["lib"][-1:]]]:
                why = os.path.isdir(path) and _mounts.readable_by(path, spec["uid"])
                if why:
                    raise _kernel.SandboxError(why)
            # opened in the new namespace (a bind mount's source must be in the caller's namespace)
            pycs = _mounts.open_bytecode(spec)
            _mounts.build_mounts(spec, [os.open(p, os.O_PATH | os.O_DIRECTORY) for p in spec["lib"]],
                          open_import_roots(spec), pycs)
            lib_paths = [f"{_kernel.BASE}/lib/{i}" for i in range(len(spec["lib"]))]
            spec = dict(spec, pyc={lib_paths[i]: f"{_kernel.BASE}/pyc/{i}" for i in pycs})
        else:  # best effort: a scratch directory of its own (workers/sandbox/_unprivileged.py), removed at the end
            if os.geteuid() != 0:  # no drop: the pass runs as this process's uid
                spec = dict(spec, uid=os.geteuid(), gid=os.getegid())
            _unpriv.sweep_orphans(SESSION_UID_BASE)  # what sessions killed on a timeout left
            home, lib_paths = _unpriv.make_scratch(spec)
            spec = dict(spec, home=f"{home}/home", scratch=home, pyc=_unpriv.copy_bytecode(spec, home, lib_paths))
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
            _kernel.close_fds([req_r, ready_w, go_r])
            if not full and os.geteuid() == 0:  # the import trees the dropped uid could not reach otherwise
                reached = _unpriv.reach_import_trees([*sys.path, *spec["interpreter"]], spec["uid"])
                spec = dict(spec, dumpable=bool(reached))  # their /proc/self/fd/N paths need it
            if not os.read(go_r, 1):  # in its cgroup (when there is one) before anything runs
                os._exit(1)
            os.close(go_r)
            _passproc.pass_main(spec, lib_paths, req_r, ready_w, full)
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
        requests, said = _kernel.Lines(req_fd), _accounting.EndLines(ready_r)
        copied = {}  # host input -> its copy inside (a job's conversions read the same input)
        while True:
            line = requests.next()
            if line is None:
                break
            if not line.strip():
                continue
            if not ready:
                raise _kernel.SandboxError("the sandboxed pass process ended before it was ready")
            req = json.loads(line)
            inside = dict(req)
            outs = req["outputs"]  # host path -> name inside out/
            base = _kernel.BASE if full else spec["scratch"]  # best effort: the same layout in its scratch directory
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
            children = _accounting.await_child(proc, pid1, pid1_fd)  # the conversion pid1 pre-forked
            cpu_before = _accounting.session_cpu(cgroup, proc)
            start = time.perf_counter()
            if children:
                watched = _accounting.pidfds(children)
                os.write(req_w, (json.dumps(inside) + "\n").encode())
                end, wall = _accounting.await_end(said, watched)
            else:  # the pass process ended (it could fork no further conversion): so does the session
                end, wall = None, start
            wall -= start
            reply = {"wall_s": wall}
            if end is None:  # the pass process closed its pipe or died: this session ends here
                _kernel.kill(pid1)
                _, status = os.waitpid(pid1, 0)
                pid1 = None
                reply["signal"] = os.WTERMSIG(status) if os.WIFSIGNALED(status) else signal.SIGKILL
            else:
                cpu = _accounting.session_cpu(cgroup, proc) - cpu_before
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
            _kernel.send_all(out, src, os.fstat(src).st_size)
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
            spec = _passproc.enter_namespaces(spec)
            _mounts.build_mounts(spec, [], open_import_roots(spec))
            inner_r, inner_w = os.pipe()
            child = os.fork()
            if child == 0:  # PID 1 of the new PID namespace, as the pass's init: its /proc, then the drop
                os.close(inner_r)
                inner = ""
                try:
                    _passproc.init_namespace(spec, True)
                except BaseException as exc:  # noqa: BLE001
                    inner = f"{type(exc).__name__}: {exc}"
                os.write(inner_w, inner.encode()[:500])
                os._exit(0)
            os.close(inner_w)
            why = _kernel.read_all(inner_r).decode(errors="replace")
            os.waitpid(child, 0)
        except BaseException as exc:  # noqa: BLE001
            why = f"{type(exc).__name__}: {exc}"
        os.write(w, why.encode()[:500])
        os._exit(0)
    os.close(w)
    why = _kernel.read_all(r).decode(errors="replace")
    os.close(r)
    os.waitpid(pid, 0)
    return why or None
