"""Conversion zygote: imports a pass once, then forks one isolated child per conversion.

Run as a *script* (``python workers/_zygote.py PASS_ROOT``, never as ``-m workers...``) so that a
pass root holding another revision of this repository cannot shadow the zygote's own code; it
imports nothing from ``workers``.  Protocol, one JSON object per line:

- zygote -> worker at start: ``{"ready": true}`` or ``{"ready": false, "error": "..."}``;
- worker -> zygote: ``{"argv": [...], "stdout": PATH, "stderr": PATH, "memory": BYTES}``;
- zygote -> worker: ``{"pid": CHILD}`` at once, then ``{"pid": CHILD, "code": N, "cpu_s": S}`` or
  ``{"pid": CHILD, "signal": N}`` when the child ends (``cpu_s``: the user + system CPU seconds the child
  spent from receiving its request to its exit, all its threads, as ``getrusage`` counts them in the child).

The zygote is either this script (a fresh interpreter: the fallback) or, when its worker started a
fork server (:func:`workers.zygotes.start_forkserver`), a process forked from that preloaded server
that calls :func:`become` (the server has numpy, onnx and onnx_ir imported, never ``amp_pass``; the
revision's ``amp_pass`` is imported in the forked zygote only).

The child runs in its own session (the worker kills its process group on timeout) with
``RLIMIT_AS`` set, stdout/stderr redirected to the given files, and executes ``amp_pass`` as
``python -m amp_pass ARGV`` would, so the pass sees the same contract as a fresh subprocess.
The next child is forked as soon as the previous one ended (it waits for its request on a pipe),
and a child reports its exit code on a pipe before its address space is torn down, so neither the
fork nor the exit is on a job's critical path.  A child killed by a signal writes no code: the
zygote then reports the signal from ``waitpid``.
"""

import gc
import json
import os
import resource
import runpy
import sys
import traceback


def _cpu_seconds(since=None):
    """User + system CPU seconds of this process (all its threads; ``getrusage``: microseconds, where
    ``os.times`` counts 10 ms clock ticks), less ``since`` (an earlier value of this function)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    spent = ru.ru_utime + ru.ru_stime
    return spent - since if since is not None else spent


def _child(req, done_fd, started=None):
    gc.disable()  # a short-lived child: os._exit frees everything, a collection would only cost time
    limit = int(req["memory"])
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)
    sys.argv = ["python -m amp_pass", *req["argv"]]
    code = 0
    try:
        runpy.run_module("amp_pass", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, int | None):
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - report like the interpreter would, then exit 1
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            try:  # the exit code and CPU time before the (slow) address-space teardown of os._exit
                os.write(done_fd, f"{code & 0xFF} {max(0.0, _cpu_seconds(started)):.6f}\n".encode())
            finally:
                os._exit(code)


def _read_all(fd):
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _read_line(fd):
    """Bytes from ``fd`` up to the first newline or EOF: a child's exit code arrives on its own line
    before its address space is torn down (~10 ms on a converted model), so the zygote reports it
    without waiting for the pipe to close."""
    chunks = []
    while True:
        chunk = os.read(fd, 64)
        if not chunk:
            break
        chunks.append(chunk)
        if b"\n" in chunk:
            break
    return b"".join(chunks)


def _prefork():
    """Fork the next child now, off the critical path: it starts its own session and waits for
    its request (one JSON object; EOF without one means the zygote is gone: exit quietly)."""
    req_r, req_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(req_w)
        os.close(done_r)
        os.setsid()
        data = _read_all(req_r)
        started = _cpu_seconds()  # the conversion's CPU time starts with its request, not with the fork
        os.close(req_r)
        if not data.strip():
            os._exit(0)
        _child(json.loads(data), done_w, started)
    os.close(req_r)
    os.close(done_w)
    return pid, req_w, done_r


def _dispatch(child, req):
    """Hand ``req`` to the pre-forked ``child``; report its pid, then its exit code or signal."""
    pid, req_w, done_r = child
    os.write(req_w, json.dumps(req).encode())
    os.close(req_w)
    _send({"pid": pid})
    said = _read_line(done_r).decode(errors="replace").split()  # code and CPU seconds, or EOF: killed
    os.close(done_r)
    if said and said[0].isdigit():
        reply = {"pid": pid, "code": int(said[0])}
        try:
            reply["cpu_s"] = float(said[1])
        except (IndexError, ValueError):
            pass
        _send(reply)
        os.waitpid(pid, 0)
        return
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        _send({"pid": pid, "signal": os.WTERMSIG(status)})
    else:
        _send({"pid": pid, "code": os.WEXITSTATUS(status)})


_OUT = None  # where protocol lines go: this script's stdout, or the pipe a forked zygote was given


def _send(obj):
    out = _OUT if _OUT is not None else sys.__stdout__
    out.write(json.dumps(obj) + "\n")
    out.flush()


def _drop_editable_finders():
    """Remove setuptools' editable-install finders: they would fill modules missing from the pass
    root's ``amp_pass`` with this checkout's, so a revision would not be converted by itself alone."""
    sys.meta_path[:] = [f for f in sys.meta_path
                        if not (getattr(f, "__module__", "") or "").startswith("__editable__")]


def _serve(lines):
    """Import the pass on ``sys.path`` once, say ready, then fork one child per request line."""
    try:
        import amp_pass  # noqa: F401 - the point: import once, fork many times
        try:
            import amp_pass.cli  # noqa: F401 - the real pass's heavy imports live here
        except ImportError:
            pass
    except BaseException as exc:  # noqa: BLE001
        _send({"ready": False, "error": f"{type(exc).__name__}: {exc}"})
        return 1
    gc.collect()
    gc.freeze()  # children inherit the imported pass without the collector touching (copying) its pages
    child = _prefork()
    _send({"ready": True})
    for line in lines:
        if not line.strip():
            continue
        _dispatch(child, json.loads(line))
        child = _prefork()
    return 0


def become(root, in_fd, out_fd, env):
    """Turn this process (forked from a fork server that never imported ``amp_pass``) into the zygote
    of ``root``: requests on ``in_fd``, protocol lines on ``out_fd``, ``env`` as its environment.
    Any ``amp_pass`` module and editable-install finder it inherited is dropped and ``root`` goes first
    on ``sys.path``, so the pass is imported from ``root`` alone, as in a fresh interpreter."""
    global _OUT
    os.setsid()  # the worker kills the zygote's process group
    os.chdir(root)
    os.environ.clear()
    os.environ.update(env)
    sys.dont_write_bytecode = True  # as PYTHONDONTWRITEBYTECODE: the worktree keeps its fingerprint
    for name in [m for m in sys.modules if m == "amp_pass" or m.startswith("amp_pass.")]:
        del sys.modules[name]
    _drop_editable_finders()
    sys.path.insert(0, root)
    import importlib

    importlib.invalidate_caches()
    _OUT = os.fdopen(out_fd, "w", buffering=1)
    with os.fdopen(in_fd, "r") as lines:
        return _serve(lines)


def main():
    root = sys.argv[1]
    sys.path[0] = root  # replaces this script's directory: nothing of workers/ is importable here
    _drop_editable_finders()
    return _serve(sys.stdin)


if __name__ == "__main__":
    sys.exit(main())
