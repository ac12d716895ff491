"""Query speed of the results store on PostgreSQL at 10,000, 100,000 and 1,000,000 synthetic results.

    python bench/bench_queries.py [--admin-url URL] [--small-revisions 20] [--revisions 200]
                                  [--huge-revisions 2000] [--cells 500] [--repeat 15] [--quick]

For each size, creates a fresh database (all dropped at the end), brings it to head with Alembic, bulk-loads a
linear history of revisions with one push run of every cell per revision (COPY), runs VACUUM ANALYZE; then
prints p50/p95 over repeated calls of the Store API behind ``ampci results``, ``compare``, ``history`` and
regression detection for one new run of 200 cells -- at 20, 200 and 2,000 revisions of 500 cells (10,000,
100,000 and 1,000,000 results; ``--huge-revisions 0`` leaves the largest out: seeding it takes ~2 minutes),
the sizes timed in turn call by call (so a busy machine's load falls on each alike), with the load average
seen while timing and the growth from the smallest size to the largest.
Targets: detection of the 200-cell run <= 100 ms p50 at every size (flat from 10k to 1M), every other p50
<= 200 ms at the full size (100,000).  Exit 1 when one is missed or an invariant fails (detection finds the
planted accuracy regressions, compare lists every cell).  ``--quick`` (seconds: 3, 6 and 12 revisions x 10
cells, 3 repeats) checks the invariants only and prints its timings without judging them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Sized
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import sqlalchemy as sa  # noqa: E402

from service.db import Store  # noqa: E402
from service.db import models as m  # noqa: E402
from service.db.admin import create_database, drop_database  # noqa: E402
from service.db.extract import result_columns  # noqa: E402
from service.db.migrate import upgrade  # noqa: E402
from service.orchestration.judge import detect_run  # noqa: E402
from workers.result import (  # noqa: E402
    AccuracyReport,
    GraphFacts,
    JobResult,
    LatencyStats,
    OutputMetrics,
)

TARGET_MS = 200.0
DETECT, DETECT_TARGET_MS = "detect regressions, 200-cell run", 100.0
T0 = datetime(2026, 6, 1, tzinfo=UTC)


def sha(i: int) -> str:
    return f"{i:08x}{uuid.uuid5(uuid.NAMESPACE_OID, str(i)).hex}"[:40]


def cells(n: int) -> list[tuple[str, str, str, str]]:
    out = []
    for i in range(n):
        out.append((f"model_{i // 4:04d}", ("fp16", "bf16")[i % 2], ("default", "aggressive")[(i // 2) % 2], "cuda"))
    return out


def synthetic(cell: tuple[str, str, str, str], rng: random.Random, slow: float = 1.0) -> JobResult:
    """A realistic JobResult (10 latency samples) with small random variation."""
    base = 1.0 + (hash(cell) % 50) / 10
    samples = [base * slow * (1 + rng.uniform(-0.02, 0.02)) for _ in range(10)]
    p50 = statistics.median(samples)
    err = 10 ** rng.uniform(-4, -3)
    worst = OutputMetrics(max_abs=err, mean_abs=err / 10, max_rel=err * 3, cosine=1 - err / 10, snr_db=55.0,
                          baseline_max_abs=1e-6)
    return JobResult(model=cell[0], dtype=cell[1], policy=cell[2], target=cell[3], status="pass",
                     accuracy=AccuracyReport(mode="emulation", provider="CPUExecutionProvider", worst=worst),
                     latency=LatencyStats(provider="CUDAExecutionProvider", samples_ms=samples,
                                          fp32_samples_ms=[x * 1.7 for x in samples], p50_ms=p50,
                                          fp32_p50_ms=p50 * 1.7, speedup=1.7),
                     graph=GraphFacts(nodes_total=300, nodes_low=280, casts_inserted=12, compute_nodes=200,
                                      compute_low=190, low_precision_compute_fraction=0.95),
                     environment={"fingerprint": "h200-ort1.20"})


def seed(url: str, n_revs: int, n_cells: int) -> list[str]:
    """Bulk-load revisions, runs, jobs and results; returns the revision shas oldest first.  Each cell's results
    are drawn from 16 synthetic variants of it (built once, their columns and documents encoded once), so a
    million results seed in minutes rather than in the hour one JobResult per row would take."""
    rng = random.Random(7)
    engine = sa.create_engine(url)
    shas = [sha(i) for i in range(n_revs)]
    grid = cells(n_cells)
    res_cols = ["run_id", "revision_sha", "model", "dtype", "policy", "target", "created_at", "updated_at",
                "status", "message", "model_sha256", "cosine", "max_abs", "error_ratio", "latency_p50_ms",
                "fp32_p50_ms", "speedup", "low_precision_fraction", "casts_inserted", "final_error", "diverged",
                "env_fingerprint", "data", "sample_doc"]
    variants: dict[tuple[str, str, str, str], list[tuple[object, ...]]] = {}
    for c in grid:
        rows = []
        for _ in range(min(16, n_revs)):
            cols = result_columns(synthetic(c, rng))
            cols["data"] = json.dumps(cols["data"])
            rows.append(tuple(cols[k] for k in res_cols[8:]))
        variants[c] = rows
    with engine.begin() as conn:
        conn.execute(m.Revision.__table__.insert(), [
            {"sha": s, "parents": [shas[i - 1]] if i else [], "branch": "main", "author": "bench",
             "message": f"commit {i}", "committed_at": T0 + timedelta(hours=i), "created_at": T0}
            for i, s in enumerate(shas)])
        conn.execute(m.RevisionParent.__table__.insert(), [
            {"child_sha": s, "position": 0, "parent_sha": shas[i - 1]} for i, s in enumerate(shas) if i])
        run_ids = conn.execute(m.Run.__table__.insert().returning(m.Run.id, sort_by_parameter_order=True), [
            {"revision_sha": s, "trigger": "push", "status": "complete", "sweep": "full", "meta": {},
             "created_at": T0 + timedelta(hours=i, minutes=5), "finished_at": T0 + timedelta(hours=i, minutes=50)}
            for i, s in enumerate(shas)]).scalars().all()
        raw = conn.connection.driver_connection
        with raw.cursor() as cur:
            with cur.copy("COPY jobs (run_id, model, dtype, policy, target, status, attempts, queued_at, "
                          "finished_at) FROM STDIN") as cp:
                for i, run_id in enumerate(run_ids):
                    t = T0 + timedelta(hours=i, minutes=5)
                    for c in grid:
                        cp.write_row((run_id, *c, "done", 1, t, t))
            with cur.copy(f"COPY results ({', '.join(res_cols)}) FROM STDIN") as cp:
                for i, (run_id, s) in enumerate(zip(run_ids, shas, strict=True)):
                    t = T0 + timedelta(hours=i, minutes=30)
                    for c in grid:
                        cp.write_row((run_id, s, *c, t, t, *rng.choice(variants[c])))
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        # the steady state autovacuum keeps (PostgreSQL >= 13 vacuums after inserts too): statistics and a
        # visibility map, without which no index-only scan is possible right after a bulk load
        conn.execute(sa.text("VACUUM ANALYZE"))
    engine.dispose()
    return shas


def timings(fn: Callable[[], object], repeat: int) -> tuple[list[float], float, object]:
    """(wall ms of each call sorted, client CPU p50 ms, last output) after one warm-up call."""
    fn()  # warm-up (connection pool, plan cache)
    times, cpu, out = [], [], None
    for _ in range(repeat):
        t, c = time.perf_counter(), time.process_time()
        out = fn()
        times.append((time.perf_counter() - t) * 1000)
        cpu.append((time.process_time() - c) * 1000)
    return sorted(times), statistics.median(cpu), out


def quantile(times: list[float], q: float) -> float:
    """The ``q`` quantile of sorted ``times`` (nearest rank below: p90 of 15 calls is the 13th)."""
    return times[int(q * (len(times) - 1))]


def timed(fn: Callable[[], object], repeat: int) -> tuple[float, float, float, object]:
    """(wall p50 ms, wall p90 ms, client CPU p50 ms, last output) after one warm-up call."""
    times, cpu, out = timings(fn, repeat)
    return statistics.median(times), quantile(times, 0.9), cpu, out


class Seeded:
    """A fresh database seeded with ``revisions`` x ``n_cells`` results and one new run of up to 200 cells
    (every 25th slower, every 40th less accurate), and the operations timed on it."""

    def __init__(self, admin_url: str, revisions: int, n_cells: int) -> None:
        self.admin_url, self.results = admin_url, revisions * n_cells
        self.url = create_database(admin_url, "ampci_bench")
        upgrade(self.url)
        t = time.perf_counter()
        self.shas = shas = seed(self.url, revisions, n_cells)
        self.seed_s = time.perf_counter() - t
        self.n_cells = n_cells
        self.store = store = Store.from_url(self.url)
        new = sha(10_000_000)
        store.upsert_revision(new, [shas[-1]], "main", "bench", "new commit")
        self.grid = grid = cells(n_cells)[:200]
        self.run_id = store.create_run(new, "push", cells=grid)
        rng = random.Random(99)
        for i, c in enumerate(grid):
            r = synthetic(c, rng, slow=1.5 if i % 25 == 0 else 1.0)
            if i % 40 == 0:
                r.accuracy.worst.max_abs = 0.5  # type: ignore[union-attr]
            store.write_result(self.run_id, r)
        self.mid, self.prev = shas[len(shas) // 2], shas[len(shas) // 2 - 1]

    def operations(self) -> list[tuple[str, Callable[[], Sized]]]:
        """(label, call) of each operation timed."""
        store, grid, mid, prev = self.store, self.grid, self.mid, self.prev
        return [
            ("results for one revision", lambda: store.results(revision=mid[:10])),
            ("compare two revisions", lambda: store.compare(prev[:10], mid[:10])),
            ("history of one cell (all revisions)", lambda: store.history(
                grid[0][0], grid[0][1], grid[0][2], grid[0][3], metric="latency_p50")),
            (DETECT, lambda: detect_run(store, self.run_id)),
            ("open regressions list", lambda: store.regressions(state="open")),
        ]

    def broken(self) -> list[str]:
        """The invariants this database breaks (after its run was detected)."""
        out = []
        n = len(self.store.results(revision=self.shas[-1]))
        if n != self.n_cells:
            out.append(f"results at the head revision: {n}, seeded {self.n_cells}")
        found = {(r.model, r.kind) for r in self.store.regressions(run_id=self.run_id, category="regression")}
        for i, c in enumerate(self.grid):  # what the new run must be found to regress, whatever the timing
            if i % 40 == 0 and (c[0], "accuracy") not in found:
                out.append(f"detection missed the accuracy regression of {c} at {self.results:,} results")
        if len(self.store.compare(self.prev[:10], self.mid[:10])) != self.n_cells:
            out.append(f"compare does not list every cell at {self.results:,} results")
        return out

    def drop(self, keep: bool = False) -> None:
        """Dispose of the store and drop the database (``keep``: print its URL instead)."""
        self.store.dispose()
        if keep:
            print(f"kept {self.url}")
        else:
            drop_database(self.admin_url, self.url)


def interleaved(sizes: list[Seeded], repeat: int) -> tuple[list[list[tuple[str, int, float, float, float]]],
                                                            list[float]]:
    """Time every operation at every size, the sizes taking turns call by call (one warm-up call each first),
    so a change of the machine's load falls on every size alike: per size, per operation (label, rows, p50 ms,
    p95 ms, client CPU p50 ms), and the load averages (1 min) seen while timing."""
    loads: list[float] = []
    per_size: list[list[tuple[str, int, float, float, float]]] = [[] for _ in sizes]
    ops = [z.operations() for z in sizes]
    for k in range(len(ops[0])):
        label = ops[0][k][0]
        walls: list[list[float]] = [[] for _ in sizes]
        cpus: list[list[float]] = [[] for _ in sizes]
        rows = [len(o[k][1]()) for o in ops]  # warm-up (connection pool, plan cache)
        for _ in range(repeat):
            loads.append(os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan"))
            for i, o in enumerate(ops):
                t, c = time.perf_counter(), time.process_time()
                o[k][1]()
                walls[i].append((time.perf_counter() - t) * 1000)
                cpus[i].append((time.process_time() - c) * 1000)
        for i in range(len(sizes)):
            w = sorted(walls[i])
            per_size[i].append((label, rows[i], statistics.median(w), quantile(w, 0.95), statistics.median(cpus[i])))
    return per_size, loads


def size_options(ap: argparse.ArgumentParser, revisions: int, small_revisions: int, cells: int) -> None:
    """The options of a bench over two seeded databases (this one and bench_dashboard.py): the admin URL,
    the full and the anchor size, the repeats, and ``--quick`` (see :func:`parse_sized`)."""
    ap.add_argument("--admin-url", default=os.environ.get("AMPCI_TEST_DATABASE_URL",
                                                          "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"))
    ap.add_argument("--revisions", type=int, default=revisions)
    ap.add_argument("--small-revisions", type=int, default=small_revisions,
                    help=f"the anchor size ({small_revisions} x {cells} = {small_revisions * cells:,} results)")
    ap.add_argument("--cells", type=int, default=cells)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--quick", action="store_true", help="seconds: 3 and 6 revisions x 10 cells; invariants only")


def parse_sized(ap: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse; ``--quick`` means 3 and 6 revisions of 10 cells, 3 repeats."""
    args = ap.parse_args(argv)
    if args.quick:
        args.revisions, args.small_revisions, args.cells, args.repeat = 6, 3, 10, 3
    return args


