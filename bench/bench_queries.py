"""Query speed of the results store on PostgreSQL with 100,000 synthetic results over 200 revisions.

    python bench/bench_queries.py [--admin-url URL] [--revisions 200] [--small-revisions 20] [--cells 500]
                                  [--repeat 15] [--quick]

Creates a fresh database (dropped at the end), brings it to head with Alembic, bulk-loads a linear
history of revisions with one push run of every cell per revision (COPY), runs ANALYZE, then
prints p50/p90 over repeated calls of the Store API behind ``ampci results``, ``compare``,
``history`` and regression detection for one new run of 200 cells -- at the anchor size (20
revisions: 10,000 results) and the full size (200 revisions: 100,000 results), with the growth
between them.  Targets at the full size: detection of the 200-cell run <= 100 ms, every other p50
<= 200 ms.  Exit 1 when one is missed or an invariant fails (detection finds the planted accuracy
regressions, compare lists every cell).  ``--quick`` (seconds: 3 and 6 revisions x 10 cells, 3
repeats) checks the invariants only and prints its timings without judging them.
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
from collections.abc import Callable
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
    """Bulk-load revisions, runs, jobs and results; returns the revision shas oldest first."""
    rng = random.Random(7)
    engine = sa.create_engine(url)
    shas = [sha(i) for i in range(n_revs)]
    grid = cells(n_cells)
    res_cols = ["run_id", "revision_sha", "model", "dtype", "policy", "target", "created_at", "updated_at",
                "status", "message", "model_sha256", "cosine", "max_abs", "error_ratio", "latency_p50_ms",
                "fp32_p50_ms", "speedup", "low_precision_fraction", "casts_inserted", "final_error", "diverged",
                "env_fingerprint", "data"]
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
                        cols = result_columns(synthetic(c, rng))
                        cols["data"] = json.dumps(cols["data"])
                        row = {"run_id": run_id, "revision_sha": s, "model": c[0], "dtype": c[1], "policy": c[2],
                               "target": c[3], "created_at": t, "updated_at": t, **cols}
                        cp.write_row(tuple(row[k] for k in res_cols))
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        # the steady state autovacuum keeps (PostgreSQL >= 13 vacuums after inserts too): statistics and a
        # visibility map, without which no index-only scan is possible right after a bulk load
        conn.execute(sa.text("VACUUM ANALYZE"))
    engine.dispose()
    return shas


def timed(fn: Callable[[], object], repeat: int) -> tuple[float, float, float, object]:
    """(wall p50 ms, wall p90 ms, client CPU p50 ms, last output) after one warm-up call."""
    fn()  # warm-up (connection pool, plan cache)
    times, cpu, out = [], [], None
    for _ in range(repeat):
        t, c = time.perf_counter(), time.process_time()
        out = fn()
        times.append((time.perf_counter() - t) * 1000)
        cpu.append((time.process_time() - c) * 1000)
    times.sort()
    return statistics.median(times), times[int(0.9 * (len(times) - 1))], statistics.median(cpu), out


def measure(admin_url: str, revisions: int, n_cells: int, repeat: int, keep: bool = False
            ) -> tuple[int, list[tuple[str, int, float, float, float]], list[str]]:
    """Seed a fresh database with ``revisions`` x ``n_cells`` results, add one new run of up to 200 cells
    (every 25th slower, every 40th less accurate) and time each operation: (results seeded, rows, broken
    invariants)."""
    url = create_database(admin_url, "ampci_bench")
    broken: list[str] = []
    try:
        upgrade(url)
        shas = seed(url, revisions, n_cells)
        store = Store.from_url(url)
        n = len(store.results(revision=shas[-1]))
        if n != n_cells:
            broken.append(f"results at the head revision: {n}, seeded {n_cells}")

        new = sha(10_000)
        store.upsert_revision(new, [shas[-1]], "main", "bench", "new commit")
        grid = cells(n_cells)[:200]
        run_id = store.create_run(new, "push", cells=grid)
        rng = random.Random(99)
        for i, c in enumerate(grid):
            r = synthetic(c, rng, slow=1.5 if i % 25 == 0 else 1.0)
            if i % 40 == 0:
                r.accuracy.worst.max_abs = 0.5  # type: ignore[union-attr]
            store.write_result(run_id, r)

        mid, prev = shas[len(shas) // 2], shas[len(shas) // 2 - 1]
        rows: list[tuple[str, int, float, float, float]] = []
        for label, fn in [
            ("results for one revision", lambda: store.results(revision=mid[:10])),
            ("compare two revisions", lambda: store.compare(prev[:10], mid[:10])),
            (f"history of one cell ({revisions} points)", lambda: store.history(
                grid[0][0], grid[0][1], grid[0][2], grid[0][3], metric="latency_p50")),
            (DETECT, lambda: detect_run(store, run_id)),
            ("open regressions list", lambda: store.regressions(state="open")),
        ]:
            p50, p90, cpu, out = timed(fn, repeat)
            rows.append((label, len(out), p50, p90, cpu))  # type: ignore[arg-type]
        found = {(r.model, r.kind) for r in store.regressions(run_id=run_id, category="regression")}
        for i, c in enumerate(grid):  # what the new run must be found to regress, whatever the timing
            if i % 40 == 0 and (c[0], "accuracy") not in found:
                broken.append(f"detection missed the accuracy regression of {c}")
        if len(store.compare(prev[:10], mid[:10])) != n_cells:
            broken.append("compare does not list every cell")
        store.dispose()
    finally:
        if keep:
            print(f"kept {url}")
        else:
            drop_database(admin_url, url)
    return revisions * n_cells, rows, broken


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
    """Measure at the small and the full size, print the table; exit 1 when a target or invariant fails."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    size_options(ap, revisions=200, small_revisions=20, cells=500)
    ap.add_argument("--keep", action="store_true", help="keep the full-size database (its URL is printed)")
    args = parse_sized(ap, argv)

    t = time.perf_counter()
    small_n, small, broken = measure(args.admin_url, args.small_revisions, args.cells, args.repeat)
    big_n, big, broken_big = measure(args.admin_url, args.revisions, args.cells, args.repeat, args.keep)
    broken += broken_big
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{small_n:,} and {big_n:,} results seeded and measured in {time.perf_counter() - t:.0f}s "
          f"(load average {load:.1f} on {os.cpu_count()} CPUs; client CPU = this process only)")
    print(f"| operation | rows | p50 ms at {small_n:,} | p50 ms at {big_n:,} | p90 ms | client CPU p50 ms | "
          "growth | target | met |\n|---|---:|---:|---:|---:|---:|---:|---:|:--:|")
    ok = True
    for (_, _, p50_small, _, _), (label, n, p50, p90, cpu) in zip(small, big, strict=True):
        target = DETECT_TARGET_MS if label == DETECT else TARGET_MS
        met = p50 <= target
        ok &= met
        print(f"| {label} | {n} | {p50_small:.1f} | {p50:.1f} | {p90:.1f} | {cpu:.1f} | {p50 / p50_small:.2f}x | "
              f"<= {target:.0f} ms | {'PASS' if met else 'FAIL'} |")
    return exit_status(ok, broken, args.quick)


if __name__ == "__main__":
    sys.exit(main())
