"""The smoke sweep through `ampci sweep` + two `ampci worker` processes, Redis and PostgreSQL, real jobs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import sqlalchemy as sa

from service.orchestration.scheduler import load_sweep, zoo_catalog
from tests.distributed.procs import ROOT

pytestmark = [pytest.mark.celery, pytest.mark.redis, pytest.mark.postgres, pytest.mark.slow]


def test_smoke_sweep_on_celery_stores_every_result_in_postgres(cluster_env, start_worker) -> None:
    env = {**cluster_env, "AMPCI_PASS_REPO": str(ROOT), "AMPCI_JOB_TIMEOUT": "120s"}
    workers = [start_worker(f"ws{i}", queues="cpu", extra_env=env, use_cli=True) for i in range(2)]
    for w in workers:
        w.wait_ready()
    proc = subprocess.run([sys.executable, "-m", "service.cli.main", "sweep", "--sweep", "smoke",
                           "--revision", "WORKTREE", "--json", "--timeout", "240"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    planned = {c.cell for c in load_sweep(sweep="smoke").expand(zoo_catalog())}
    assert len({c[0] for c in planned}) >= 3
    run_id = out["run"]["id"]
    assert out["run"]["status"] == "complete"
    eng = sa.create_engine(env["AMPCI_DATABASE_URL"])
    with eng.connect() as c:
        rows = c.execute(sa.text("select model, dtype, policy, target, status, revision_sha, data from results "
                                 "where run_id = :r"), {"r": run_id}).all()
        jobs = c.execute(sa.text("select status, attempts, worker from jobs where run_id = :r"),
                         {"r": run_id}).all()
    eng.dispose()
    assert {tuple(r[:4]) for r in rows} == planned and len(rows) == len(planned)
    assert all(r.status == "pass" for r in rows), [(r.model, r.dtype, r.status) for r in rows]
    assert {r.revision_sha for r in rows} == {out["run"]["revision_sha"]}
    assert all(j.status == "done" and j.attempts == 1 for j in jobs)
    assert {j.worker.split("@")[0] for j in jobs} <= {"ws0", "ws1"}
    assert "sweep" in proc.stderr  # the progress bar went to stderr