def exit_status(ok: bool, broken: list[str], quick: bool) -> int:
    """Print each broken invariant on stderr; 1 when one is broken, or (not ``quick``: timings judged) a
    target was missed, else 0."""
    for b in broken:
        print(f"FAILED: {b}", file=sys.stderr)
    if quick:
        print("(--quick: timings printed, not judged)")
        return 1 if broken else 0
    return 0 if ok and not broken else 1


def main(argv: list[str] | None = None) -> int:
    """Measure at each size, print the table; exit 1 when a target or invariant fails."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    size_options(ap, revisions=200, small_revisions=20, cells=500)
    ap.add_argument("--huge-revisions", type=int, default=2000,
                    help="the largest size (2,000 x 500 = 1,000,000 results; 0: not measured)")
    ap.add_argument("--keep", action="store_true", help="keep the full-size database (its URL is printed)")
    args = parse_sized(ap, argv)
    if args.quick:
        args.huge_revisions = 12

    t = time.perf_counter()
    broken: list[str] = []
    wanted = sorted({args.small_revisions, args.revisions, *([args.huge_revisions] * (args.huge_revisions > 0))})
    seeded: list[Seeded] = []
    try:
        for revisions in wanted:
            seeded.append(Seeded(args.admin_url, revisions, args.cells))
        timed_rows, loads = interleaved(seeded, args.repeat)
        for z in seeded:
            broken += z.broken()
    finally:
        for z in seeded:
            z.drop(keep=args.keep and z.results == args.revisions * args.cells)
    full_i = next(i for i, z in enumerate(seeded) if z.results == args.revisions * args.cells)
    full = timed_rows[full_i]
    print(f"{' / '.join(f'{z.results:,}' for z in seeded)} results seeded and measured in "
          f"{time.perf_counter() - t:.0f}s on {os.cpu_count()} CPUs (seeding {' / '.join(f'{z.seed_s:.0f}' for z in seeded)}"
          f" s; the sizes timed in turn, call by call, at load average {min(loads):.1f}-{max(loads):.1f}; "
          "client CPU = this process only)")
    print("| operation | rows | " + " | ".join(f"p50 / p95 ms at {z.results:,}" for z in seeded)
          + f" | client CPU p50 ms at {seeded[full_i].results:,} | growth | target | met |\n|---|---:|"
          + "---:|" * len(seeded) + "---:|---:|---:|:--:|")
    ok = True
    for i, (label, n, p50_full, _, cpu_full) in enumerate(full):
        detect = label == DETECT
        target = DETECT_TARGET_MS if detect else TARGET_MS
        p50s = [rows[i][2] for rows in timed_rows]
        # detection must stay within its target from the smallest size to the largest (flat); every other
        # operation at the full size
        met = all(p <= target for p in p50s) if detect else p50_full <= target
        ok &= met
        cols = " | ".join(f"{rows[i][2]:.1f} / {rows[i][3]:.1f}" for rows in timed_rows)
        print(f"| {label} | {n} | {cols} | {cpu_full:.1f} | {p50s[-1] / p50s[0]:.2f}x | "
              f"<= {target:.0f} ms{' at every size' if detect else f' at {seeded[full_i].results:,}'} | "
              f"{'PASS' if met else 'FAIL'} |")
    return exit_status(ok, broken, args.quick)


if __name__ == "__main__":
    sys.exit(main())
