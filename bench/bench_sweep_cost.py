#!/usr/bin/env python3
"""What the pass sandbox costs a smoke sweep (issue 42, ``bars/S2-sandbox-cost``): ``ampci sweep
--no-baseline-run`` (the embedded smoke sweep of one revision, 6 cells, local pool) with ampci before the
sandbox (``--before``, default 352d2e5: the last commit before it) and with this tree, alternated in one run,
then the per-job set-up of the sandbox now, warm (zygote forked from the template) and cold (a one-shot fresh
interpreter), alternated too.

Each sweep is timed from outside: wall clock, and CPU of *every* process it starts (a cgroup v1 ``cpuacct``
group per sweep where this process may make one -- root on a cgroup-v1/hybrid host; the template's and zygotes'
children are reaped by the kernel and in no ``RUSAGE_CHILDREN``; else ``RUSAGE_CHILDREN``, marked ``~``).  Each
side has its own data directory and is warmed by one sweep first (the revision checked out, the canary
remembered).  The before tree is ``git archive``d into a temporary directory; both run on this interpreter.

Per job: the median conversion call of conv_net as a job makes it (``convert_in_subprocess``), warm (as a pool
worker converts: a zygote from the worker's fork server) and cold (a one-shot fresh interpreter), each tree in a
subprocess of its own, the trees alternated; and now, the sandbox's set-up in it: the call less the conversion
the sandbox's supervisor timed (the session's sandbox, the pass's import, the protocol; before the sandbox the
conversion was timed from the worker, so it has no such figure).

Target: the sweep now within 1.10x of before, wall (median of the rounds): exits 1 when missed (``--quick``:
one round, the target reported but not enforced; exits 1 only when a sweep fails).

    python bench/bench_sweep_cost.py [--rounds N] [--before REV | --before-tree PATH] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGET = 1.10
SWEEP = ("import sys; from service.cli.main import main; sys.exit(main())", "sweep", "--no-baseline-run")
_CPUACCT = Path("/sys/fs/cgroup/cpuacct")


def _cgroup(name: str) -> Path | None:
    """A fresh cgroup v1 cpuacct group (None: this process cannot make one)."""
    path = _CPUACCT / name
    try:
        path.mkdir()
        return path
    except OSError:
        return None


def _enter(group: Path | None):  # noqa: ANN202 - a preexec_fn
    def enter() -> None:
        if group is not None:
            (group / "cgroup.procs").write_text(str(os.getpid()))
    return enter


def sweep(tree: Path, data: Path, tag: str) -> tuple[float, float, bool]:
    """(wall s, CPU s, exact CPU?) of one smoke sweep of ``tree``; SystemExit when it fails."""
    group = _cgroup(f"ampci-bench-{os.getpid()}-{tag}")
    env = {**os.environ, "AMPCI_DATA_DIR": str(data), "AMPCI_DATABASE_URL": "", "AMPCI_BROKER_URL": ""}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", *SWEEP], cwd=tree, env=env, capture_output=True, text=True,
                          preexec_fn=_enter(group), timeout=600)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    exact = False
    if group is not None:
        try:
            cpu, exact = int((group / "cpuacct.usage").read_text()) / 1e9, True
        finally:
            for _ in range(100):  # its last processes may take a moment to be gone
                try:
                    group.rmdir()
                    break
                except OSError:
                    time.sleep(0.05)
    if proc.returncode not in (0, 1):  # 1: a regression verdict, still a complete sweep
        raise SystemExit(f"bench_sweep_cost: the sweep of {tree} exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    return wall, cpu, exact


#: Run in a tree (cwd): per-job set-up of ``rounds`` warm and cold conversions of conv_net, alternated, as a
#: pool worker converts (its fork server started first); prints {"warm": [ms...], "cold": [ms...]}.  Either
#: layout of workers/: the flat one of 352d2e5 or the floors of issue 42 (the tree's own files decide).
PER_JOB = """
import importlib, json, sys, tempfile, time
from pathlib import Path
floors = Path("workers/sandbox/zygotes.py").is_file()  # workers/ in floors (issue 42), else the flat layout
zygotes = importlib.import_module("workers.sandbox.zygotes" if floors else "workers.zygotes")
convert_in_subprocess = importlib.import_module(
    "workers.revision.convert" if floors else "workers.convert").convert_in_subprocess
from workers.zoo.synthetic import synthetic_model_path
zygotes.start_forkserver()
got = {"warm": [], "cold": [], "setup warm": [], "setup cold": []}
with tempfile.TemporaryDirectory() as d:
    tmp = Path(d)
    src, _ = synthetic_model_path("conv_net", 0, tmp / "cache")
    def one(warm):
        start = time.perf_counter()
        out = convert_in_subprocess(src, tmp / "o.onnx", tmp / "r.json", "fp16", "default", "cpu", None,
                                    timeout_s=300, memory_bytes=8 * 2**30, warm=warm)
        call = time.perf_counter() - start
        if out.status != "ok":
            sys.exit(f"conversion failed: {out.message}")
        return call * 1e3, (call - sum(out.samples_s)) * 1e3
    one(True), one(False)  # warm-up: the zygote, the first import
    for i in range(int(sys.argv[1])):
        for warm in ((True, False) if i % 2 == 0 else (False, True)):
            call, setup = one(warm)
            got["warm" if warm else "cold"].append(call)
            got["setup " + ("warm" if warm else "cold")].append(setup)
