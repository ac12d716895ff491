"""Warm conversion: one long-lived zygote per pass root, forking an isolated child per conversion.

Starting ``python -m amp_pass`` costs seconds of imports per job; a zygote (``workers/_zygote.py``)
pays them once per worker process and pass version.  Isolation is unchanged: each conversion
runs in a forked child with its own session, ``RLIMIT_AS``, and stdout/stderr files, and is killed
(process group) on timeout.  A zygote is restarted when the pass's sources change (mtime/size
fingerprint of the ``amp_pass`` tree), when it died, or when the interpreter differs; if it cannot
start, :func:`run_warm` raises :class:`ZygoteUnavailable` and the caller falls back to a cold
subprocess (which then reports the pass's import error as a job status).
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import signal
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
    """How a conversion child ended: exit ``code`` or killing ``signal``, and whether it timed out."""

    code: int | None
    signal: int | None
    timed_out: bool


def source_fingerprint(root: Path) -> tuple[tuple[str, int, int], ...]:
    """(path, mtime_ns, size) of every file under ``root/amp_pass`` except caches: changes on any edit."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root / "amp_pass"):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            st = os.stat(os.path.join(dirpath, name))
            out.append((os.path.join(dirpath, name), st.st_mtime_ns, st.st_size))
    return tuple(out)


class Zygote:
    """One running zygote process for one pass root."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.root = root
        self.fingerprint = source_fingerprint(root)
        self.proc = subprocess.Popen([sys.executable, str(_SCRIPT), str(root)], cwd=root, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, bufsize=1, start_new_session=True)
        self._lines: queue.Queue[dict | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        hello = self._next(_START_TIMEOUT)
        if not hello or not hello.get("ready"):
            self.close()
            why = hello.get("error") if hello else "it exited or did not answer"
            raise ZygoteUnavailable(f"conversion zygote for {root} did not start: {why}")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self._lines.put(json.loads(line))
            except ValueError:
                continue
        self._lines.put(None)

    def _next(self, timeout: float | None) -> dict | None:
        return self._lines.get(timeout=timeout)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def run(self, argv: list[str], stdout: Path, stderr: Path, memory: int, timeout: float) -> ChildExit:
        """Run one conversion child; kill its process group after ``timeout`` seconds."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps({"argv": argv, "stdout": str(stdout), "stderr": str(stderr),
                                              "memory": memory}) + "\n")
            self.proc.stdin.flush()
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
        return ChildExit(code=done.get("code"), signal=done.get("signal"), timed_out=timed_out)

    def close(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()


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
