"""One sandbox template shared by the workers of one process (the local pool's), not one per worker.

The template is ``workers/sandbox/_zygote.py --forkserver``: a fresh interpreter started with the pass's allow-listed
environment and ``/`` as its directory -- never a fork of the process that starts it, so nothing of that
process's memory, settings or credentials is in it -- that imports the pass's heavy dependencies (numpy, onnx,
onnx_ir; never ``amp_pass``) once and forks a zygote per request.  A process that starts workers (the local
pool's parent) starts one :class:`Template` and hands each worker a connection of its own
(:meth:`Template.connect`, given to :func:`workers.sandbox.zygotes.use_template` in the worker): the dependencies are
imported once per pool instead of once per worker (1-1.5 s of CPU each on the 2-core machine).  What a job's
sandbox is does not change: each zygote is forked from the same clean template, keeps none of its sockets
(no other worker's connection), and makes each session's sandbox as :mod:`workers.sandbox._sandbox` does.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading

from workers.sandbox.zygotes import PRELOAD, spawn_template


class Template:
    """A template owned by this process and shared by the workers it starts (the local pool's): one preload
    of the pass's dependencies for all of them instead of one each.  It is a fresh interpreter with the
    allow-listed environment (:func:`spawn_template`), never a fork of this process, and it never imports the
    pass; each worker gets a connection of its own (:meth:`connect`) and forks its zygotes through it."""

    def __init__(self, proc: subprocess.Popen[bytes], control: socket.socket) -> None:
        self.proc, self.control, self.lock = proc, control, threading.Lock()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def connect(self) -> socket.socket | None:
        """A new connection to the template for one worker (its end to hand over), or None if it is gone."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            with self.lock:
                socket.send_fds(self.control, [b'{"connect": true}'], [theirs.fileno()])
        except OSError:
            ours.close()
            return None
        finally:
            theirs.close()
        return ours

    def _ask(self, msg: bytes, fds: list[int] | None = None) -> dict[str, object]:
        """Send ``msg`` (with ``fds``) on the control socket and return the answer (its "preload done" message
        skipped, waited for first while it preloads: 120 s at most); {} when it is gone."""
        with self.lock:
            self.control.settimeout(120.0)
            try:
                socket.send_fds(self.control, [msg], fds or [])
                while True:
                    got = json.loads(self.control.recv(1 << 20) or b"{}")
                    if "ready" not in got:
                        return got if isinstance(got, dict) else {}
            except (OSError, ValueError):
                return {}
            finally:
                self.control.settimeout(None)

    def modules(self) -> list[str]:
        """The top-level modules the template has imported (numpy, onnx, onnx_ir, ...; never ``amp_pass``):
        asked of it once its preload is done (waits for it)."""
        got = self._ask(b'{"status": true}').get("modules")
        return [str(m) for m in got] if isinstance(got, list) else []

    def fork_job_server(self, listener_fd: int, alive_r: int) -> int | None:
        """Have the template fork a multiprocessing fork server on ``listener_fd`` and ``alive_r`` (see
        ``_zygote._fork_job_server``): the pid of that server, or None."""
        pid = self._ask(b'{"job_server": true}', [listener_fd, alive_r]).get("pid")
        return pid if isinstance(pid, int) and pid > 0 else None

    def stop(self) -> None:
        """Kill the template by its pid and reap it (the zygotes it forked are their workers' to stop)."""
        self.control.close()
        try:
            os.kill(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


def start_template(preload: tuple[str, ...] = PRELOAD) -> Template | None:
    """Start a shared :class:`Template` (returns at once: it preloads in the background); None where none can
    start (each worker then starts its own, :func:`start_forkserver`)."""
    started = spawn_template(preload)
    return Template(*started) if started is not None else None
