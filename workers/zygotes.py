"""Warm conversion: one long-lived zygote per pass root, forking an isolated child per conversion.

Starting ``python -m amp_pass`` costs seconds of imports per job; a zygote (``workers/_zygote.py``)
pays them once per worker process and pass version.  A worker that called :func:`start_forkserver`
(the local pool's worker subprocesses and the Celery worker children do, at start, while
single-threaded) does not pay them even once per pass version: its zygotes are forked from a fork
server that has numpy, onnx and onnx_ir imported (never ``amp_pass``), and each imports only the
revision's ``amp_pass`` (tens of ms instead of seconds); without one, a zygote is a fresh interpreter
running ``workers/_zygote.py``.  Isolation is unchanged: each conversion
runs in a forked child with its own session, ``RLIMIT_AS``, and stdout/stderr files, and is killed
(process group) on timeout.  A zygote is restarted when the pass's sources change (mtime/size
fingerprint of the ``amp_pass`` tree), when it died, or when the interpreter differs; if it cannot
start, :func:`run_warm` raises :class:`ZygoteUnavailable` and the caller falls back to a cold
subprocess (which then reports the pass's import error as a job status).
"""

from __future__ import annotations

import atexit
import gc
import importlib
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

_SCRIPT = Path(__file__).with_name("_zygote.py")
_START_TIMEOUT = 120.0
#: Zygotes kept per worker process (least recently used ones are stopped beyond this).
MAX_ZYGOTES = 2


class ZygoteUnavailable(Exception):
    """No zygote could be started for this pass root (the message says why)."""


@dataclass
class ChildExit:
    """How a conversion child ended: exit ``code`` or killing ``signal``, whether it timed out, and the user +
    system CPU seconds it spent on its conversion (``cpu_s``; None when it did not say: killed, or an old zygote)."""

    code: int | None
    signal: int | None
    timed_out: bool
    cpu_s: float | None = None


