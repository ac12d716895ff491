#!/usr/bin/env python3
"""Embedded-sweep timing (issue 25): what an `ampci sweep` costs beyond its models' own work.

    python bench/bench_sweep.py [--pairs 2] [--quick]

Runs ``ampci sweep`` (embedded: local pool, SQLite under a scratch data dir, this checkout's working
tree as the revision, ``--no-baseline-run``) as a whole process, as a user would, after one warm-up
sweep (model fetch, fp32 references, revision worktree).  Prints, with their anchors:

* the warm smoke sweep's wall time beside the sum of its cells' model work (of each stored result:
  ``exec_s``, onnxruntime and the pass's own conversion time, :mod:`workers.timing`, plus
  ``convert_repeats_s``, the timed repeats of the conversion); target wall <= 2x model work;
* a 12-cell sweep (the smoke models, fp16 and bf16, default and conservative policies) with
  ``--workers 1`` and ``--workers 2``, alternated ``--pairs`` times (medians); target: 2 workers
  faster than 1.

``--quick`` (seconds: a warm-up and a measured one-cell sweep, no 12-cell pairs) checks the
invariants only: the sweeps exit 0, every cell ``pass``, every result carries its timings; exit 1
when one fails.  The full run also exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import json
import os
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
    """Wall seconds of one ``ampci sweep --json`` process and its JSON report."""
    env = {**os.environ, "AMPCI_DATA_DIR": str(data_dir)}
    env.pop("AMPCI_BROKER_URL", None)
    env.pop("AMPCI_DATABASE_URL", None)
    t0 = time.perf_counter()
    proc = subprocess.run([str(Path(sys.executable).with_name("ampci")), "sweep", "--no-baseline-run", "--json", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode not in (0, 1):  # 1: the gate found regressions; the timing still counts
        raise SystemExit(f"ampci sweep {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
    return wall, json.loads(proc.stdout)


def model_work(data_dir: Path, run_id: int) -> tuple[float, list[str]]:
    """Sum of the model work over the run's results (``exec_s``: onnxruntime and the pass's conversion,
    plus ``convert_repeats_s``: the timed repeats of the conversion, as bench_job_overhead.py counts
    it), and the cells whose result lacks timings or failed."""
    from service.db.store import Store

    store = Store.from_url(f"sqlite:///{data_dir / 'ampci.sqlite3'}")
    total, bad = 0.0, []
    try:
        for row in store.results(run_id=run_id):
            result = store.get_result(row.id)
            if result.status != "pass" or "exec_s" not in result.timings:
                bad.append(f"{row.model}/{row.dtype}/{row.policy}: {result.status} {result.message[:120]}")
            total += float(result.timings.get("exec_s", 0.0)) + float(result.timings.get("convert_repeats_s", 0.0))
    finally:
        store.dispose()
    return total, bad


def main(argv: list[str] | None = None) -> int:
    """Print the sweep timing table; see the module docstring for the exit status."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=2, help="alternated --workers 1 / --workers 2 12-cell sweeps")
    ap.add_argument("--quick", action="store_true", help="seconds: warm-up + one smoke sweep; invariants only")
    args = ap.parse_args(argv)
    data_dir = Path(tempfile.mkdtemp(prefix="ampci-bench-sweep-"))
    problems: list[str] = []
    smoke = ["--sweep", "smoke"]
    if args.quick:  # one small cell instead of the smoke sweep's six
        (data_dir / "bench1.toml").write_text(QUICK)
        smoke = ["--config", str(data_dir / "bench1.toml")]
    sweep(data_dir, smoke)  # warm-up: fetch, references, worktree
    wall, report = sweep(data_dir, smoke)
    run_id = int(report["run"]["id"])
    work, bad = model_work(data_dir, run_id)
    problems += bad
    what = "one-cell sweep" if args.quick else "smoke sweep"
    rows = [(f"warm {what} wall (ampci sweep, whole process)", f"{wall:.2f} s", ""),
            ("  anchor: sum of its cells' model work", f"{work:.2f} s",
             f"{len(report['results'])} cells; onnxruntime + the pass's conversions"),
            ("  wall / model work", f"{wall / work:.2f}x" if work else "n/a", "target <= 2x")]
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
    print(f"embedded sweep timing ({os.cpu_count()} cores)")
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
