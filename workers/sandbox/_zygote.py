"""Conversion zygote: pre-forks one sandboxed supervisor per conversion; never imports the pass itself.

Run as a *script* with ``python -I`` (``python -I workers/sandbox/_zygote.py``: no ``PYTHON*`` variable, no user site, no
script directory on ``sys.path``), so that nothing of a pass root can shadow the zygote's own code; it imports
nothing from ``workers`` and loads ``_sandbox.py`` (beside it) by file path.  Protocol, one JSON object per line:

- worker -> zygote first: the sandbox spec (:func:`workers.sandbox.policy.spec_for`); a forked zygote gets it in
  :func:`become` instead;
- zygote -> worker at start: ``{"ready": true}``;
- worker -> zygote: ``{"module", "argv", "inputs", "outputs", "stdout", "stderr"}`` (host paths);
- worker -> zygote: ``{"end": SESSION}`` when a job's conversions are done; zygote -> worker ``{"ended": SESSION}``
  once that session's sandbox is gone;
- zygote -> worker: ``{"pid": SUPERVISOR}`` at once, then ``{"pid", "code", "cpu_s", "wall_s"}`` or
  ``{"pid", "signal", "wall_s"}`` (or ``{"pid", "sandbox_error"}``) when the conversion ended; ``wall_s`` and
  ``cpu_s`` are the supervisor's clock and the kernel's accounting of the sandbox's processes, never a figure the
  pass wrote (:mod:`workers.sandbox._sandbox`).

Each conversion's supervisor is forked ahead of its request (:func:`workers.sandbox._sandbox.supervise`): it makes the
namespaces and mounts and starts the sandboxed pass process, which imports the pass, all before the request
arrives, so neither the sandbox nor the import is on a job's critical path.

``--forkserver FD``: instead of being a zygote, preload the pass's heavy dependencies (numpy, onnx, onnx_ir --
never ``amp_pass``) and fork a zygote per request received on the socket ``FD`` (see
:mod:`workers.sandbox.zygotes`).  The fork server is a fresh interpreter with the pass's environment, never a fork of
the worker, so nothing of the worker's memory or environment (its settings, its credentials) is in it.  It is
the *template* of every sandbox: several workers may share one (:class:`workers.sandbox.zygotes.Template`): a
``{"connect": true}`` message on ``FD`` with one descriptor adds that socket as one more client, which gets
``{"ready": true}`` and then asks for zygotes as ``FD`` does; ``{"status": true}`` on ``FD`` answers the top-level
modules it has imported (``{"modules": [...]}``: never ``amp_pass``); ``{"job_server": true}`` with two
descriptors forks the owner's multiprocessing fork server (:func:`_fork_job_server`).  A forked zygote keeps none of the server's
sockets (no other worker's connection); the server exits when ``FD`` closes (its owner is gone).
"""

import gc
import importlib.util
import json
import os
import selectors
import signal
import socket
import sys

_SANDBOX = None
_OUT = None  # where protocol lines go: this script's stdout, or the pipe a forked zygote was given


def _sandbox():
    global _SANDBOX
    if _SANDBOX is None:
        spec = importlib.util.spec_from_file_location(
            "_ampci_sandbox", os.path.join(os.path.dirname(os.path.abspath(__file__)), "_sandbox.py"))
        _SANDBOX = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(_SANDBOX)
    return _SANDBOX


def _send(obj):
    out = _OUT if _OUT is not None else sys.__stdout__
    out.write(json.dumps(obj) + "\n")
    out.flush()


def _prefork(spec):
    """Fork the next conversion's supervisor now, off the critical path."""
    req_r, req_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(req_w)
        os.close(done_r)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        _sandbox().supervise(spec, req_r, done_w)
    os.close(req_r)
    os.close(done_w)
    return pid, req_w, done_r


def _read_line(fd):
    chunks = []
    while True:
        chunk = os.read(fd, 1)
        if not chunk:
            break
        chunks.append(chunk)
        if chunk == b"\n":
            break
    return b"".join(chunks)


