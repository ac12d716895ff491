"""The local pool's sandbox template (:mod:`workers.sandbox.template`), and its job workers forked from it too.

A pool process starts one template: a fresh interpreter with the pass's allow-listed environment that imports
the pass's heavy dependencies (numpy, onnx, onnx_ir) once and never the pass.  Each worker gets a connection
of its own to it (:func:`template_connection`) and forks its sandboxes' zygotes through it.  multiprocessing's
fork server, from which the workers themselves are forked, is forked from the template as well
(:func:`use_template_for_workers`) instead of being a second fresh interpreter importing the same modules:
one import of numpy, onnx and onnx_ir per pool instead of two (four with the canary, before issue 42).

What this shares is the template's clean heap, downward only: the workers get their environment, settings and
requests from this process (through multiprocessing's pipe to each worker, never through the template), and
no sandbox is ever forked from a worker.  The template's own children -- zygotes and the job server -- keep
none of its sockets.  Where the template cannot start or fork, multiprocessing starts its fork server itself
as before.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from multiprocessing.forkserver import ForkServer

    from workers.sandbox.template import Template

#: The sandbox template this process's workers share (guarded by pool_slots.SERVER_LOCK).
_TEMPLATE: list[Template] = []
_HOOKED: list[bool] = []


def shared_template() -> Template | None:
    """This process's template (started on first use, again if it died); None where none can start."""
    from workers.sandbox.template import start_template

    if _TEMPLATE and not _TEMPLATE[0].alive():
        _TEMPLATE.pop().stop()
    if not _TEMPLATE:
        started = start_template()
        if started is None:
            return None
        _TEMPLATE.append(started)
    return _TEMPLATE[0]


def template_connection() -> socket.socket | None:
    """A connection to this process's template for one new worker (its end to hand over), or None (the worker
    then starts a fork server of its own)."""
    template = shared_template()
    return template.connect() if template is not None else None


def stop_template() -> None:
    """Stop this process's template, if any (by pid; the zygotes it forked are their workers' to stop)."""
    while _TEMPLATE:
        _TEMPLATE.pop().stop()


def use_template_for_workers() -> None:
    """Make multiprocessing's fork server of this process a child of the template (once per process): its
    ``ensure_running`` asks the template to fork one on a listening socket made here, and starts its own only
    where the template cannot."""
    if _HOOKED:
        return
    from multiprocessing import forkserver

    server = forkserver._forkserver
    if not hasattr(server, "_forkserver_pid"):  # (another Python's multiprocessing: leave it as it is)
        return
    plain = type(server).ensure_running
    _HOOKED.append(True)

    def ensure_running() -> None:
        if not _ensure_from_template(server):
            plain(server)

    server.ensure_running = ensure_running  # type: ignore[method-assign]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _ensure_from_template(server: ForkServer) -> bool:
    """multiprocessing's ``ForkServer.ensure_running`` for a server forked by the template: True when one runs
    (it was, or the template forked one now); False to let multiprocessing start its own."""
    from multiprocessing import connection, resource_tracker, util

    with server._lock:  # type: ignore[attr-defined]
        resource_tracker.ensure_running()
        pid = server._forkserver_pid  # type: ignore[attr-defined]
        if pid is not None:
            if getattr(server, "_ampci_template_child", False):
                if _alive(pid):
                    return True
                _forget(server)
            else:  # multiprocessing's own: its way of checking (waitpid on its child)
                return False
        template = shared_template()
        if template is None:
            return False
        address = connection.arbitrary_address("AF_UNIX")  # type: ignore[attr-defined]
        with socket.socket(socket.AF_UNIX) as listener:
            listener.bind(address)
            if not util.is_abstract_socket_namespace(address):
                os.chmod(address, 0o600)
            listener.listen()
            alive_r, alive_w = os.pipe()
            try:
                pid = template.fork_job_server(listener.fileno(), alive_r)
            finally:
                os.close(alive_r)
        if pid is None:
            os.close(alive_w)
            if not util.is_abstract_socket_namespace(address):
                os.unlink(address)
            return False
        server._forkserver_address = address  # type: ignore[attr-defined]
        server._forkserver_alive_fd = alive_w  # type: ignore[attr-defined]
        server._forkserver_pid = pid  # type: ignore[attr-defined]
        server._ampci_template_child = True  # type: ignore[attr-defined]
        return True


def _forget(server: ForkServer) -> None:
    """Drop multiprocessing's record of a server the template forked (it is gone or killed): its "alive" pipe
    closed, its socket file removed."""
    from multiprocessing import util

    address = server._forkserver_address  # type: ignore[attr-defined]
    if server._forkserver_alive_fd is not None:  # type: ignore[attr-defined]
        os.close(server._forkserver_alive_fd)  # type: ignore[attr-defined]
    if address and not util.is_abstract_socket_namespace(address):
        try:
            os.unlink(address)
        except OSError:
            pass
    server._forkserver_address = server._forkserver_alive_fd = server._forkserver_pid = None  # type: ignore[attr-defined]
    server._ampci_template_child = False  # type: ignore[attr-defined]


def stop_job_server(server: ForkServer) -> bool:
    """Kill a fork server the template forked, by pid, wait (2 s at most) until it is gone, and forget it
    (True); False when multiprocessing's server is its own (the caller stops it as multiprocessing does)."""
    if not getattr(server, "_ampci_template_child", False):
        return False
    pid = server._forkserver_pid  # type: ignore[attr-defined]
    if pid is not None:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 2.0  # gone once the kernel reaped it (the template ignores SIGCHLD)
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.002)
    _forget(server)
    return True
