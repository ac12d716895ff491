"""The control-plane side of ``bench/bench_fleet.py``: starting and stopping stub workers (by pid), metering
the CPU of the workers, the private redis-server and the PostgreSQL backends of the bench database, the figures
of one sweep, and the 100-worker arithmetic."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

WORKERS_ON_PAPER = 100
#: a stub cell's model name (``bench/_fleet_stub.py`` sleeps instead of running it): ``stub<milliseconds>ms_<label>``
STUB_RE = re.compile(r"^stub(\d{1,6})ms_")
BOOK_KEY = "bench:fleet:book"      # "cpu_s wall_s" of each execute_job (the stub sleep uses no CPU)
FINISH_KEY = "bench:fleet:finish"  # "cpu_s wall_s finished" of each finish_if_complete call


def stub_model(ms: int, label: str) -> str:
    """The model name of a stub cell that sleeps ``ms`` milliseconds."""
    return f"stub{ms}ms_{label}"


def stub_ms(model: str) -> int | None:
    """The milliseconds a stub model sleeps, or None for a real model."""
    m = STUB_RE.match(model)
    return int(m.group(1)) if m else None


def free_port() -> int:
    """A free TCP port on loopback."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kill_tree(pid: int) -> None:
    """SIGTERM ``pid`` (a Celery worker's warm shutdown stops its own pool), wait up to 10 s for it and its
    descendants, then SIGKILL what is left of them."""
    import signal

    try:
        procs = psutil.Process(pid).children(recursive=True) + [psutil.Process(pid)]
        procs[-1].send_signal(signal.SIGTERM)
    except psutil.NoSuchProcess:
        return
    psutil.wait_procs(procs, timeout=10)
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def fresh_pg(admin_url: str) -> tuple[str, Callable[[], None]]:
    """A new empty PostgreSQL database (its URL) and the function that drops it."""
    from service.db.admin import create_database, drop_database

    url = create_database(admin_url, "ampci_bench")
    return url, lambda: drop_database(admin_url, url)


def start_workers(n: int, env: dict[str, str], logs: Path, root: Path) -> list[subprocess.Popen[bytes]]:
    """``n`` ``celery worker -c 1`` processes on the bench-only stub app, each in its own session."""
    out = []
    for i in range(n):
        out.append(subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "bench._fleet_stub", "worker", "--pool", "prefork", "-c", "1",
             "-Q", "cpu", "-n", f"fleet{n}-{i}@%h", "--loglevel", "WARNING", "--without-gossip", "--without-mingle"],
            cwd=root, env=env, stdout=open(logs / f"worker{n}-{i}.log", "wb"), stderr=subprocess.STDOUT,
            start_new_session=True))
    return out


def stop_workers(workers: list[subprocess.Popen[bytes]]) -> None:
    """Stop every worker (its process tree, by pid) and empty the list."""
    for w in workers:
        kill_tree(w.pid)
    workers.clear()


def redis_info(r: Any) -> dict[str, int]:
    """``used_memory``, ``used_memory_peak`` and ``total_commands_processed`` of the server."""
    info = {**r.info("memory"), **r.info("stats")}
    return {k: int(info[k]) for k in ("used_memory", "used_memory_peak", "total_commands_processed")}


def pg_backend_pids(store: Any, db_name: str) -> list[int]:
    """The pids of the PostgreSQL backends connected to ``db_name``."""
    import sqlalchemy as sa

    with store.engine.connect() as conn:
        return [int(p) for p in conn.execute(sa.text("SELECT pid FROM pg_stat_activity WHERE datname = :d"),
                                             {"d": db_name}).scalars()]


def _cpu(p: psutil.Process, reaped: bool = False) -> float:
    t = p.cpu_times()
    return float(t.user + t.system + ((t.children_user + t.children_system) if reaped else 0.0))


@dataclass
class CpuTotals:
    """CPU seconds over a metered interval; ``pg_connections``: most backends seen at once."""

    workers: float
    redis: float
    pg: float
    pg_connections: int


