"""Server-side render time of each dashboard page with 100,000 results in PostgreSQL.

    python bench/bench_dashboard.py [--admin-url URL] [--revisions 200] [--cells 500] [--repeat 15]

Creates a fresh database (dropped at the end) and bulk-loads it with the seeding of
``bench/bench_queries.py`` (200 revisions x 500 cells on main, one push run each); then writes one
new 200-cell run through the real store (``write_result``) with some slower / less accurate cells
and runs regression detection on it.  Each page is requested in-process through the real app
(FastAPI + the dashboard router, ``TestClient``: routing, queries, templates, SVG plots; no network)
and p50/p90 are printed.  History pages are measured cold (the chart cache emptied before each
request: pygal renders every chart) and warm.  Target: every p50 < 300 ms, the cold
200-revision history included.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import sqlalchemy as sa  # noqa: E402
from bench_queries import cells, seed, sha, synthetic, timed  # noqa: E402

from service.db import Store  # noqa: E402
from service.db.admin import create_database, drop_database  # noqa: E402
from service.db.migrate import upgrade  # noqa: E402
from service.regressions.detect import detect_run

TARGET_MS = 300.0


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


def main() -> int:
    """Seed, measure, print the table; exit 1 when a page misses the target."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--admin-url", default=os.environ.get("AMPCI_TEST_DATABASE_URL",
                                                          "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"))
    ap.add_argument("--revisions", type=int, default=200)
    ap.add_argument("--cells", type=int, default=500)
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args()

    from fastapi.testclient import TestClient

    from service.api.app import create_app
    from service.dashboard import dashboard_router, plots
    from service.settings import Settings

    url = create_database(args.admin_url, "ampci_bench_dash")
    rows: list[tuple[str, int, float, float, float]] = []
    try:
        upgrade(url)
        t = time.perf_counter()
        shas = seed(url, args.revisions, args.cells)
        store = Store.from_url(url)
        grid = cells(args.cells)
        run_id = new_run(store, shas[-1], grid[:200])
        with store.transaction() as conn:
            total = conn.execute(sa.text("SELECT count(*) FROM results")).scalar_one()
        print(f"seeded {total:,} results over {args.revisions + 1} revisions in {time.perf_counter() - t:.1f}s")
        regs = store.regressions(run_id=run_id, category="regression")
        head_run = store.list_runs(limit=1, revision=shas[-1])[0].id
        cell = grid[0]
        hist = "/history?" + urlencode(dict(zip(("model", "dtype", "policy", "target"), cell, strict=True)))
        app = create_app(Settings(database_url=url, webhook_secret="bench", api_token="bench"), store=store,
                         dashboard=dashboard_router(), background=False)
        browser = {"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"}
        with TestClient(app, headers=browser) as client:
            def get(path: str, cold: bool = False) -> Any:
                def call() -> str:
                    if cold:
                        plots.clear_cache()
                    r = client.get(path)
                    assert r.status_code == 200, (path, r.status_code, r.text[:300])
                    return r.text
                return call

            for label, path, cold in [
                ("runs (50 newest)", "/runs", False),
                ("runs, branch=main & trigger=push", "/runs?branch=main&trigger=push", False),
                (f"run matrix, {len(grid)} cells, no findings", f"/runs/{head_run}", False),
                (f"run matrix, 200 cells, {len(regs)} regressions", f"/runs/{run_id}", False),
                ("run matrix + full diff (?diff=all)", f"/runs/{run_id}?diff=all", False),
                ("cell history, 40 revisions, cold", hist, True),
                ("cell history, 40 revisions, warm", hist, False),
                ("cell history, 200 revisions, cold", hist + "&limit=200", True),
                ("regression", f"/regressions/{regs[0].id}", False),
            ]:
                p50, p90, cpu, out = timed(get(path, cold), args.repeat)
                rows.append((label, len(out), p50, p90, cpu))  # type: ignore[arg-type]
        store.dispose()
    finally:
        drop_database(args.admin_url, url)

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"\n(load average {load:.1f} on {os.cpu_count()} CPUs; server and client share this process)")
    print("| page | HTML bytes | p50 ms | p90 ms | CPU p50 ms | target | ok |\n|---|---:|---:|---:|---:|---:|:--:|")
    ok = True
    for label, n, p50, p90, cpu in rows:
        good = p50 < TARGET_MS  # the 200-revision history too (lean SVG points: service/dashboard/plots.py)
        ok &= good
        mark = "yes" if good else "NO"
        print(f"| {label} | {n:,} | {p50:.1f} | {p90:.1f} | {cpu:.1f} | < {TARGET_MS:.0f} | {mark} |")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
