"""Processes started by the distributed tests: a private redis-server and Celery workers, all by pid.

Every process is started in its own session and stopped by pid (its children found with psutil),
never by name.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kill_tree(pid: int, sig: int = signal.SIGKILL) -> None:
    """Send ``sig`` to ``pid`` and all its descendants (children first)."""
    try:
        parent = psutil.Process(pid)
        procs = parent.children(recursive=True) + [parent]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            p.send_signal(sig)
        except psutil.NoSuchProcess:
            pass


def stop(proc: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    """SIGTERM the process tree, wait up to ``grace`` s, then SIGKILL whatever is left."""
    if proc.poll() is None:
        try:
            children = psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            children = []
        kill_tree(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
        kill_tree(proc.pid, signal.SIGKILL)
        for c in children:
            try:
                c.kill()
            except psutil.NoSuchProcess:
                pass
        proc.wait(10)


class RedisServer:
    """A private, persistent (AOF, fsync always) redis-server on a free loopback port."""

    def __init__(self, workdir: Path) -> None:
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        log = open(self.dir / "redis.log", "ab")
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
             "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--daemonize", "no"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        import redis

        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if redis.Redis.from_url(self.url, socket_connect_timeout=0.5).ping():
                    return
            except redis.exceptions.RedisError:
                time.sleep(0.1)
        raise RuntimeError(f"redis-server on port {self.port} did not start")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                os.kill(self.proc.pid, sig)
            self.proc.wait(20)
            self.proc = None


class Worker:
    """A real Celery worker (prefork) as a subprocess, logging to ``log``."""

    def __init__(self, env: Mapping[str, str], queues: str, node: str, log: Path, concurrency: int = 1,
                 app: str = "tests.distributed.hook_app", use_cli: bool = False) -> None:
        env = {**env, "AMPCI_TEST_NODE": node, "PYTHONPATH": str(ROOT)}
        if use_cli:
            cmd = [sys.executable, "-m", "service.cli.main", "worker", "--queues", queues,
                   "--concurrency", str(concurrency), "--name", f"{node}@%h"]
        else:
            cmd = [sys.executable, "-m", "celery", "-A", app, "worker", "--pool", "prefork", "-Q", queues,
                   "-c", str(concurrency), "-n", f"{node}@%h", "--loglevel", "INFO", "--without-gossip",
                   "--without-mingle"]
        self.node = node
        self.log = log
        fh = open(log, "ab")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        fh.close()

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker {self.node} exited: {self.log.read_text()[-3000:]}")
            if b"ready." in self.log.read_bytes():
                return
            time.sleep(0.2)
        raise RuntimeError(f"worker {self.node} not ready after {timeout}s: {self.log.read_text()[-3000:]}")

    def sigkill(self) -> None:
        """Kill the whole worker (main process and pool children) at once, like a machine dying."""
        kill_tree(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        stop(self.proc)
