"""How much of one job is spent outside model execution (target: under 10% for the real models).

Runs ``run_job`` on each model (default: the zoo's ``real`` tag) and prints, per model, the job's
total time, the time inside model execution (onnxruntime session creation, runs and release, plus the
pass's own conversion time as it reports it), and the rest: conversion-subprocess start, cache fetch,
loading, checker, emulation rewrite, metrics and bookkeeping (see workers/timing.py).  The first job per model warms the caches (model fetch, fp32
reference) and is reported separately as ``cold``; the table's ``warm`` rows are what a worker
running a sweep sees.

    python bench/bench_job_overhead.py [--models a,b] [--dtype fp16] [--repeats 1] [--pass-root DIR]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service.settings import Settings  # noqa: E402
from workers.job import JobSpec, run_job  # noqa: E402
from workers.zoo.manifest import load_zoo  # noqa: E402


def _snapshot_pass() -> Path:
    """A frozen copy of this checkout's amp_pass, like the revision worktree a real worker converts with
    (so concurrent edits in the working tree do not restart the conversion zygote mid-benchmark)."""
    root = Path(tempfile.mkdtemp(prefix="ampci-bench-pass-"))
    shutil.copytree(Path(__file__).resolve().parents[1] / "amp_pass", root / "amp_pass",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return root


def main(argv: list[str] | None = None) -> int:
    """Print the overhead table; exit 1 if any warm job's overhead fraction is 10% or more."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="", help="comma-separated zoo names (default: tag 'real')")
    p.add_argument("--dtype", default="fp16")
    p.add_argument("--policy", default="default")
    p.add_argument("--repeats", type=int, default=1, help="warm jobs per model")
    p.add_argument("--pass-root", type=Path, default=None,
                   help="pass root to convert with (default: a frozen copy of this checkout's amp_pass)")
    p.add_argument("--verbose", action="store_true", help="print every timing of every job")
    args = p.parse_args(argv)
    settings = Settings.from_env()
    pass_root = args.pass_root or _snapshot_pass()
    names = [n for n in args.models.split(",") if n] or [e.name for e in load_zoo().select(tag="real")]
    header = (f"{'model':<18} {'run':<5} {'status':<14} {'total s':>8} {'exec s':>8} {'outside s':>9} "
              f"{'outside':>8}  {'subproc':>7} {'fetch':>6} {'load':>6} {'other':>6}")
    print(f"job overhead ({args.dtype}, policy {args.policy}, target cpu, {settings.latency_runs} latency runs)")
    print(header)
    print("-" * len(header))
    worst = 0.0
    for name in names:
        for i in range(1 + args.repeats):
            r = run_job(JobSpec(model=name, dtype=args.dtype, policy=args.policy, pass_root=pass_root), settings.worker_config())
            t = r.timings
            subproc = max(0.0, t.get("convert_subprocess_s", 0.0) - (r.graph.convert_seconds if r.graph else 0.0))
            fetch, load = t.get("fetch_s", 0.0), t.get("load_s", 0.0)
            other = max(0.0, t.get("overhead_s", 0.0) - subproc - fetch - load)
            kind = "cold" if i == 0 else "warm"
            if kind == "warm":
                worst = max(worst, t.get("overhead_fraction", 0.0))
            print(f"{name:<18} {kind:<5} {r.status:<14} {t.get('total_s', 0):8.2f} {t.get('exec_s', 0):8.2f} "
                  f"{t.get('overhead_s', 0):9.2f} {t.get('overhead_fraction', 0):8.1%}  {subproc:7.2f} "
                  f"{fetch:6.2f} {load:6.2f} {other:6.2f}")
            if r.status != "pass":
                print(f"    {r.message[:300]}")
            if args.verbose:
                print("    " + ", ".join(f"{k}={v:.3f}" for k, v in sorted(t.items())))
    print(f"worst warm overhead fraction: {worst:.1%} (target < 10%)")
    return 0 if worst < 0.10 else 1


if __name__ == "__main__":
    sys.exit(main())