def source_fingerprint(root: Path) -> tuple[tuple[str, int, int], ...]:
    """(path, mtime_ns, size) of every file under ``root/amp_pass`` except caches: changes on any edit."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root / "amp_pass"):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            st = os.stat(os.path.join(dirpath, name))
            out.append((os.path.join(dirpath, name), st.st_mtime_ns, st.st_size))
    return tuple(out)


#: Modules a fork server imports before forking zygotes: the pass's heavy dependencies, never the pass.
PRELOAD = ("numpy", "onnx", "onnx_ir")


class _ForkServer:
    """A process forked from this worker (see :func:`start_forkserver`) that forks zygotes on request."""

    def __init__(self, pid: int, sock: socket.socket) -> None:
        self.pid, self.sock, self.lock = pid, sock, threading.Lock()

    def fork_zygote(self, root: Path, env: dict[str, str]) -> tuple[int, int, int]:
        """(pid, fd to write requests, fd to read protocol lines) of a new zygote for ``root``."""
        req_r, req_w = os.pipe()
        out_r, out_w = os.pipe()
        try:
            with self.lock:
                socket.send_fds(self.sock, [json.dumps({"root": str(root), "env": env}).encode()], [req_r, out_w])
                reply = self.sock.recv(256)
        except OSError as exc:
            for fd in (req_w, out_r):
                os.close(fd)
            raise ZygoteUnavailable(f"zygote fork server is gone: {exc}") from None
        finally:
            os.close(req_r)
            os.close(out_w)
        if not reply:
            os.close(req_w)
            os.close(out_r)
            raise ZygoteUnavailable("zygote fork server is gone")
        return int(json.loads(reply)["pid"]), req_w, out_r


_FORKSERVER: _ForkServer | None = None


def start_forkserver(preload: tuple[str, ...] = PRELOAD) -> bool:
    """Import ``preload`` here, then fork this process into the fork server of its zygotes.

    Call it early in a worker process, while it has one thread (before onnxruntime sessions exist);
    returns False (and zygotes stay fresh interpreters) when the process has other threads or
    ``preload`` cannot be imported.  The server closes every inherited descriptor but its socket,
    imports nothing more, and exits when this process's end of the socket closes (it dies with it).
    """
    global _FORKSERVER
    if _FORKSERVER is not None:
        return True
    if threading.active_count() > 1 or not hasattr(socket, "send_fds"):
        return False
    try:
        for name in preload:
            importlib.import_module(name)
    except ImportError:
        return False
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the fork server
        code = 0
        try:
            ours.close()
            # the preloaded heap, as inherited, moves out of the collector's sight (O(1)): each zygote's
            # collection before its own freeze then walks what importing the pass made, not numpy, onnx and
            # onnx_ir again (~0.1 s of the first conversion's path on a 2-core machine)
            gc.freeze()
            _forkserver_loop(theirs)
        except BaseException:  # noqa: BLE001 - a fork server never returns into the worker's code
            code = 1
        os._exit(code)
    theirs.close()
    _FORKSERVER = _ForkServer(pid, ours)
    return True


def stop_forkserver() -> None:
    """Stop this process's zygote fork server (:func:`start_forkserver`), if any, by its pid: killed and
    reaped.  The zygotes it forked are :func:`shutdown`'s to stop.  Zygotes started after this are fresh
    interpreters unless :func:`start_forkserver` is called again."""
    global _FORKSERVER
    server, _FORKSERVER = _FORKSERVER, None
    if server is None:
        return
    server.sock.close()
    try:
        os.kill(server.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        os.waitpid(server.pid, 0)
    except ChildProcessError:
        pass


def _forkserver_loop(sock: socket.socket) -> None:
    """Body of the fork server: one request (root, env, two fds) forks one zygote; EOF ends it."""
    from workers import _zygote

    keep = sock.fileno()
    os.closerange(3, keep)
    os.closerange(keep + 1, 1 << 16)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # zygotes are reaped by the kernel
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C is the worker's to handle
    while True:
        msg, fds, _, _ = socket.recv_fds(sock, 1 << 16, 2)
        if not msg:
            os._exit(0)
        req = json.loads(msg)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                sock.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                code = _zygote.become(req["root"], fds[0], fds[1], req["env"]) or 0
            finally:
                os._exit(code)
        for fd in fds:
            os.close(fd)
        sock.send(json.dumps({"pid": pid}).encode())


class Zygote:
    """One running zygote process for one pass root (forked from this process's fork server when it
    has one, else a fresh interpreter)."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.root = root
        self.fingerprint = source_fingerprint(root)
        self.proc: subprocess.Popen[str] | None = None
        global _FORKSERVER
        server = _FORKSERVER
        if server is not None:
            try:
                self.pid, req_w, out_r = server.fork_zygote(root, env)
            except ZygoteUnavailable:  # the fork server died: fresh interpreters from now on
                _FORKSERVER = server = None
        if server is not None:
            self._stdin = os.fdopen(req_w, "w", buffering=1)
            self._stdout = os.fdopen(out_r, "r")
        else:
            self.proc = subprocess.Popen([sys.executable, str(_SCRIPT), str(root)], cwd=root, env=env,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL, text=True, bufsize=1, start_new_session=True)
            assert self.proc.stdin is not None and self.proc.stdout is not None
            self.pid, self._stdin, self._stdout = self.proc.pid, self.proc.stdin, self.proc.stdout
        self.forked = server is not None
        self._ended = threading.Event()
        self._lines: queue.Queue[dict | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        hello = self._next(_START_TIMEOUT)
        if not hello or not hello.get("ready"):
            self.close()
            why = hello.get("error") if hello else "it exited or did not answer"
            raise ZygoteUnavailable(f"conversion zygote for {root} did not start: {why}")

    def _read(self) -> None:
        try:
            for line in self._stdout:
                try:
                    self._lines.put(json.loads(line))
                except ValueError:
                    continue
        except (OSError, ValueError):  # closed under us by close()
            pass
        self._ended.set()
        self._lines.put(None)

    def _next(self, timeout: float | None) -> dict | None:
        return self._lines.get(timeout=timeout)

    def alive(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        if self._ended.is_set():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True

    def run(self, argv: list[str], stdout: Path, stderr: Path, memory: int, timeout: float) -> ChildExit:
        """Run one conversion child; kill its process group after ``timeout`` seconds."""
        try:
            self._stdin.write(json.dumps({"argv": argv, "stdout": str(stdout), "stderr": str(stderr),
                                          "memory": memory}) + "\n")
            self._stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise ZygoteUnavailable(f"conversion zygote is gone: {exc}") from None
        try:
            started = self._next(30.0)
        except queue.Empty:
            started = None
        if not started or "pid" not in started or "code" in started or "signal" in started:
            self.close()  # out of step with the protocol: never trust this zygote again
            raise ZygoteUnavailable(f"conversion zygote did not fork a child (got {started!r})")
        pid = started["pid"]
        timed_out = False
        try:
            done = self._next(timeout)
        except queue.Empty:
            timed_out = True
            for kill in (os.killpg, os.kill):
                try:
                    kill(pid, signal.SIGKILL)
                    break
                except (ProcessLookupError, PermissionError):
                    continue
            try:
                done = self._next(30.0)
            except queue.Empty:  # the zygote is stuck too: drop it, the child was killed
                self.close()
                return ChildExit(code=None, signal=signal.SIGKILL, timed_out=True)
        if done is None or done.get("pid") != pid:
            self.close()
            raise ZygoteUnavailable(f"conversion zygote died or answered out of step: {done!r}")
        cpu = done.get("cpu_s")
        return ChildExit(code=done.get("code"), signal=done.get("signal"), timed_out=timed_out,
                         cpu_s=float(cpu) if isinstance(cpu, int | float) and not isinstance(cpu, bool) else None)

    def close(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self.proc is not None:
            self.proc.wait()
        else:  # forked: its fork server reaps it; our ends of its pipes close here
            for f in (self._stdin, self._stdout):
                try:
                    f.close()
                except OSError:
                    pass


_ZYGOTES: OrderedDict[Path, Zygote] = OrderedDict()
_LOCK = threading.Lock()


def zygote_for(root: Path, env: dict[str, str]) -> Zygote:
    """The live zygote for ``root`` with up-to-date sources, started (or restarted) if needed."""
    root = root.resolve()
    with _LOCK:
        z = _ZYGOTES.get(root)
        if z is not None and (not z.alive() or z.fingerprint != source_fingerprint(root)):
            z.close()
            z = None
        if z is None:
            z = Zygote(root, env)
            _ZYGOTES[root] = z
        _ZYGOTES.move_to_end(root)
        while len(_ZYGOTES) > MAX_ZYGOTES:
            _, old = _ZYGOTES.popitem(last=False)
            old.close()
        return z


def shutdown() -> None:
    """Stop every zygote of this process."""
    with _LOCK:
        for z in _ZYGOTES.values():
            z.close()
        _ZYGOTES.clear()


atexit.register(shutdown)
