"""Warm conversion: one long-lived zygote per pass root, pre-forking a sandboxed supervisor per conversion.

Starting ``python -m amp_pass`` costs seconds of imports per job.  A worker that called
:func:`start_forkserver` (the Celery worker children do, at start) has a fork server -- the sandbox *template*:
a *fresh interpreter* with the pass's allow-listed environment that imports numpy, onnx and onnx_ir (never
``amp_pass``) and forks zygotes; a local pool's worker is handed a connection to its pool's shared template
instead (:func:`use_template`, :mod:`workers.sandbox.template`); without either, a zygote is a fresh interpreter running
``workers/sandbox/_zygote.py``.  A zygote is trusted code: it never imports the pass.  It pre-forks, ahead of each
request, the conversion's supervisor, which makes the sandbox (:mod:`workers.sandbox._sandbox`: namespaces, read-only
mounts, dropped privileges, limits) and starts the pass process that imports the revision's ``amp_pass``
(tens of ms) -- so each conversion is a new sandboxed process, and no process of the pass outlives it.
A zygote is restarted when the pass's sources change (mtime/size fingerprint of the ``amp_pass`` tree) or
when it died; if it cannot start, :class:`ZygoteUnavailable` is raised and the caller starts a one-shot
zygote as a fresh interpreter (the cold path).
"""

from __future__ import annotations

import atexit
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
    wall_s: float | None = None      # timed by the sandbox's supervisor: request to the pass's exit
    sandbox_error: str | None = None  # the sandbox could not be made for this conversion
    oversized: list[str] | None = None  # outputs over the size cap, not copied out


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
    """This process's way to a template (``_zygote.py --forkserver``, a fresh interpreter) that forks zygotes on
    request: its own (``owned``: :func:`start_forkserver`, killed by :func:`stop_forkserver`) or a connection to
    one shared with other workers (:func:`use_template`: never killed from here); it shares nothing with the
    worker but the socket."""

    def __init__(self, proc: subprocess.Popen[bytes] | None, sock: socket.socket, pid: int = -1) -> None:
        self.proc, self.sock, self.lock = proc, sock, threading.Lock()
        self.pid = proc.pid if proc is not None else pid
        self.ready = False

    def fork_zygote(self, spec: dict) -> tuple[int, int, int]:
        """(pid, fd to write requests, fd to read protocol lines) of a new zygote with sandbox ``spec``."""
        req_r, req_w = os.pipe()
        out_r, out_w = os.pipe()
        try:
            with self.lock:
                if not self.ready:  # its first message says the preload is done
                    self.sock.settimeout(_START_TIMEOUT)
                    hello = self.sock.recv(256)
                    self.sock.settimeout(None)
                    if not hello:
                        raise OSError("it exited while preloading")
                    self.ready = True
                socket.send_fds(self.sock, [json.dumps({"spec": spec}).encode()], [req_r, out_w])
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


