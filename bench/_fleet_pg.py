"""PostgreSQL at fleet scale for ``bench/bench_fleet.py``: a fresh database bulk-loaded (COPY, the seeding of
``bench/bench_queries.py``) with ``revisions x cells`` synthetic results, then the size of the results and jobs
tables and the latency of the queries a fleet's control plane runs on it: the run listing (``ampci runs``,
the reporter's recovery), one run's results, regression detection of a new 200-cell run, and one reconcile pass
(its database reads: no job is queued there, so nothing is sent)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from bench.bench_queries import cells, seed, sha, synthetic, timed


@dataclass(frozen=True)
class PgScale:
    """What was measured at ``results`` results: seconds to load them, table sizes in bytes, and per query
    (label, rows, p50 ms, p90 ms)."""

    results: int
    load_s: float
    results_bytes: int
    jobs_bytes: int
    queries: list[tuple[str, int, float, float]]


def pg_at_scale(admin_url: str, revisions: int, n_cells: int, repeat: int, reconcile_pass: Callable[[Any], object]
                ) -> PgScale:
    """Seed, measure, drop.  ``reconcile_pass(store)`` runs one reconcile over the seeded store."""
    from service.db import Store
    from service.db.admin import create_database, drop_database
    from service.db.migrate import upgrade
    from service.orchestration.judge import detect_run

    url = create_database(admin_url, "ampci_bench")
    try:
        upgrade(url)
        t0 = time.perf_counter()
        shas = seed(url, revisions, n_cells)
        load_s = time.perf_counter() - t0
        engine = sa.create_engine(url)
        with engine.connect() as conn:
            results_bytes = int(conn.execute(sa.text("SELECT pg_total_relation_size('results')")).scalar_one())
            jobs_bytes = int(conn.execute(sa.text("SELECT pg_total_relation_size('jobs')")).scalar_one())
        engine.dispose()
        store = Store.from_url(url)
        new = sha(10_000_000)
        store.upsert_revision(new, [shas[-1]], "main", "bench", "new commit")
        grid = cells(n_cells)[:200]
        run_id = store.create_run(new, "nightly", cells=grid)
        rng = random.Random(5)
        for c in grid:
            store.write_result(run_id, synthetic(c, rng))
        mid = shas[len(shas) // 2]
        queries: list[tuple[str, int, float, float]] = []
        for label, fn in [
            ("list runs (newest 50)", lambda: store.list_runs(limit=50)),
            ("list nightly runs (newest 50)", lambda: store.list_runs(limit=50, trigger="nightly")),
            (f"results of one run ({n_cells} cells)", lambda: store.results(revision=mid[:10])),
            ("detect regressions, new 200-cell run", lambda: detect_run(store, run_id)),
            ("reconcile pass (DB reads, idle queue)", lambda: reconcile_pass(store) or []),
        ]:
            p50, p90, _, out = timed(fn, repeat)
            queries.append((label, len(out) if isinstance(out, list) else 0, p50, p90))
        store.dispose()
    finally:
        drop_database(admin_url, url)
    return PgScale(revisions * n_cells, load_s, results_bytes, jobs_bytes, queries)