class CpuMeter:
    """CPU seconds of worker trees (a main process's own, its reaped children's, its live children's), of the
    redis-server, and of PostgreSQL backends (sampled by :meth:`sample`: a backend that exits keeps the CPU of
    its last sample, so call it often)."""

    def __init__(self, worker_pids: list[int], redis_pid: int, backends: Callable[[], list[int]]) -> None:
        self.worker_pids, self.redis_pid, self.backends = worker_pids, redis_pid, backends
        self._pg0: dict[int, float] = {}
        self._pg: dict[int, float] = {}
        self._w0 = self._r0 = 0.0
        self.max_conns = 0

    def _workers(self) -> float:
        total = 0.0
        for pid in self.worker_pids:
            try:
                main = psutil.Process(pid)
                total += _cpu(main, reaped=True) + sum(_cpu(c) for c in main.children(recursive=True))
            except psutil.NoSuchProcess:
                pass
        return total

    def sample(self) -> None:
        pids = self.backends()
        self.max_conns = max(self.max_conns, len(pids))
        for pid in pids:
            try:
                self._pg[pid] = _cpu(psutil.Process(pid))
            except psutil.NoSuchProcess:
                pass

    def start(self) -> None:
        self.sample()
        self._pg0, self.max_conns = dict(self._pg), 0
        self._w0, self._r0 = self._workers(), _cpu(psutil.Process(self.redis_pid))

    def stop(self) -> CpuTotals:
        self.sample()
        pg = sum(cpu - self._pg0.get(pid, 0.0) for pid, cpu in self._pg.items())
        return CpuTotals(self._workers() - self._w0, _cpu(psutil.Process(self.redis_pid)) - self._r0, pg,
                         self.max_conns)


@dataclass(frozen=True)
class Gaps:
    """Between a job's finish and the next start on the same worker (job rows' ``worker`` ``name@host:pid``,
    ``finished_at``, ``started_at``): ``steady_ms`` the mean gap by the same pool child (the control plane's latency
    between two jobs), ``replacements`` the gaps across a change of pool child (Celery replaces one every
    ``worker_max_tasks_per_child`` jobs) and ``replaced_s`` their sum."""

    steady_ms: float
    replacements: int
    replaced_s: float


def worker_gaps(jobs: list[tuple[str, float, float]]) -> Gaps:
    """:class:`Gaps` of ``(worker, started, finished)`` (seconds); NaN steady gap without two jobs on a child."""
    by_host: dict[str, list[tuple[float, float, str]]] = {}
    for who, started, finished in jobs:
        host, _, pid = who.rpartition(":")
        by_host.setdefault(host or who, []).append((started, finished, pid))
    steady: list[float] = []
    replaced: list[float] = []
    for done in by_host.values():
        done.sort()
        for (_, end, pid0), (start, _, pid1) in zip(done, done[1:], strict=False):
            (steady if pid0 == pid1 else replaced).append(start - end)
    return Gaps(sum(steady) / len(steady) * 1000 if steady else float("nan"), len(replaced), sum(replaced))


@dataclass(frozen=True)
class SweepFigures:
    """One nightly sweep on ``n`` workers: times and CPU in seconds, counts."""

    n: int
    cells: int
    stub_s: float
    drain_s: float
    dispatch_wall_s: float
    dispatch_cpu_s: float
    reconcile_wall_s: float
    reconcile_cpu_s: float
    reconcile_candidates: int
    resent: int
    worker_cpu_s: float
    pg_cpu_s: float
    redis_cpu_s: float
    pg_connections: int  # most backends of the workers seen at once (this process's own left out)
    book_cpu_s: float
    booked: int
    finish_cpu_s: float
    finish_wall_s: float
    redis_commands: int
    redis_used: int
    pg_commits: int
    pg_rows_written: int
    all_done: bool
    complete: bool
    run_id: int
    revision: str
    load: float = float("nan")  # 1-minute load average at the sweep's end
    gaps: Gaps = Gaps(float("nan"), 0, 0.0)

    @property
    def overhead_ms(self) -> float:
        """Wall time per job on a worker beyond the stub's: N x drain / jobs - stub, in ms."""
        return (self.drain_s * self.n / self.cells - self.stub_s) * 1000

    @property
    def throughput(self) -> float:
        return self.cells / self.drain_s if self.drain_s > 0 else 0.0

    @property
    def efficiency_between_replacements(self) -> float:
        """Throughput against the ideal with the pool-child replacements' gaps taken out of the drain."""
        drain = self.drain_s - self.gaps.replaced_s / self.n
        return self.cells / drain / self.ideal if drain > 0 else 0.0

    @property
    def ideal(self) -> float:
        return self.n / self.stub_s

    @property
    def efficiency(self) -> float:
        return self.throughput / self.ideal

    def per_job(self, seconds: float) -> float:
        """``seconds`` spread over the sweep's jobs, in ms."""
        return seconds * 1000 / self.cells


