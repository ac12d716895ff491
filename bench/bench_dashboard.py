"""Server-side render time of each dashboard page with 100,000 results in PostgreSQL.

    python bench/bench_dashboard.py [--admin-url URL] [--revisions 500] [--small-revisions 50] [--cells 200]
                                    [--repeat 15] [--quick]

Creates fresh databases (dropped at the end) and bulk-loads them with the seeding of
``bench/bench_queries.py`` (500 revisions x 200 cells on main, one push run each: 100,000 results; and
the anchor, 50 revisions x 200 cells: 10,000); then writes one new 200-cell run through the real store
(``write_result``) with some slower / less accurate cells and runs regression detection on it.  Each
page is requested in-process through the real app (FastAPI + the dashboard router, ``TestClient``:
routing, queries, templates, SVG plots; no network) and p50/p90 are printed.  History pages are
measured cold (the chart cache emptied before each request: pygal renders every chart) and warm.

Targets: every p50 < 300 ms, the cold 200-revision history included; the front page ``/`` (the 50
newest runs with their counts) at 100,000 results within 1.3x of ``/`` at 10,000, requests to the two
alternating: both show the same 50 runs of 200 cells, only the history behind them grows.  Exit 1
when a target is missed or an invariant fails (every page answers 200, ``/`` lists the newest run,
the new run shows regressions).  ``--quick`` (seconds: 3 and 6 revisions x 10 cells, 3 repeats) checks
the invariants only and prints its timings without judging them.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import sqlalchemy as sa  # noqa: E402
from bench_queries import (  # noqa: E402
    cells,
    exit_status,
    parse_sized,
    seed,
    sha,
    size_options,
    synthetic,
    timed,
)

from service.db import Store  # noqa: E402
from service.db.admin import create_database, drop_database  # noqa: E402
from service.db.migrate import upgrade  # noqa: E402
from service.orchestration.judge import detect_run  # noqa: E402

TARGET_MS = 300.0
FRONT_GROWTH = 1.3  # `/` at the full size within 1.3x of `/` at the anchor size


def new_run(store: Store, head: str, grid: list[tuple[str, str, str, str]]) -> int:
    """A 200-cell push run on a child of ``head`` written through the store, with findings detected."""
    new = sha(20_000)
    store.upsert_revision(new, [head], "main", "bench", "new commit: move Softmax to fp16")
    run_id = store.create_run(new, "push", cells=grid)
    rng = random.Random(5)
    results = []
    for i, c in enumerate(grid):
        r = synthetic(c, rng, slow=1.5 if i % 25 == 0 else 1.0)
        if i % 40 == 0:
            r.accuracy.worst.max_abs = 0.5  # type: ignore[union-attr]
        results.append(r)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda r: store.write_result(run_id, r), results))
    store.finish_run(run_id)
    detect_run(store, run_id)
    return run_id


class Seeded:
    """A fresh database seeded with ``revisions`` x ``cells`` results plus one new 200-cell run with findings,
    served by the real app in-process; dropped by :meth:`close`."""

    def __init__(self, admin_url: str, revisions: int, n_cells: int) -> None:
        from fastapi.testclient import TestClient

        from service.api.app import create_app
        from service.dashboard import dashboard_router
        from service.settings import Settings

        self.admin_url, self.revisions = admin_url, revisions
        self.url = create_database(admin_url, "ampci_bench_dash")
        upgrade(self.url)
        self.shas = seed(self.url, revisions, n_cells)
        self.store = Store.from_url(self.url)
        self.grid = cells(n_cells)
        self.run_id = new_run(self.store, self.shas[-1], self.grid[:200])
        with self.store.transaction() as conn:
            self.total = conn.execute(sa.text("SELECT count(*) FROM results")).scalar_one()
        app = create_app(Settings(database_url=self.url, webhook_secret="bench", api_token="bench"), store=self.store,
                         dashboard=dashboard_router(), background=False)
        self.client = TestClient(app, headers={"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"})
        self.client.__enter__()

    def get(self, path: str, cold: bool = False) -> Any:
        """A timed call of one page (asserting 200); ``cold`` empties the chart cache first."""
        from service.dashboard import plots

        def call() -> str:
            if cold:
                plots.clear_cache()
            r = self.client.get(path)
            assert r.status_code == 200, (path, r.status_code, r.text[:300])
            return r.text
        return call

    def close(self) -> None:
        """Stop the app and drop the database."""
        self.client.__exit__(None, None, None)
        self.store.dispose()
        drop_database(self.admin_url, self.url)


def alternating(calls: list[Any], repeat: int) -> list[float]:
    """p50 ms of each call, timed in alternation (round after round, first call alternating) after a warm-up."""
    for call in calls:
        call()
    times: list[list[float]] = [[] for _ in calls]
    for i in range(repeat):
        order = list(range(len(calls))) if i % 2 else list(reversed(range(len(calls))))
        for k in order:
            t = time.perf_counter()
            calls[k]()
            times[k].append((time.perf_counter() - t) * 1000)
    return [statistics.median(ts) for ts in times]


def main(argv: list[str] | None = None) -> int:
    """Seed, measure, print the table; exit 1 when a page misses a target or an invariant fails."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    size_options(ap, revisions=500, small_revisions=50, cells=200)
    args = parse_sized(ap, argv)

    t = time.perf_counter()
    rows: list[tuple[str, int, float, float, float]] = []
    broken: list[str] = []
    small = big = None
    try:
        small = Seeded(args.admin_url, args.small_revisions, args.cells)
        big = Seeded(args.admin_url, args.revisions, args.cells)
        print(f"seeded {small.total:,} and {big.total:,} results in {time.perf_counter() - t:.1f}s")
        store, grid, run_id, shas = big.store, big.grid, big.run_id, big.shas
        regs = store.regressions(run_id=run_id, category="regression")
        if not regs:
            broken.append("the new run has no regression to show")
        head_run = store.list_runs(limit=1, revision=shas[-1])[0].id
        cell = grid[0]
        hist = "/history?" + urlencode(dict(zip(("model", "dtype", "policy", "target"), cell, strict=True)))
        front_small, front_big = alternating([small.get("/"), big.get("/")], args.repeat)
        for page, seeded in (("/", small), ("/", big)):
            html = seeded.get(page)()
            if f"/runs/{seeded.run_id}" not in html:
                broken.append(f"`/` at {seeded.total:,} results does not list the newest run {seeded.run_id}")
        for label, path, cold in [
            ("runs, branch=main & trigger=push", "/runs?branch=main&trigger=push", False),
            (f"run matrix, {len(grid)} cells, no findings", f"/runs/{head_run}", False),
            (f"run matrix, 200 cells, {len(regs)} regressions", f"/runs/{run_id}", False),
            ("run matrix + full diff (?diff=all)", f"/runs/{run_id}?diff=all", False),
            ("cell history, 40 revisions, cold", hist, True),
            ("cell history, 40 revisions, warm", hist, False),
            (f"cell history, {min(200, args.revisions)} revisions, cold", hist + "&limit=200", True),
            *((("regression", f"/regressions/{regs[0].id}", False),) if regs else ()),
        ]:
            p50, p90, cpu, out = timed(big.get(path, cold), args.repeat)
            rows.append((label, len(out), p50, p90, cpu))  # type: ignore[arg-type]
    finally:
        for seeded in (small, big):
            if seeded is not None:
                seeded.close()

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"\n(load average {load:.1f} on {os.cpu_count()} CPUs; server and client share this process)")
    growth = front_big / front_small
    ok = growth <= FRONT_GROWTH and front_big < TARGET_MS
    print("| page | anchor | p50 ms | anchor p50 ms | ratio | target | met |\n|---|---|---:|---:|---:|---|:--:|")
    print(f"| `/` at {big.total:,} results | `/` at {small.total:,} results | {front_big:.1f} | {front_small:.1f} | "
          f"{growth:.2f} | <= {FRONT_GROWTH:g}x and < {TARGET_MS:.0f} ms | {'PASS' if ok else 'FAIL'} |\n")
    print(f"| page at {big.total:,} results | HTML bytes | p50 ms | p90 ms | CPU p50 ms | target | met |\n"
          "|---|---:|---:|---:|---:|---:|:--:|")
    for label, n, p50, p90, cpu in rows:
        good = p50 < TARGET_MS  # the 200-revision history too (lean SVG points: service/dashboard/plots.py)
        ok &= good
        print(f"| {label} | {n:,} | {p50:.1f} | {p90:.1f} | {cpu:.1f} | < {TARGET_MS:.0f} | {'PASS' if good else 'FAIL'} |")
    return exit_status(ok, broken, args.quick)


if __name__ == "__main__":
    sys.exit(main())