zygotes.shutdown()
zygotes.stop_forkserver()
print(json.dumps(got))
"""


def per_job_setup(sides: dict[str, Path], rounds: int) -> dict[str, dict[str, float]]:
    """Median per-job set-up (ms: the conversion call minus the conversion it timed), warm and cold, of each
    side's tree (``sides``), the trees alternated (two passes of ``rounds`` each)."""
    got: dict[str, dict[str, list[float]]] = {name: {} for name in sides}
    for i in range(2):
        for name in (list(sides) if i % 2 == 0 else list(reversed(sides))):
            proc = subprocess.run([sys.executable, "-c", PER_JOB, str(rounds)], cwd=sides[name],
                                  capture_output=True, text=True, timeout=600,
                                  env={**os.environ, "PYTHONPATH": str(sides[name])})
            if proc.returncode != 0:
                raise SystemExit(f"bench_sweep_cost: per-job set-up of {name} failed:\n{proc.stderr[-2000:]}")
            for path, values in json.loads(proc.stdout.strip().splitlines()[-1]).items():
                got[name].setdefault(path, []).extend(values)
    return {name: {k: statistics.median(v) for k, v in paths.items()} for name, paths in got.items()}


def _before_tree(rev: str, into: Path) -> Path | None:
    """``rev``'s tree, ``git archive``d under ``into``; None where this clone lacks it (a shallow CI clone)."""
    tree = into / f"ampci-{rev}"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], capture_output=True)
    if archive.returncode != 0:
        return None
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    return tree


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="alternated sweeps of each side (default 5)")
    parser.add_argument("--before", default="352d2e5", help="the revision before the sandbox (default 352d2e5)")
    parser.add_argument("--before-tree", help="an existing checkout of the revision before the sandbox")
    parser.add_argument("--quick", action="store_true", help="one round, target not enforced: seconds")
    args = parser.parse_args()
    rounds = 1 if args.quick else max(1, args.rounds)
    with tempfile.TemporaryDirectory(prefix="bench-sweep-cost-") as d:
        tmp = Path(d)
        before = Path(args.before_tree) if args.before_tree else _before_tree(args.before, tmp)
        if before is None:
            print(f"bench_sweep_cost: {args.before} is not in this clone (a shallow one?): give --before-tree",
                  file=sys.stderr)
            if not args.quick:
                return 2
            sweep(ROOT, tmp / "data-now", "only-now")  # quick: this tree's sweep still has to work
            return 0
        sides = {"before": before, "now": ROOT}
        data = {name: tmp / f"data-{name}" for name in sides}
        for name, tree in sides.items():  # warm-up: the revision's checkout, the zoo, the canary remembered
            sweep(tree, data[name], f"warm-{name}")
        walls: dict[str, list[float]] = {name: [] for name in sides}
        cpus: dict[str, list[float]] = {name: [] for name in sides}
        exact = True
        for i in range(rounds):
            for name in (("now", "before") if i % 2 == 0 else ("before", "now")):
                wall, cpu, ok = sweep(sides[name], data[name], f"{name}-{i}")
                walls[name].append(wall)
                cpus[name].append(cpu)
                exact = exact and ok
        setup = per_job_setup(sides, 1 if args.quick else 4)
    load = os.getloadavg()
    wall = {k: statistics.median(v) for k, v in walls.items()}
    cpu = {k: statistics.median(v) for k, v in cpus.items()}
    ratio, cpu_ratio = wall["now"] / wall["before"], cpu["now"] / cpu["before"]
    mark = "" if exact else "~"
    print(f"smoke sweep of one revision, {rounds} alternated round(s), load {load[0]:.1f}/{load[1]:.1f} "
          f"(medians; CPU of every process{'' if exact else ', ~ RUSAGE_CHILDREN only'})")
    print(f"{'':<24} {'before (' + args.before + ')':>18} {'now':>10} {'ratio':>7}")
    print(f"{'wall s':<24} {wall['before']:>18.2f} {wall['now']:>10.2f} {ratio:>6.2f}x")
    print(f"{'CPU s':<24} {mark}{cpu['before']:>17.2f} {mark}{cpu['now']:>9.2f} {cpu_ratio:>6.2f}x")
    print(f"{'wall s, each round':<24} {' / '.join(f'{w:.2f}' for w in walls['before']):>18} "
          f"{' / '.join(f'{w:.2f}' for w in walls['now']):>10}")
    print(f"{'CPU s, each round':<24} {' / '.join(f'{c:.2f}' for c in cpus['before']):>18} "
          f"{' / '.join(f'{c:.2f}' for c in cpus['now']):>10}")
    for path in ("warm", "cold"):
        b, n = setup["before"][path], setup["now"][path]
        print(f"{'job conversion ' + path + ' ms':<24} {b:>18.1f} {n:>10.1f} {n / b:>6.2f}x")
    print(f"{'sandbox set-up in it ms':<24} {'-':>18} {setup['now']['setup warm']:>10.1f}   (warm; "
          f"cold {setup['now']['setup cold']:.1f}: the call less the conversion the supervisor timed)")
    met = ratio <= TARGET
    print(f"target: now within {TARGET:.2f}x of before (wall): {ratio:.2f}x, {'met' if met else 'MISSED'}")
    return 0 if met or args.quick else 1


if __name__ == "__main__":
    sys.exit(main())
