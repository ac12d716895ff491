"""How much of one job is spent outside model work (issue 25 target: at most 15% on the real models).

Runs ``run_job`` on each model (default: the zoo's ``real`` tag) and prints, per model, the job's
total time, its model work and the rest.  Model work is the anchor: time inside onnxruntime (session
creation, runs and release) plus the pass's conversions of the model: the first as the pass reports
it, the timed repeats the job asks for (``AMPCI_CONVERT_REPEATS``, for the conversion-time rule) at
the wall time the worker measured for each.  Everything else is outside: forking the conversion
child, cache fetch, loading, checker, emulation rewrite, metrics, the conversion-time reference
workloads (see workers/timing.py).  The first job per model warms the caches (model fetch, fp32
reference, the worker's fork server and the revision's zygote) and is reported as ``cold``; the
``warm`` rows are what a worker running a sweep sees, and the target applies to them.

    python bench/bench_job_overhead.py [--models a,b] [--dtype fp16] [--repeats 1] [--pass-root DIR] [--quick]

``--quick`` (seconds: the synthetic smoke models, one warm job each) checks the invariants only:
every job ``pass`` with its timings, model work > 0, outside share within [0, 1); exit 1 when one
fails.  The full run also exits 1 when the target is missed.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service.settings import Settings  # noqa: E402
from workers.jobs.job import run_job  # noqa: E402
from workers.jobs.spec import JobSpec  # noqa: E402
from workers.zoo.manifest import load_zoo  # noqa: E402


def _snapshot_pass() -> Path:
    """A frozen copy of this checkout's amp_pass, like the revision worktree a real worker converts with
    (so concurrent edits in the working tree do not restart the conversion zygote mid-benchmark)."""
    root = Path(tempfile.mkdtemp(prefix="ampci-bench-pass-"))
    root.chmod(0o755)  # mkdtemp's 0700 would hide it from the sandboxed pass (another uid)
    shutil.copytree(Path(__file__).resolve().parents[1] / "amp_pass", root / "amp_pass",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return root


def model_work(t: dict[str, float]) -> float:
    """The anchor: onnxruntime time and the pass's own conversion (``exec_s``) plus the timed repeats
    of the conversion (``convert_repeats_s``)."""
    return t.get("exec_s", 0.0) + t.get("convert_repeats_s", 0.0)


def main(argv: list[str] | None = None) -> int:
    """Print the overhead table; see the module docstring for the exit status."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="", help="comma-separated zoo names (default: tag 'real')")
    p.add_argument("--dtype", default="fp16")
    p.add_argument("--policy", default="default")
    p.add_argument("--repeats", type=int, default=1, help="warm jobs per model")
    p.add_argument("--pass-root", type=Path, default=None,
                   help="pass root to convert with (default: a frozen copy of this checkout's amp_pass)")
    p.add_argument("--verbose", action="store_true", help="print every timing of every job")
    p.add_argument("--quick", action="store_true", help="seconds: smoke models, invariants only")
    args = p.parse_args(argv)
    settings = Settings.from_env()
    from workers.sandbox.zygotes import start_forkserver

    start_forkserver()  # as a pool worker does at start: the revision's zygote is forked, not a fresh interpreter
    pass_root = args.pass_root or _snapshot_pass()
    tag = "smoke" if args.quick else "real"
    names = [n for n in args.models.split(",") if n] or [e.name for e in load_zoo().select(tag=tag)]
    header = (f"{'model':<18} {'run':<5} {'status':<8} {'total s':>8} {'model s':>8} {'outside s':>9} "
              f"{'outside':>8}  {'ort+pass':>8} {'conv rep':>8} {'fetch':>6} {'load':>6} {'other':>6}")
    print(f"job overhead ({args.dtype}, policy {args.policy}, target cpu, {settings.latency_runs} latency runs, "
          f"{settings.convert_repeats} timed conversions)")
    print(header)
    print("-" * len(header))
    worst, problems = 0.0, []
    for name in names:
        for i in range(1 + args.repeats):
            r = run_job(JobSpec(model=name, dtype=args.dtype, policy=args.policy, pass_root=pass_root),
                        settings.worker_config())
            t = r.timings
            total, work = t.get("total_s", 0.0), model_work(t)
            outside = max(0.0, total - work)
            share = outside / total if total > 0 else 1.0
            fetch, load = t.get("fetch_s", 0.0), t.get("load_s", 0.0)
            kind = "cold" if i == 0 else "warm"
            if kind == "warm":
                worst = max(worst, share)
            if r.status != "pass" or "exec_s" not in t or work <= 0 or not 0 <= share < 1:
                problems.append(f"{name} {kind}: {r.status} {r.message[:200]}")
            print(f"{name:<18} {kind:<5} {r.status:<8} {total:8.2f} {work:8.2f} {outside:9.2f} {share:8.1%}  "
                  f"{t.get('exec_s', 0.0):8.2f} {t.get('convert_repeats_s', 0.0):8.2f} {fetch:6.2f} {load:6.2f} "
                  f"{max(0.0, outside - fetch - load):6.2f}")
            if r.status != "pass":
                print(f"    {r.message[:300]}")
            if args.verbose:
                print("    " + ", ".join(f"{k}={v:.3f}" for k, v in sorted(t.items())))
    met = worst <= 0.15
    print(f"worst warm share outside model work: {worst:.1%} (target <= 15% on the real models; "
          f"{'met' if met else 'MISSED'}{', smoke models: not the target' if args.quick else ''})")
    for problem in problems:
        print(f"  problem: {problem}")
    return 0 if not problems and (args.quick or met) else 1


if __name__ == "__main__":
    sys.exit(main())