def spawn_template(preload: tuple[str, ...]) -> tuple[subprocess.Popen[bytes], socket.socket] | None:
    """A fresh template interpreter (``_zygote.py --forkserver``) with the pass's allow-listed environment and
    ``/`` as its directory, preloading ``preload`` in the background; (process, control socket), or None."""
    if not hasattr(socket, "send_fds"):
        return None
    from workers.sandbox.policy import pass_env

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        proc = subprocess.Popen([sys.executable, "-I", str(_SCRIPT), "--forkserver", str(theirs.fileno()),
                                 *preload], pass_fds=[theirs.fileno()], env=pass_env(), cwd="/",
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
    except OSError:
        ours.close()
        return None
    finally:
        theirs.close()
    return proc, ours


def start_forkserver(preload: tuple[str, ...] = PRELOAD) -> bool:
    """Start this process's zygote fork server: a fresh interpreter with the pass's environment (never a
    fork of this process: nothing of its memory, settings or credentials is in it) that imports ``preload``
    in the background and then forks zygotes.  Returns at once; False where it cannot start.  A process that
    was handed a shared template (:func:`use_template`) keeps that one."""
    global _FORKSERVER
    if _FORKSERVER is not None:
        return True
    started = spawn_template(preload)
    if started is None:
        return False
    _FORKSERVER = _ForkServer(*started)
    return True


def use_template(sock: socket.socket) -> None:
    """Fork this process's zygotes from a template shared with other workers (``sock``: a connection from
    :meth:`Template.connect`, made by the process that owns the template) instead of starting one's own."""
    global _FORKSERVER
    stop_forkserver()
    _FORKSERVER = _ForkServer(None, sock)


def stop_forkserver() -> None:
    """Stop this process's zygote fork server (:func:`start_forkserver`), if any, by its pid: killed and
    reaped (a shared template's connection is only closed: its owner stops it).  The zygotes it forked are
    :func:`shutdown`'s to stop.  Zygotes started after this are fresh interpreters unless
    :func:`start_forkserver` is called again."""
    global _FORKSERVER
    server, _FORKSERVER = _FORKSERVER, None
    if server is None:
        return
    server.sock.close()
    if server.proc is None:
        return
    try:
        os.kill(server.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    server.proc.wait()


class Zygote:
    """One running zygote process for one pass root and sandbox spec (forked from this process's fork server
    when it has one, else a fresh interpreter)."""

    def __init__(self, root: Path, spec: dict, forked: bool = True) -> None:
        self.root = root
        self.fingerprint = source_fingerprint(root)
        self.proc: subprocess.Popen[str] | None = None
        global _FORKSERVER
        server = _FORKSERVER if forked else None
        if server is not None:
            try:
                self.pid, req_w, out_r = server.fork_zygote(spec)
            except ZygoteUnavailable:  # the fork server died: fresh interpreters from now on
                _FORKSERVER = server = None
        if server is not None:
            self._stdin = os.fdopen(req_w, "w", buffering=1)
            self._stdout = os.fdopen(out_r, "r")
        else:
            from workers.sandbox.policy import pass_env

            try:
                self.proc = subprocess.Popen([sys.executable, "-I", str(_SCRIPT)], cwd="/", env=pass_env(),
                                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                             stderr=subprocess.DEVNULL, text=True, bufsize=1,
                                             start_new_session=True)
            except OSError as exc:
                raise ZygoteUnavailable(f"cannot start a conversion zygote: {exc}") from None
            assert self.proc.stdin is not None and self.proc.stdout is not None
            self.pid, self._stdin, self._stdout = self.proc.pid, self.proc.stdin, self.proc.stdout
            self._stdin.write(json.dumps(spec) + "\n")
            self._stdin.flush()
        self.forked = server is not None
        self._ended = threading.Event()
        self._lines: queue.Queue[dict | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        try:
            hello = self._next(_START_TIMEOUT)
        except queue.Empty:
            hello = None
        if not hello or not hello.get("ready"):
            self.close()
            raise ZygoteUnavailable(f"conversion zygote for {root} did not start: it exited or did not answer")

    def _read(self) -> None:
        try:
            for line in self._stdout:
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                if isinstance(msg, dict):
                    self._lines.put(msg)
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

    def run(self, request: dict, timeout: float) -> ChildExit:
        """Run one conversion (``request``: see ``_zygote.py``); kill its supervisor's process group after
        ``timeout`` seconds (the sandboxed pass dies with it: its parent-death signal and PID namespace)."""
        try:
            self._stdin.write(json.dumps(request) + "\n")
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
        return ChildExit(code=_int(done.get("code")), signal=_int(done.get("signal")), timed_out=timed_out,
                         cpu_s=_seconds(done.get("cpu_s")), wall_s=_seconds(done.get("wall_s")),
                         sandbox_error=str(done["sandbox_error"])[:500] if done.get("sandbox_error") else None,
                         oversized=[str(n)[:200] for n in done.get("oversized", []) if isinstance(n, str)][:8])

    def end(self, session: str) -> None:
        """End sandbox session ``session`` (the conversions of one job): the zygote's supervisor for it kills its
        sandbox, and with it every process of the pass, at once (the zygote answers when it has told it to, waited
        for here, 30 s at most; a zygote that does not answer is closed).  A dead zygote has nothing to end."""
        try:
            self._stdin.write(json.dumps({"end": session}) + "\n")
            self._stdin.flush()
            said = self._next(30.0)
        except (BrokenPipeError, OSError, ValueError, queue.Empty):
            said = None
        if not said or said.get("ended") != session:  # out of step, or stuck: never trust this zygote again
            self.close()

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


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _seconds(value: object) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < 1e7:
        return float(value)
    return None


_ZYGOTES: OrderedDict[tuple[Path, str], Zygote] = OrderedDict()
_LOCK = threading.Lock()


def zygote_for(root: Path, spec: dict) -> Zygote:
    """The live zygote for ``root`` and sandbox ``spec`` with up-to-date sources, started (or restarted)
    if needed."""
    root = root.resolve()
    key = (root, json.dumps(spec, sort_keys=True))
    with _LOCK:
        z = _ZYGOTES.get(key)
        if z is not None and (not z.alive() or z.fingerprint != source_fingerprint(root)):
            z.close()
            z = None
        if z is None:
            z = Zygote(root, spec)
            _ZYGOTES[key] = z
        _ZYGOTES.move_to_end(key)
        while len(_ZYGOTES) > MAX_ZYGOTES:
            _, old = _ZYGOTES.popitem(last=False)
            old.close()
        return z


def zygote_of(root: Path) -> Zygote | None:
    """The most recently used live-or-not zygote of ``root`` (any sandbox spec), or None."""
    root = Path(root).resolve()
    with _LOCK:
        found = [z for (r, _), z in _ZYGOTES.items() if r == root]
    return found[-1] if found else None


def shutdown() -> None:
    """Stop every zygote of this process (and remove the cgroups their killed supervisors leave)."""
    with _LOCK:
        for z in _ZYGOTES.values():
            z.close()
        _ZYGOTES.clear()
    from workers.sandbox.policy import loader

    loader().sweep_session_cgroups()


atexit.register(shutdown)
