"""A bounded loopback load test of the webhook on a real uvicorn server (subprocess).

200 deliveries (10% duplicates, some racing their original; 10% bad signatures; 5% unsigned
oversize requests whose body is never sent; 5% replays of a valid body under a new delivery id) at
concurrency 32: every valid delivery creates exactly one run and its job messages, no duplicate or
replay creates another, no badly signed or unsigned one is accepted or stored.  The latency table is printed; the speed target
(p99 < 100 ms) is checked by ``bench/bench_webhook.py``, not asserted here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.bench_webhook import run_load

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]


def test_load_every_valid_delivery_creates_exactly_one_run(store: Any, pg_url: str, redis_url: str, queue: str,
                                                            tmp_path: Path) -> None:
    report = run_load(pg_url, redis_url, queue, n=200, concurrency=32, log=tmp_path / "server.log", seed=6)
    print("\n" + report.table())
    assert report.problems() == []
    valid = {d.delivery_id for d in report.by_kind("valid")}
    assert report.runs == len(valid) == 140
    assert len({report.run_of[d] for d in valid}) == len(valid)  # one run each
    replays = report.by_kind("replay")
    assert len(replays) == 10 and all(report.run_of[d.delivery_id] == report.run_of[d.original] for d in replays)
    unsigned = report.by_kind("unsigned_oversize")
    assert len(unsigned) == 10 and all(d.status == 401 for d in unsigned) and report.unsigned_rows == 0
    assert not any(store.get_delivery(d.delivery_id) for d in unsigned)
    assert all(d.status == 401 for d in report.by_kind("bad_signature"))
    assert all(d.status in (200, 202) for d in report.by_kind("duplicate"))
    assert not any(store.get_delivery(d.delivery_id) for d in report.by_kind("bad_signature"))
    assert report.queued_messages == 140 * report.cells_per_run
