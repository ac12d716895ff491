#!/usr/bin/env python3
"""Embedded-sweep timing (issue 25): what an `ampci sweep` costs beyond its models' own work.

    python bench/bench_sweep.py [--pairs 2] [--quick]

Runs ``ampci sweep`` (embedded: local pool, SQLite under a scratch data dir, this checkout's working
tree as the revision, ``--no-baseline-run``) as a whole process, as a user would, after one warm-up
sweep (model fetch, fp32 references, revision worktree).  Prints, with their anchors:

* the warm smoke sweep's wall time beside the sum of its cells' model work; target wall <= 2x model work.
  **What counts as model work** (per stored result, as the worker timed it): ``exec_s``, i.e. the time
  inside onnxruntime (session creation, the accuracy, convergence and latency runs, release) plus the
  pass's own conversion time as its report gives it (:mod:`workers.timing`), and ``convert_repeats_s``,
  the wall time of the repeated conversions the conversion-time rule needs (a forked child each, its
  dispatch included: a few ms).  **Not counted**: the CLI's and the workers' imports and process starts,
  model fetch and load, checker, emulation rewrite and metrics, the conversion-time *reference workload*
  timed after each conversion sample (a drift reference, printed beside as ``not counted``), the
  bookkeeping, polling and the report.  The phases of the sweep's wall time (until its first job
  started, until its last job ended, after that) are printed too, from the jobs' stored timestamps;
* a 12-cell sweep (the smoke models, fp16 and bf16, default and conservative policies) with
  ``--workers 1`` and ``--workers 2``, alternated ``--pairs`` times (medians); target: 2 workers
  faster than 1.

Every sweep process may write and reuse bytecode (``PYTHONDONTWRITEBYTECODE`` cleared, a private
``PYTHONPYCACHEPREFIX`` under the scratch data dir, written by the warm-up sweep), as ``bench_cli.py``'s
processes do: an installed ampci runs from compiled bytecode, and where the environment forbids writing
it (as the CI machine's does) the CLI and each worker would otherwise compile the checkout's own modules
from source in every sweep.  The pass at the revision under test is never written to (its conversions
run with ``PYTHONDONTWRITEBYTECODE=1``, :func:`workers.sandbox.policy.pass_env`).

``--quick`` (seconds: a warm-up and a measured one-cell sweep, no 12-cell pairs) checks the
invariants only: the sweeps exit 0, every cell ``pass``, every result carries its timings; exit 1
when one fails.  The full run also exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

QUICK = """name = "bench1"
description = "one small cell"
models = ["conv_net"]
dtypes = ["fp16"]
policies = ["default"]
targets = ["cpu"]
repeats = 10
"""

TWELVE = """name = "bench12"
description = "12 cells: smoke models x fp16, bf16 x default, conservative"
models = ["tag:smoke"]
dtypes = ["fp16", "bf16"]
policies = ["default", "conservative"]
targets = ["cpu"]
repeats = 10
"""


def sweep(data_dir: Path, args: list[str]) -> tuple[float, dict]:
    """Wall seconds of one ``ampci sweep --json`` process and its JSON report (``report["_started"]``: the
    epoch second the process was started, to place the jobs' timestamps)."""
    env = {**os.environ, "AMPCI_DATA_DIR": str(data_dir),
           # bytecode as an installed ampci has it (see the module doc), in a private folder
           "PYTHONDONTWRITEBYTECODE": "", "PYTHONPYCACHEPREFIX": str(data_dir / "pycache")}
    env.pop("AMPCI_BROKER_URL", None)
    env.pop("AMPCI_DATABASE_URL", None)
    started = time.time()
    t0 = time.perf_counter()
    proc = subprocess.run([str(Path(sys.executable).with_name("ampci")), "sweep", "--no-baseline-run", "--json", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode not in (0, 1):  # 1: the gate found regressions; the timing still counts
        raise SystemExit(f"ampci sweep {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
    report = json.loads(proc.stdout)
    report["_started"] = started
    return wall, report


def phases(data_dir: Path, report: dict, wall: float) -> tuple[float, float, float]:
    """Seconds from the process start to its run's first job start, to its last job end, and from that
    end to the process exit (from the jobs' stored timestamps)."""
    from service.db.store import Store

    store = Store.from_url(f"sqlite:///{data_dir / 'ampci.sqlite3'}")
    try:
        jobs = store.jobs(int(report["run"]["id"]))
    finally:
        store.dispose()
    t0 = float(report["_started"])
    first = min(j.started_at.timestamp() for j in jobs if j.started_at) - t0
    last = max(j.finished_at.timestamp() for j in jobs if j.finished_at) - t0
    return first, last, wall - last


def model_work(data_dir: Path, run_id: int) -> tuple[float, list[str], float]:
    """Sum of the model work over the run's results (``exec_s``: onnxruntime and the pass's conversion,
    plus ``convert_repeats_s``: the timed repeats of the conversion, as bench_job_overhead.py counts
    it; see the module doc), the cells whose result lacks timings or failed, and the seconds of the
    conversion-time reference workload (not model work: shown beside)."""
    from service.db.store import Store

    store = Store.from_url(f"sqlite:///{data_dir / 'ampci.sqlite3'}")
    total, bad, reference = 0.0, [], 0.0
    try:
        for row in store.results(run_id=run_id):
            result = store.get_result(row.id)
            if result.status != "pass" or "exec_s" not in result.timings:
                bad.append(f"{row.model}/{row.dtype}/{row.policy}: {result.status} {result.message[:120]}")
            total += float(result.timings.get("exec_s", 0.0)) + float(result.timings.get("convert_repeats_s", 0.0))
            if result.graph is not None:
                reference += sum(result.graph.convert_reference_s)
    finally:
        store.dispose()
    return total, bad, reference


def main(argv: list[str] | None = None) -> int:
    """Print the sweep timing table; see the module docstring for the exit status."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=2, help="alternated --workers 1 / --workers 2 12-cell sweeps")
    ap.add_argument("--quick", action="store_true", help="seconds: warm-up + one smoke sweep; invariants only")
    args = ap.parse_args(argv)
    data_dir = Path(tempfile.mkdtemp(prefix="ampci-bench-sweep-"))
    try:
        return _measure(args, data_dir)
    finally:  # its SQLite database and revision worktrees
        shutil.rmtree(data_dir, ignore_errors=True)


def _measure(args: argparse.Namespace, data_dir: Path) -> int:
    """The sweeps and the table of :func:`main`, with scratch data under ``data_dir``."""
    problems: list[str] = []
    smoke = ["--sweep", "smoke"]
    if args.quick:  # one small cell instead of the smoke sweep's six
        (data_dir / "bench1.toml").write_text(QUICK)
        smoke = ["--config", str(data_dir / "bench1.toml")]
    load_before = os.getloadavg()
    sweep(data_dir, smoke)  # warm-up: fetch, references, worktree
    wall, report = sweep(data_dir, smoke)
    run_id = int(report["run"]["id"])
    work, bad, reference = model_work(data_dir, run_id)
    problems += bad
    first, last, tail = phases(data_dir, report, wall)
    what = "one-cell sweep" if args.quick else "smoke sweep"
    rows = [(f"warm {what} wall (ampci sweep, whole process)", f"{wall:.2f} s",
             f"first job started at {first:.2f} s, last ended at {last:.2f} s, exit {tail:.2f} s later"),
            ("  anchor: sum of its cells' model work", f"{work:.2f} s",
             f"{len(report['results'])} cells; onnxruntime + the pass's conversions and timed repeats"),
            ("  wall / model work", f"{wall / work:.2f}x" if work else "n/a", "target <= 2x"),
            ("  not counted: conversion-time reference workload", f"{reference:.2f} s",
             "drift reference timed after each conversion sample")]
    targets = {"smoke sweep wall <= 2x model work": bool(work) and wall <= 2 * work}
    if not args.quick:
        cfg = data_dir / "bench12.toml"
        cfg.write_text(TWELVE)
        sweep(data_dir, ["--config", str(cfg), "--workers", "2"])  # warm-up of the 12 cells
        walls: dict[int, list[float]] = {1: [], 2: []}
        for _ in range(args.pairs):
            for w in (1, 2):
                t, rep = sweep(data_dir, ["--config", str(cfg), "--workers", str(w)])
                walls[w].append(t)
                problems += model_work(data_dir, int(rep["run"]["id"]))[1]
        w1, w2 = statistics.median(walls[1]), statistics.median(walls[2])
        rows += [("12-cell sweep --workers 1 (median)", f"{w1:.2f} s", f"{args.pairs} runs: "
                  + ", ".join(f"{x:.2f}" for x in walls[1])),
                 ("12-cell sweep --workers 2 (median)", f"{w2:.2f} s", ", ".join(f"{x:.2f}" for x in walls[2])),
                 ("  workers 2 / workers 1", f"{w2 / w1:.2f}x", f"target < 1 on {os.cpu_count()} cores")]
        targets["--workers 2 faster than --workers 1 (12 cells)"] = w2 < w1
    width = max(len(r[0]) for r in rows)
    load_after = os.getloadavg()
    print(f"embedded sweep timing ({os.cpu_count()} cores; load average {load_before[0]:.2f} before, "
          f"{load_after[0]:.2f} after)")
    print(f"{'metric'.ljust(width)} | value    | note")
    print(f"{'-' * width}-|----------|{'-' * 30}")
    for name, value, note in rows:
        print(f"{name.ljust(width)} | {value.ljust(8)} | {note}")
    invariants = {"every cell pass with its timings": not problems}
    for p in problems:
        print(f"  problem: {p}")
    for name, met in {**invariants, **targets}.items():
        print(f"  {name}: {'met' if met else 'MISSED'}")
    ok = all(invariants.values()) and (args.quick or all(targets.values()))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
