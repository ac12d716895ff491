"""Benchmarks that cannot rot (issue 25): every script in bench/ has a ``--quick`` mode that runs in seconds
on tiny inputs and exits non-zero when its invariants fail, and the suite runs each of them that way.

The scripts are enumerated from the folder, so a new benchmark is covered (and must have ``--quick``)
without editing this file.  They use the same PostgreSQL and Redis as the rest of the suite
(``AMPCI_TEST_DATABASE_URL`` / ``AMPCI_TEST_REDIS_URL``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ADMIN_URL, REDIS_URL

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
SCRIPTS = sorted(p for p in BENCH.glob("*.py") if not p.name.startswith("_"))
QUICK_TIMEOUT_S = 300  # "seconds" on an idle machine; generous for a shared 2-core CI box


def test_the_bench_folder_is_enumerated() -> None:
    assert len(SCRIPTS) >= 9 and (BENCH / "bench_cli.py") in SCRIPTS


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_bench_runs_quick_and_its_invariants_hold(script: Path, tmp_path: Path) -> None:
    usage = subprocess.run([sys.executable, str(script), "--help"], cwd=ROOT, capture_output=True, text=True,
                           timeout=QUICK_TIMEOUT_S)
    # the script's own parser says it has --quick (the option may be added by a shared helper)
    assert usage.returncode == 0 and "--quick" in usage.stdout, \
        f"bench/{script.name} has no --quick mode (issue 25: every benchmark needs one)"
    env = {**os.environ, "AMPCI_TEST_DATABASE_URL": ADMIN_URL, "AMPCI_TEST_REDIS_URL": REDIS_URL,
           "AMPCI_DATA_DIR": str(tmp_path / "data"), "AMPCI_DATABASE_URL": ""}
    proc = subprocess.run([sys.executable, str(script), "--quick"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=QUICK_TIMEOUT_S)
    tail = (proc.stdout[-2000:] + "\n--- stderr ---\n" + proc.stderr[-2000:]).strip()
    assert proc.returncode == 0, f"`python bench/{script.name} --quick` exited {proc.returncode}:\n{tail}"


def test_the_drain_cost_leaves_pool_child_replacements_out_for_both_sides() -> None:
    """bench_dispatch's like-for-like drain figure: per pool child, consecutive completions; a gap across a
    replacement (new pid on the same worker) is counted apart, whichever drain it fell in."""
    sys.path.insert(0, str(ROOT))
    from bench.bench_dispatch import drain_cost

    a = [("w1@h:10", 0.00), ("w1@h:10", 0.01), ("w1@h:10", 0.02), ("w1@h:11", 2.02), ("w1@h:11", 2.03)]
    b = [("w2@h:20", 0.005), ("w2@h:20", 0.025), ("w2@h:20", 0.045)]
    got = drain_cost(a + b)
    assert got.tasks == 8 and got.replacements == 1 and abs(got.replaced_s - 2.0) < 1e-9
    assert abs(got.per_task_ms - (0.01 * 3 + 0.02 * 2) / 5 * 1000) < 1e-6  # 3 gaps of 10 ms, 2 of 20 ms
    assert drain_cost([("w@h:1", 1.0)]).per_task_ms != drain_cost([("w@h:1", 1.0)]).per_task_ms  # NaN