class _Sessions:
    """The zygote's supervisors: the one serving the current session (the conversions of one job) and the next
    one, pre-forked when a session ends (between jobs, off any job's critical path)."""

    def __init__(self, spec):
        self.spec, self.current, self.session, self.ready = spec, None, None, _prefork(spec)
        self.ending = []

    def end(self):
        """End the current session (its supervisor kills the sandbox, and with it every process of the pass);
        pre-fork the next supervisor."""
        if self.current is not None:
            pid, req_w, done_r = self.current
            self.current = self.session = None
            for fd in (req_w, done_r):
                try:
                    os.close(fd)
                except OSError:
                    pass
            self.ending.append(pid)  # it kills its sandbox now; reaped without waiting (:meth:`reap`)
        if self.ready is None:
            self.ready = _prefork(self.spec)

    def reap(self, wait=False):
        """Reap the supervisors of ended sessions that have exited (all of them with ``wait``)."""
        for pid in list(self.ending):
            try:
                done, _ = os.waitpid(pid, 0 if wait else os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                self.ending.remove(pid)

    def dispatch(self, req):
        """Hand ``req`` to the supervisor of its session; report its pid, then how the conversion ended.  A
        request without a session is a session of its own."""
        session = req.get("session")
        self.reap()
        if self.current is not None and (session is None or session != self.session):
            self.end()
        if self.current is None:
            self.current, self.session = self.ready or _prefork(self.spec), session
            self.ready = None
        pid, req_w, done_r = self.current
        try:
            os.write(req_w, (json.dumps(req) + "\n").encode())
        except OSError:
            pass
        _send({"pid": pid})
        line = _read_line(done_r).decode(errors="replace").strip()
        try:
            said = json.loads(line) if line else {}
        except ValueError:
            said = {}
        if not isinstance(said, dict) or not said:  # the supervisor is gone (killed on timeout)
            said = {"signal": signal.SIGKILL}
            self.end()
        elif session is None or "sandbox_error" in said:
            self.end()
        said["pid"] = pid
        _send(said)


def _serve(spec, lines):
    gc.collect()
    gc.freeze()
    sessions = _Sessions(spec)
    _send({"ready": True})
    for line in lines:
        if not line.strip():
            continue
        msg = json.loads(line)
        if "end" in msg:  # the job is done with its conversions: nothing of its pass stays
            if msg["end"] == sessions.session:
                sessions.end()
            _send({"ended": msg["end"]})
            continue
        sessions.dispatch(msg)
    sessions.end()
    os.close(sessions.ready[1])  # EOF: the waiting supervisor exits quietly
    sessions.reap(wait=True)
    return 0


def become(spec, in_fd, out_fd):
    """Turn this process (forked from the fork server) into a zygote: requests on ``in_fd``, protocol lines on
    ``out_fd``."""
    global _OUT
    os.setsid()  # the worker kills the zygote's process group
    os.chdir("/")
    _OUT = os.fdopen(out_fd, "w", buffering=1)
    with os.fdopen(in_fd, "r") as lines:
        return _serve(spec, lines)


#: The pass's heavy dependencies, imported once by a zygote or fork server (never ``amp_pass``).
PRELOAD = ("numpy", "onnx", "onnx_ir")


def _preload(names):
    import importlib

    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:
            pass


def _forkserver(fd, preload):
    """Preload ``preload``, then fork one zygote per request (spec, two fds) on socket ``fd`` or on a client
    socket it was given (``{"connect": true}``, one fd); EOF on ``fd`` ends it, EOF on a client drops that client."""
    _preload(preload)
    control = socket.socket(fileno=fd)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # zygotes are reaped by the kernel
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C is the worker's to handle
    _sandbox()
    gc.collect()
    gc.freeze()
    control.send(b'{"ready": true}')
    sel = selectors.DefaultSelector()
    sel.register(control, selectors.EVENT_READ)
    while True:
        for key, _ in sel.select():
            _serve_one(sel, key.fileobj, control)


def _serve_one(sel, sock, control):
    """One message on ``sock``: a zygote to fork, a client to add, or EOF."""
    try:
        msg, fds, _, _ = socket.recv_fds(sock, 1 << 20, 2)
    except OSError:
        msg, fds = b"", []
    if not msg:
        for f in fds:
            os.close(f)
        if sock is control:
            os._exit(0)
        sel.unregister(sock)
        sock.close()
        return
    req = json.loads(msg)
    if req.get("connect") and sock is control and len(fds) == 1:
        client = socket.socket(fileno=fds[0])
        sel.register(client, selectors.EVENT_READ)
        try:
            client.send(b'{"ready": true}')
        except OSError:
            pass
        return
    if req.get("status") and sock is control and not fds:  # its owner asks what it has imported
        sock.send(json.dumps({"modules": sorted({m.split(".")[0] for m in sys.modules})}).encode())
        return
    if req.get("job_server") and sock is control and len(fds) == 2:
        _fork_job_server(sel, sock, fds)
        return
    if len(fds) != 2 or "spec" not in req:
        for f in fds:
            os.close(f)
        return
    _fork_child(sel, sock, fds, signal.SIG_DFL, lambda: become(req["spec"], fds[0], fds[1]) or 0)


def _fork_job_server(sel, sock, fds):
    """Fork the owner's multiprocessing fork server (``fds``: its listening socket and "alive" pipe): the job
    workers of the owner's pool are then forked from this clean, preloaded heap too, and the dependencies are
    imported once for the jobs and the sandboxes alike.  Nothing flows back: the workers' requests, settings
    and environment go from the owner to each worker, never through this process."""

    def serve():
        from multiprocessing import forkserver

        forkserver.main(fds[0], fds[1], [])
        return 0

    # (the workers it forks get SIGINT's default handler back)
    _fork_child(sel, sock, fds, signal.default_int_handler, serve)


def _fork_child(sel, sock, fds, sigint, body):
    """Fork a child that closes every socket of the server (no child holds the server's or another worker's
    connection), restores ``SIGCHLD`` and sets ``sigint``, then exits with ``body()``'s code (1 if it raises);
    the server closes ``fds`` (the child's now) and answers ``{"pid": CHILD}`` on ``sock``."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            for k in list(sel.get_map().values()):
                k.fileobj.close()
            sel.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.signal(signal.SIGINT, sigint)
            code = body()
        finally:
            os._exit(code)
    for f in fds:
        os.close(f)
    try:
        sock.send(json.dumps({"pid": pid}).encode())
    except OSError:
        pass


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "--forkserver":
        _forkserver(int(sys.argv[2]), [m for m in sys.argv[3:] if m])
        return 0
    spec = json.loads(sys.stdin.readline())
    _preload(PRELOAD)
    return _serve(spec, sys.stdin)


if __name__ == "__main__":
    sys.exit(main())
