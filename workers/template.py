"""One sandbox template shared by the workers of one process (the local pool's), not one per worker.

The template is ``workers/_zygote.py --forkserver``: a fresh interpreter started with the pass's allow-listed
environment and ``/`` as its directory -- never a fork of the process that starts it, so nothing of that
process's memory, settings or credentials is in it -- that imports the pass's heavy dependencies (numpy, onnx,
onnx_ir; never ``amp_pass``) once and forks a zygote per request.  A process that starts workers (the local
pool's parent) starts one :class:`Template` and hands each worker a connection of its own
(:meth:`Template.connect`, given to :func:`workers.zygotes.use_template` in the worker): the dependencies are
imported once per pool instead of once per worker (1-1.5 s of CPU each on the 2-core machine).  What a job's
sandbox is does not change: each zygote is forked from the same clean template, keeps none of its sockets
(no other worker's connection), and makes each session's sandbox as :mod:`workers._sandbox` does.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading

from workers.zygotes import PRELOAD, spawn_template


class Template:
    """A template owned by this process and shared by the workers it starts (the local pool's): one preload
    of the pass's dependencies for all of them instead of one each.  It is a fresh interpreter with the
    allow-listed environment (:func:`spawn_template`), never a fork of this process, and it never imports the
    pass; each worker gets a connection of its own (:meth:`connect`) and forks its zygotes through it."""

    def __init__(self, proc: subprocess.Popen[bytes], control: socket.socket) -> None:
        self.proc, self.control, self.lock = proc, control, threading.Lock()
        self.ready = False

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

    def modules(self) -> list[str]:
        """The top-level modules the template has imported (numpy, onnx, onnx_ir, ...; never ``amp_pass``):
        asked of it once its preload is done (waits for it)."""
        with self.lock:
            self.control.settimeout(120.0)
            try:
                if not self.ready:  # its first message: the preload is done
                    self.ready = bool(self.control.recv(256))
                self.control.send(b'{"status": true}')
                got = json.loads(self.control.recv(1 << 20) or b"{}")
            finally:
                self.control.settimeout(None)
        return [str(m) for m in got.get("modules", [])]

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