def bottleneck_lines(sweeps: list[SweepFigures], pg: Any, stub_s: float, max_connections: int = 100,
                     reconcile_every_s: float = 60.0) -> list[str]:
    """The arithmetic of the first bottleneck at :data:`WORKERS_ON_PAPER` workers, from the largest-N sweep's
    per-job costs: each central resource's ceiling in jobs/s, the job duration at which 100 workers reach it,
    and the demand at the stub's duration."""
    s = max(sweeps, key=lambda x: x.n)
    n = WORKERS_ON_PAPER
    demand = n / stub_s
    conns_per_worker = s.pg_connections / s.n
    rows: list[tuple[str, float, str]] = []  # (resource, ceiling jobs/s, arithmetic)
    for name, cost_s, capacity, unit in [
        ("Redis (one thread)", s.redis_cpu_s / s.cells, 1.0, "1 core"),
        ("PostgreSQL CPU", s.pg_cpu_s / s.cells, 1.0, "per core"),
        ("scheduler (start_sweep: rows + messages, one process)", s.dispatch_cpu_s / s.cells, 1.0, "1 core"),
    ]:
        ceiling = capacity / cost_s if cost_s > 0 else float("inf")
        rows.append((name, ceiling, f"{unit} / {cost_s * 1000:.3f} ms per job = {ceiling:,.0f} jobs/s; "
                                    f"{n} workers reach it at jobs of {n / ceiling * 1000:,.0f} ms or shorter"))
    rows.sort(key=lambda x: x[1])
    lines = [f"demand at {n} workers x {stub_s * 1000:.0f} ms stubs: {n} / {stub_s:.3f} s = {demand:,.0f} jobs/s "
             f"(measured on N={s.n}: {s.efficiency:.0%} of ideal)"]
    for name, ceiling, text in rows:
        lines.append(f"{name}: {text} -> {'SATURATED' if ceiling < demand else 'ok'} at {demand:,.0f} jobs/s "
                     f"({demand / ceiling:.0%} busy)")
    conns = conns_per_worker * n + 2
    lines.append(f"PostgreSQL connections: {s.pg_connections} backends of {s.n} workers seen at once ({conns_per_worker:.1f}"
                 f" per worker) x {n} + API and beat ~2 = {conns:.0f} against max_connections {max_connections} -> "
                 f"{'EXCEEDED before any CPU limit' if conns > max_connections else 'ok'}")
    lines.append(f"Redis commands: {s.redis_commands / s.cells:.1f} per job x {demand:,.0f} jobs/s = "
                 f"{s.redis_commands / s.cells * demand:,.0f} commands/s")
    lines.append(f"PostgreSQL writes: {s.pg_commits / s.cells:.1f} commits and {s.pg_rows_written / s.cells:.1f} rows "
                 f"per job x {demand:,.0f} jobs/s = {s.pg_commits / s.cells * demand:,.0f} commits/s, "
                 f"{s.pg_rows_written / s.cells * demand:,.0f} rows/s")
    worker_ms = s.worker_cpu_s / s.cells * 1000
    lines.append(f"each worker's own overhead: {worker_ms:.1f} ms CPU per job (on its own machine: "
                 f"{worker_ms / (stub_s * 1000):.0%} of a {stub_s * 1000:.0f} ms job; not shared between workers)")
    lines.append(f"finisher: {s.finish_cpu_s * 1000:.0f} ms CPU once per {s.cells}-cell run (on the last job's "
                 "worker: adds to the run's end, not to throughput)")
    per_queued = s.reconcile_cpu_s / max(1, s.reconcile_candidates) * 1000
    lines.append(f"reconcile: {s.reconcile_cpu_s * 1000:.0f} ms CPU over {s.reconcile_candidates} queued jobs "
                 f"({per_queued:.3f} ms each) every {reconcile_every_s:.0f} s: "
                 f"{s.reconcile_cpu_s / reconcile_every_s:.2%} of a core with this queue")
    first = rows[0]
    per_core = " per PostgreSQL core" if first[0].startswith("PostgreSQL") else ""
    lines.append(f"=> first CPU bottleneck: {first[0]} at {first[1]:,.0f} jobs/s{per_core}"
                 + ("; but PostgreSQL's connection limit comes first (a pooler or a smaller pool per worker)"
                    if conns > max_connections else ""))
    return lines
