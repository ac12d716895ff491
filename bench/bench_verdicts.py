#!/usr/bin/env python3
"""Can the gate be fooled, on a quiet or a busy machine?  Sweeps a scratch git history of the pass with injected
bugs and noise commits.

    python bench/bench_verdicts.py [--aa 10] [--bisect-commits 8 | --no-bisect] [--keep DIR] [--json]
                                   [--load [N] --load-kind jobs|cpu --load-mode alternate|steady]
                                   [--confirm-pairs P] [--creep N --creep-ms MS --creep-latency X]
                                   [--creep-only] [--quick] [--infra-faults]

What it does, all in embedded mode (local pool, SQLite, a fresh data and cache directory):

1. **History.**  A scratch repository holds a copy of this checkout's ``amp_pass/``.  On top of its first
   commit come, in order, noise commits (a comment changes: byte-identical output models) and one commit per
   bug class, each bug a small source edit (:data:`BUGS`): a DENY entry moved to INFER, painting that skips
   If/Loop/Scan bodies, the overflow range check switched off, casts no longer shared, a bf16-only weight
   rounding bug, a 0.6 s conversion slowdown, a **20 % latency slowdown of a model that runs >= 1 ms**
   (light_squeezenet fp16: its output routed through no-op Loop steps, as many as add 20 %, calibrated here
   before any load), and converted models that do redundant work on every inference.  Bugs are cumulative.
2. **Sweeps.**  Every commit is swept against its parent with ``ampci sweep --config <bench sweep>``; a bug
   counts as *detected* when its commit's run has an open (confirmed) regression on an expected cell and kind;
   any open regression on a noise commit is a *false alarm*.  Timing regressions are suspected first and
   confirmed or dismissed by a confirmation run (``AMPCI_CONFIRM_PAIRS``); the table counts those runs and
   their job-seconds.
3. **Bisection.**  A branch off the first commit holds ``--bisect-commits`` commits with one bug in the
   middle; only its tip is swept (against the first commit), then ``ampci bisect --run ID`` must name the
   bug commit after at most ceil(log2(n)) midpoint sweeps.
4. **Creep.**  A branch off the first commit holds ``--creep N`` commits, each making three metrics a step
   worse, each on its own cells (``bench/_creep.py``): **conversion time** +``--creep-ms`` (20 ms: below the
   rule's +0.1 s floor) of computing (``--creep-wait``: of sleeping) on every model but the two below; the **latency** of the fp16 ``light_squeezenet`` by
   no-op Loop steps calibrated to x``--creep-latency`` (1.5) over the N commits (+6 % a step at N = 8, against
   the rule's x1.10); the **accuracy** of the fp16 ``conv_net`` by a constant added to its output, 0.35 x the
   larger of the base's own error and the rule's floor (three steps pass x2 and the floor, none alone).  Then
   two noise commits; every commit is swept against its parent.  A series counts as *detected* at the first
   creep commit whose run has an open (confirmed) ``drift`` finding of its metric on one of its cells (or a
   parent-comparison finding of its kind); the table says at which commit and against which reference (the
   window's start or a pinned baseline).  Any finding on the noise commits after it, or on a cell no series
   moves, is a false alarm (the same change is reported once), except the first report of a series cell's
   drift on the noise commit after the creep: that is the creep reported late (a push reports any drift over
   the limits no finding reports yet), counted apart.  Last, the tip is swept as a ``nightly`` run
   (which reports any drift over the limit across the day's commits not reported yet, as a push does).
5. **A/A.**  The first commit is swept ``--aa`` more times against itself; every timing comparison (latency and
   conversion time, per cell) counted; every open finding, and every confirmed improvement, is a false alarm.
6. **Infrastructure faults** (``--infra-faults``, alone): the deterministic bugs' history swept with ampci's own
   failures (sandbox import failure, missing device, lost worker) stored around every sweep
   (:mod:`_infra_faults`): real regressions still detected, flaky misclassifications (0), green runs with nothing
   measured (0).

Improvements on noise commits are read from the database: a *confirmed* one (state ``open``, shown as a gain)
is a false improvement; suspected and dismissed ones are counted apart (never shown as gains).
``--creep-only`` skips the bug history and the bisection (the base, the creep series, the A/A runs), and bugs
whose models are not in ``--models`` are left out: how the per-load runs of docs/benchmarks.md are sized.

**Load** (``--load N``, default N = 2 x cores): ``jobs`` processes each loop starting a Python that imports
onnx, onnxruntime and numpy, then writing and fsyncing a 32 MB file (what CI jobs do); ``cpu`` busy loops.
``alternate`` switches it on for every other revision (and every other A/A run), so each revision is judged
against a parent measured under the other condition; ``steady`` keeps it on throughout.

Prints one table; targets: 100% detected, every creep series detected, 0 false alarms and 0 false improvements
on noise commits, A/A <= 1%, bisection within ceil(log2(n)); exits 1 when one is missed.  ``--quick`` (seconds; a test runs it): one model, the conversion slowdown between two noise
commits, a creep of 2 x 70 ms and one noise commit, one A/A run, no bisection; it also requires that the slowdown
was confirmed by a confirmation run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from _creep import ACCURACY_CELL, CreepPlan, accuracy_step, creep_lines, creep_source, score  # noqa: E402
from _injected_bugs import REDUNDANT_LOOP_FN  # noqa: E402 - shared with tests/workers/jobs/test_confirm_job.py

AMPCI = str(Path(sys.executable).with_name("ampci"))

#: The sweep every commit gets: small synthetic models that the bugs below reach (see workers/zoo).
SWEEP = """\
name = "verdicts"
description = "bench_verdicts: synthetic models reached by the injected bugs"
models = {models}
dtypes = ["fp16", "bf16"]
policies = ["default"]
targets = ["cpu"]
repeats = {repeats}
"""
MODELS = ["conv_net", "transformer_block", "loop_if", "deny_exp", "range_big_const", "cast_share", "light_squeezenet"]
#: The model of the 20 % latency bug: one that runs >= 1 ms (its converted fp16 model ~10 ms on one thread), and
#: the name of its graph, which the injected code checks so that it slows this model only.
SLOW_MODEL, SLOW_GRAPH = "light_squeezenet", "squeezenet_old"
#: Timing kinds (service.regressions.rules.TIMING_KINDS): their findings are the A/A false alarms.
TIMING = ("latency", "conversion_time")


@dataclass(frozen=True)
class Bug:
    """One injected bug: a source edit and the findings that must follow from it."""

    name: str
    edits: tuple[tuple[str, str, str], ...]          # (file under amp_pass/, exact old text (once), new text)
    expect: tuple[tuple[str, str | None, str], ...]  # (model, dtype or None for any, kind); any one suffices
    append: tuple[tuple[str, str], ...] = ()         # (file under amp_pass/, text appended)


LATENCY_FN = REDUNDANT_LOOP_FN  # _redundant_work(model): its first output through a 400-step no-op Loop

FIFTH_FN = '''

_convert_model_unslowed = convert_model


def convert_model(model: onnx.ModelProto, options: ConversionOptions | None = None) -> ConversionResult:
    """BUG(latency 20%): the converted {graph} routes its first output through {trips} no-op Loop steps."""
    result = _convert_model_unslowed(model, options)
    if model.graph.name != {graph!r} or any(i.name == "slow_trip" for i in result.model.graph.initializer):
        return result  # another model, or already routed through the later bug's Loop
    m = _redundant_work(result.model)
    for init in m.graph.initializer:
        if init.name == "slow_trip":
            init.int64_data[:] = [{trips}]
    return ConversionResult(model=m, report=result.report)
'''


def fifth_bug(trips: int) -> Bug:
    """A 20 % latency slowdown of :data:`SLOW_MODEL` (``trips`` calibrated by :func:`calibrate_fifth`)."""
    return Bug("model latency +20% (a >= 1 ms model)", (),
               ((SLOW_MODEL, "fp16", "latency"),),
               append=(("converter.py", LATENCY_FN), ("converter.py", FIFTH_FN.format(graph=SLOW_GRAPH, trips=trips))))


def calibrate_fifth(cache_dir: Path, data_dir: Path, runs: int = 40) -> tuple[int, float, float]:
    """``(trips, converted_ms, ms_per_trip)``: how many no-op Loop steps add 20 % to the converted fp16
    :data:`SLOW_MODEL` on one onnxruntime thread, measured here before any load, in CPU time of the calling
    thread (the work the latency rule compares; wall time on this shared machine put 16.9 ms on an 8 ms model
    and made the injected bug +12-15 % of work instead of +20 %)."""
    import statistics as st

    import numpy as np
    import onnx
    import onnxruntime as ort

    sys.path.insert(0, str(ROOT))
    from amp_pass.converter import ConversionOptions, convert_model
    from workers.zoo.fetch import fetch_entry
    from workers.zoo.inputs import make_feeds
    from workers.zoo.manifest import load_zoo

    entry = load_zoo(None, data_dir).get(SLOW_MODEL)
    model = onnx.load(str(fetch_entry(entry, cache_dir).path))
    converted = convert_model(model, ConversionOptions(dtype="fp16")).model
    scope: dict[str, Any] = {"onnx": onnx}
    exec(compile(LATENCY_FN, "LATENCY_FN", "exec"), scope)  # noqa: S102 - the bench's own bug code
    probe_trips = 2000
    probe = scope["_redundant_work"](converted)
    for init in probe.graph.initializer:
        if init.name == "slow_trip":
            init.int64_data[:] = [probe_trips]
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sessions = [ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
                for m in (converted, probe)]
    feeds = make_feeds(entry, entry.seed)
    fed = [{i.name: feeds[i.name].astype(np.float16) if i.type == "tensor(float16)" else feeds[i.name]
            for i in sess.get_inputs()} for sess in sessions]
    times: list[list[float]] = [[], []]
    for k in range(runs + 3):
        for i, sess in enumerate(sessions):
            t0 = time.thread_time()
            sess.run(None, fed[i])
            if k >= 3:
                times[i].append((time.thread_time() - t0) * 1000)
    t0_ms, t1_ms = st.median(times[0]), st.median(times[1])
    per = max(1e-6, (t1_ms - t0_ms) / probe_trips)
    return max(1, round(0.2 * t0_ms / per)), t0_ms, per


# -- load ---------------------------------------------------------------------------------------------
JOB_LOAD = """\
import os, subprocess, sys, tempfile
blob = os.urandom(32 * 2**20)
while True:
    subprocess.run([sys.executable, "-c", "import onnx, onnxruntime, numpy"], check=False)
    with tempfile.NamedTemporaryFile(dir=sys.argv[1], delete=True) as fh:
        fh.write(blob)
        fh.flush()
        os.fsync(fh.fileno())
"""
CPU_LOAD = "while True:\n    pass\n"


class Load:
    """``n`` background processes of one kind (``jobs``: each loops starting a Python that imports onnx,
    onnxruntime and numpy, then writing and fsyncing a 32 MB file; ``cpu``: busy loops), started and stopped
    by pid (each in its own process group)."""

    def __init__(self, n: int, kind: str, scratch: Path) -> None:
        self.n, self.kind, self.scratch = n, kind, scratch
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def on(self) -> bool:
        return bool(self.procs)

    def start(self) -> None:
        if self.procs or self.n <= 0:
            return
        self.scratch.mkdir(parents=True, exist_ok=True)
        code = JOB_LOAD if self.kind == "jobs" else CPU_LOAD
        for _ in range(self.n):
            self.procs.append(subprocess.Popen([sys.executable, "-c", code, str(self.scratch)],
                                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                               start_new_session=True))
        time.sleep(1.0)  # let it build up

    def stop(self) -> None:
        import signal

        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
        self.procs.clear()

    def set(self, on: bool) -> None:
        self.start() if on else self.stop()


BUGS: tuple[Bug, ...] = (
    Bug("policy entry (Exp deny -> infer)",
        (("policies/ops.toml", 'deny = [\n    "Exp", ', 'deny = [\n    '),
         ("policies/ops.toml", 'infer = [\n    "Add", ', 'infer = [\n    "Exp", "Add", ')),
        (("deny_exp", None, "accuracy"),)),
    Bug("subgraph painting skipped",
        (("paint.py", "self._nodes = list(iter_nodes(graph))", "self._nodes = list(graph)"),),
        (("loop_if", None, "coverage"),)),
    Bug("range check off (overflow)",
        (("ranges.py", "if peak > float(info.max):", "if peak > float(info.max) * 1e6:"),),
        (("range_big_const", "fp16", "accuracy"),)),
    Bug("casts not shared",
        (("casts.py", "        key = (value, dtype, scope)\n        if key in self.cache:\n            return self.cache[key]\n",
          "        key = (value, dtype, scope, len(self.cache))\n"),),
        (("cast_share", None, "coverage"), ("transformer_block", None, "coverage"))),
    Bug("bf16-only weight rounding",  # bf16 constants rounded through fp16 first: beyond 65504 they become inf
        (("ranges.py", "    converted = array.astype(NUMPY_DTYPE[low])\n",
          "    converted = (array.astype(np.float16) if low == ir.DataType.BFLOAT16 else array)"
          ".astype(NUMPY_DTYPE[low])\n"),
         ("ranges.py", "        converted = flat.astype(NUMPY_DTYPE[low])\n",
          "        converted = (flat.astype(np.float16) if low == ir.DataType.BFLOAT16 else flat)"
          ".astype(NUMPY_DTYPE[low])\n")),
        (("range_big_const", "bf16", "accuracy"),)),
    Bug("conversion slowdown (+0.6 s)",
        (("converter.py", "def convert_model(model: onnx.ModelProto, options: ConversionOptions | None = None) "
          "-> ConversionResult:\n", "def convert_model(model: onnx.ModelProto, options: ConversionOptions | None "
          "= None) -> ConversionResult:\n    time.sleep(0.6)  # BUG(slowdown)\n"),),
        (("conv_net", None, "conversion_time"), ("transformer_block", None, "conversion_time"))),
    Bug("model latency (+400-step no-op Loop)",
        (("converter.py", "    return ConversionResult(model=out, report=report)",
          "    return ConversionResult(model=_redundant_work(out), report=report)  # BUG(latency)"),),
        (("conv_net", None, "latency"), ("transformer_block", None, "latency")),
        append=(("converter.py", LATENCY_FN),)),
)


def creep(repo: Path, k: int, plan: CreepPlan) -> str:
    """Creep commit ``k`` (1-based): each series of ``plan`` one step further (see ``bench/_creep.py``)."""
    path = repo / "amp_pass" / "converter.py"
    text = path.read_text()
    if k == 1:
        text += creep_source(plan, LATENCY_FN)
    path.write_text(text + creep_lines(plan, k))
    return commit(repo, f"creep {k}: {', '.join(plan.kinds)} one step worse")


# -- plumbing ---------------------------------------------------------------------------------------
def git(repo: Path, *args: str) -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="bench", GIT_AUTHOR_EMAIL="bench@localhost",
               GIT_COMMITTER_NAME="bench", GIT_COMMITTER_EMAIL="bench@localhost")
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


def commit(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def edit(repo: Path, rel: str, old: str, new: str) -> None:
    path = repo / "amp_pass" / rel
    text = path.read_text()
    if text.count(old) != 1:
        raise SystemExit(f"bench_verdicts: the edit for {rel} no longer applies ({text.count(old)} matches of "
                         f"{old[:60]!r}); update BUGS")
    path.write_text(text.replace(old, new))


def noise(repo: Path, i: int) -> str:
    path = repo / "amp_pass" / "__init__.py"
    path.write_text(path.read_text() + f"# noise commit {i}: comments only\n")
    return commit(repo, f"noise {i}")


def inject(repo: Path, bug: Bug) -> str:
    for rel, old, new in bug.edits:
        edit(repo, rel, old, new)
    for rel, text in bug.append:
        path = repo / "amp_pass" / rel
        path.write_text(path.read_text() + text)
    return commit(repo, f"BUG: {bug.name}")


@dataclass
class Ctx:
    repo: Path
    env: dict[str, str]
    sweep: Path
    sweeps: int = 0
    seconds: float = 0.0
    log: list[str] = field(default_factory=list)
    loadavg: list[float] = field(default_factory=list)  # the machine's 1-minute load average after each sweep

    def ampci(self, *args: str, ok: tuple[int, ...] = (0, 1)) -> tuple[int, Any]:
        t0 = time.perf_counter()
        proc = subprocess.run([AMPCI, *args], env=self.env, capture_output=True, text=True, timeout=3600)
        self.seconds += time.perf_counter() - t0
        if proc.returncode not in ok:
            raise SystemExit(f"bench_verdicts: ampci {' '.join(args)} exited {proc.returncode}: "
                             f"{proc.stderr.strip().splitlines()[-1:] or proc.stdout[-300:]}")
        self.log.append(proc.stderr)
        try:
            return proc.returncode, json.loads(proc.stdout)
        except json.JSONDecodeError:
            return proc.returncode, proc.stdout

    def sweep_at(self, sha: str, baseline: str, *extra: str) -> dict[str, Any]:
        self.sweeps += 1
        _, payload = self.ampci("sweep", "--config", str(self.sweep), "--revision", sha, "--baseline", baseline,
                                "--json", *extra)
        self.loadavg.append(os.getloadavg()[0])
        return payload


def drifts(payload: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(model, dtype, metric, reference revision) of each open drift finding of a sweep."""
    return [(r["model"], r["dtype"], r["metric"], (r.get("baseline_sha") or "")[:10])
            for r in payload.get("regressions", []) if r["kind"] == "drift"]


def findings(payload: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [(r["model"], r["dtype"], r["kind"]) for r in payload.get("regressions", [])]


def matches(found: list[tuple[str, str, str]], bug: Bug) -> bool:
    return any(m == em and (ed is None or d == ed) and k == ek for m, d, k in found for em, ed, ek in bug.expect)


def timing_comparisons(payload: dict[str, Any]) -> int:
    """Cell comparisons a timing rule made in a sweep: a latency one per result timed, a conversion-time one
    per result with conversion samples."""
    return sum((r.get("latency_p50_ms") is not None) + (r.get("convert_s") is not None)
               for r in payload.get("results", []))


def confirmation_figures(db: Path) -> dict[str, dict[int, Any]]:
    """From the bench's SQLite database: per run, the confirmation run's cells and job-seconds, and the
    findings confirmation decided, and every improvement (model, dtype, kind, state) by run."""
    import sqlite3

    out: dict[str, dict[int, Any]] = {"cost": {}, "decided": {}, "improvements": {}}
    con = sqlite3.connect(str(db))
    try:
        for _run_id, meta, data in con.execute(
                "select r.id, r.meta, s.data from runs r join results s on s.run_id = r.id where r.trigger = 'confirm'"):
            parent = json.loads(meta).get("confirms")
            seconds = float((json.loads(data).get("timings") or {}).get("total_s") or 0.0)
            cells, total = out["cost"].get(parent, (0, 0.0))
            out["cost"][parent] = (cells + 1, total + seconds)
        for run_id, kind, model, dtype, state in con.execute(
                "select run_id, kind, model, dtype, state from regressions where state_by = 'ampci-confirm'"):
            out["decided"].setdefault(run_id, []).append((model, dtype, kind, state))
        for run_id, kind, model, dtype, state in con.execute(
                "select run_id, kind, model, dtype, state from regressions where category = 'improvement'"):
            out["improvements"].setdefault(run_id, []).append((model, dtype, kind, state))
    finally:
        con.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--aa", type=int, default=10, help="A/A re-runs of the first commit (default 10)")
    ap.add_argument("--bisect-commits", type=int, default=8, help="commits on the bisection branch (default 8)")
    ap.add_argument("--no-bisect", action="store_true", help="skip the bisection")
    ap.add_argument("--creep-only", action="store_true",
                    help="no injected-bug history or bisection: the base, the creep series and the A/A runs")
    ap.add_argument("--noise", type=int, default=1, help="noise commits before each bug (default 1)")
    ap.add_argument("--repeats", type=int, default=20, help="latency runs per job (default 20)")
    ap.add_argument("--models", nargs="*", default=MODELS, help="zoo models swept")
    ap.add_argument("--load", type=int, nargs="?", const=-1, default=0, metavar="N",
                    help="N background load processes while sweeping (no N: 2 x cores; default none)")
    ap.add_argument("--load-kind", choices=("jobs", "cpu"), default="jobs",
                    help="jobs: each loops starting a Python importing onnx/onnxruntime/numpy and writing and "
                         "fsyncing a 32 MB file; cpu: busy loops (default jobs)")
    ap.add_argument("--load-mode", choices=("alternate", "steady"), default="alternate",
                    help="alternate: on for every other revision (each judged against a parent measured under "
                         "the other condition); steady: always on (default alternate)")
    ap.add_argument("--confirm-pairs", type=int, default=None, help="AMPCI_CONFIRM_PAIRS of the sweeps (default: "
                    "the setting's)")
    ap.add_argument("--creep", type=int, default=8, help="creep commits (default 8; 0: no creep series)")
    ap.add_argument("--creep-ms", type=float, default=20.0, help="conversion time added by each (default 20 ms)")
    ap.add_argument("--creep-wait", action="store_true",
                    help="the conversion creep sleeps (wall time only) instead of computing (CPU time)")
    ap.add_argument("--creep-latency", type=float, default=1.5,
                    help="the latency creep's whole size (default x1.5 over the --creep commits)")
    ap.add_argument("--quick", action="store_true",
                    help="seconds, tiny: one model, the conversion slowdown, one noise commit, one A/A run, no "
                         "bisection; exits 1 when an invariant fails")
    ap.add_argument("--infra-faults", action="store_true",
                    help="only the infrastructure-fault series (bench/_infra_faults.py): the deterministic bugs' "
                         "history with ampci's own failures stored around every sweep")
    ap.add_argument("--keep", type=Path, default=None, help="work in DIR and keep it")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.infra_faults and args.models == MODELS:  # the deterministic bugs' models only
        args.models, args.repeats = ["deny_exp", "loop_if", "range_big_const"], 6
    if args.quick:
        args.models, args.aa, args.noise, args.no_bisect, args.repeats = ["conv_net"], 1, 1, True, 8
        args.creep, args.creep_ms = 2, 70.0
    n_load = (2 * (os.cpu_count() or 1)) if args.load == -1 else max(0, args.load)

    work = args.keep or Path(tempfile.mkdtemp(prefix="ampci-verdicts-"))
    work.mkdir(parents=True, exist_ok=True)
    repo = work / "repo"
    shutil.rmtree(repo, ignore_errors=True)
    shutil.copytree(ROOT / "amp_pass", repo / "amp_pass", ignore=shutil.ignore_patterns("__pycache__"))
    git(work, "init", "-q", "-b", "main", str(repo))
    base = commit(repo, "base: this checkout's amp_pass")
    sweep = work / "verdicts.toml"
    sweep.write_text(SWEEP.format(models=json.dumps(args.models), repeats=args.repeats))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMPCI_")}
    env.update(AMPCI_PASS_REPO=str(repo), AMPCI_DATA_DIR=str(work / "data"), AMPCI_CACHE_DIR=str(work / "cache"),
               PYTHONPATH=str(ROOT))
    if args.confirm_pairs is not None:
        env["AMPCI_CONFIRM_PAIRS"] = str(args.confirm_pairs)
    ctx = Ctx(repo, env, sweep)
    if args.infra_faults:
        return _infra_series(ctx, args, repo, base, work)
    load = Load(n_load, args.load_kind, work / "load")
    condition = "no load" if not n_load else f"{args.load_mode} {args.load_kind} load x{n_load}"
    t_start = time.perf_counter()
    try:
        bugs = [b for b in BUGS if not args.quick or b.name.startswith("conversion slowdown")]
        bugs = [] if args.creep_only else [b for b in bugs if any(m in args.models for m, _, _ in b.expect)]
        fifth, trips = None, None
        if SLOW_MODEL in args.models:  # calibrated for the +20 % bug and the latency creep
            trips, slow_ms, per = calibrate_fifth(work / "cache", work / "data")
            fifth = fifth_bug(trips)
            if bugs:
                bugs.insert(len(bugs) - 1, fifth)
            else:
                fifth = None
            ctx.log.append(f"calibrated: {SLOW_MODEL} fp16 {slow_ms:.3f} ms, {per * 1000:.2f} us per no-op step, "
                           f"{trips} steps for +20 %")
        rows, aa, bisect_txt, bisect_ok, midpoints, bound, creep_rows, plan = _run(ctx, args, repo, base, bugs,
                                                                                   load, trips)
    finally:
        load.stop()
    wall = time.perf_counter() - t_start
    figures = confirmation_figures(work / "data" / "ampci.sqlite3")
    cost = figures["cost"]
    decided = [d for v in figures["decided"].values() for d in v]
    for r in rows:
        r["decided"] = sorted(figures["decided"].get(r["run"], []))
    detected = sum(1 for r in rows if r["bug"] != "noise" and r["ok"])
    n_bugs = sum(1 for r in rows if r["bug"] != "noise")
    false_alarms = sum(1 for r in rows if r["bug"] == "noise" and not r["ok"])
    n_noise = sum(1 for r in rows if r["bug"] == "noise")
    fifth_ok = fifth is None or any(r["bug"] == fifth.name and r["ok"] for r in rows)
    aa_flags, aa_comparisons, aa_runs = aa
    creep = score(plan, creep_rows, args.models, base,
                  lambda ref: f"{ref} (the base)" if ref and ref == base[:10] else (ref or "?"))
    false_alarms += sum(1 for a in creep["alarms"] if a[1] == "noise")
    creep_cell_alarms = sum(1 for a in creep["alarms"] if a[1] != "noise")
    n_noise += sum(1 for r in creep_rows if not r["step"] and not r.get("nightly"))
    creep_ok = not creep_rows or (all(creep["kinds"].values()) and not creep["alarms"])
    gains = figures["improvements"]
    noise_runs = [r["run"] for r in rows if r["bug"] == "noise"] + [r["run"] for r in creep_rows
                                                                     if not r["step"] and not r.get("nightly")]
    false_gains = [g for run in noise_runs for g in gains.get(run, []) if g[3] == "open"]
    unconfirmed_gains = [g for run in noise_runs for g in gains.get(run, []) if g[3] != "open"]
    aa_gains = [g for run in aa_runs for g in gains.get(run, []) if g[3] == "open"]
    n_cost = sum(c for c, _ in cost.values())
    table = {
        "condition": condition,
        "detected": f"{detected}/{n_bugs}", "false_alarms_noise": f"{false_alarms}/{n_noise}",
        "false_improvements_noise": f"{len(false_gains)}/{n_noise} ({len(unconfirmed_gains)} suspected or "
                                    f"dismissed, never shown as gains)",
        "aa_false_alarm_rate": f"{aa_flags + len(aa_gains)}/{aa_comparisons}"
                               + (f" ({100 * (aa_flags + len(aa_gains)) / aa_comparisons:.1f}%)"
                                  if aa_comparisons else ""),
        "confirmations": f"{len(cost)} runs, {n_cost} cells, "
                         f"{sum(s for _, s in cost.values()):.0f} job-s"
                         + (f" ({sum(s for _, s in cost.values()) / n_cost:.1f} s a cell)" if n_cost else "")
                         + f"; {sum(1 for d in decided if d[3] == 'open')} confirmed, "
                         f"{sum(1 for d in decided if d[3] == 'dismissed')} dismissed",
        "bisection": bisect_txt,
        "creep": {kind: (f"creep commit {hit['step']}/{args.creep}, {hit['how']}" if hit else
                         f"NOT detected over {args.creep} commits")
                  for kind, hit in creep["kinds"].items()} if creep_rows else {},
        "creep_steps": {"conversion time": f"+{plan.convert_step_s * 1000:g} ms of "
                                           f"{'sleep' if plan.wait else 'CPU'} a commit",
                        "latency": f"+{plan.trips_step} no-op Loop steps a commit (x{args.creep_latency:g} over "
                                   f"{args.creep})",
                        "accuracy": f"+{plan.accuracy_step:.3g} max_abs a commit"},
        "creep_alarms": creep["alarms"],
        "sweeps": ctx.sweeps + midpoints, "wall_s": round(wall, 1),
        "load_average": (f"{min(ctx.loadavg):.1f} / {sorted(ctx.loadavg)[len(ctx.loadavg) // 2]:.1f} / "
                         f"{max(ctx.loadavg):.1f}" if ctx.loadavg else "n/a"),
        "calibration": [line for line in ctx.log if line.startswith("calibrated")],
    }
    if args.json:
        print(json.dumps({"summary": table, "commits": rows, "creep": creep_rows}, indent=2, default=str))
    else:
        print(f"condition: {condition}")
        print("| commit | injected | load | confirmed findings (model, dtype, kind) | dismissed | verdict |")
        print("|---|---|---|---|---|---|")
        for r in rows:
            f = "; ".join(f"{m} {d} {k}" for m, d, k in r["findings"]) or "none"
            dis = "; ".join(f"{m} {d} {k}" for m, d, k, st in r["decided"] if st == "dismissed") or "–"
            verdict = ("detected" if r["ok"] else "MISSED") if r["bug"] != "noise" else \
                ("quiet" if r["ok"] else "FALSE ALARM")
            print(f"| {r['commit']} | {r['bug']} | {'on' if r['load'] else 'off'} | {f} | {dis} | {verdict} |")
        print()
        print("| measure | value | target |")
        print("|---|---|---|")
        print(f"| bugs detected (right cell and metric) | {table['detected']} | all |")
        print(f"| false alarms on noise commits | {table['false_alarms_noise']} | 0 |")
        print(f"| false improvements (confirmed) on noise commits | {table['false_improvements_noise']} | 0 |")
        print(f"| A/A findings (any kind) / timing comparisons | {table['aa_false_alarm_rate']} | <= 1% |")
        print(f"| confirmations (cost) | {table['confirmations']} | suspected cells only |")
        print(f"| bisection | {table['bisection']} | culprit in <= ceil(log2 n) |")
        for kind, text in table["creep"].items():
            print(f"| {kind} creep ({table['creep_steps'][kind]}) | {text} | within the window |")
        if creep_rows:
            print(f"| findings on creep commits outside the series | {creep_cell_alarms} | 0 |")
            late = "; ".join(f"{c[2]} {c[3]} {c[4]} at {c[0][:10]}" for c in creep.get("late", [])) or "none"
            print(f"| creep drifts first reported on the noise commit after the series (late, not false) | {late} | |")
        print(f"| sweeps / wall time | {table['sweeps']} / {table['wall_s']} s | |")
        print(f"| machine load average (1 min) after each sweep, min / median / max | {table['load_average']} | |")
        for line in table["calibration"]:
            print(line)
        if creep_rows:
            print()
            print("| creep commit | load | findings (model, dtype, kind) | drift (model, dtype, metric, reference) |")
            print("|---|---|---|---|")
            for r in creep_rows:
                f = "; ".join(f"{m} {d} {k}" for m, d, k in r["findings"]) or "none"
                dr = "; ".join(f"{m} {d} {x} vs {ref}" for m, d, x, ref in r["drifts"]) or "–"
                what = "nightly" if r.get("nightly") else (r["step"] or "noise")
                print(f"| {r['commit']} {what} | {'on' if r['load'] else 'off'} | {f} | {dr} |")
    ok = (detected == n_bugs and false_alarms == 0 and fifth_ok and bisect_ok and midpoints <= bound and creep_ok
          and not false_gains and not creep_cell_alarms
          and (aa_comparisons == 0 or (aa_flags + len(aa_gains)) / aa_comparisons <= 0.01))
    if args.quick:  # the slowdown was suspected, confirmed by a confirmation run, and that is all it cost
        ok = ok and len(cost) >= 1 and any(d[2] == "conversion_time" and d[3] == "open" for d in decided)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


def _run(ctx: Ctx, args: argparse.Namespace, repo: Path, base: str, bugs: list[Bug], load: Load,
         trips20: int | None) -> tuple[list[dict[str, Any]], tuple[int, int, list[int]], str, bool, int, int,
                                       list[dict[str, Any]], CreepPlan]:
    """The sweeps: history (each commit against its parent), bisection, creep, A/A (see module doc).
    ``trips20``: the calibrated no-op Loop steps of +20 % on the slow model (None: no latency creep)."""
    alternate = args.load_mode == "alternate"
    load.set(load.n > 0 and not alternate)
    first = ctx.sweep_at(base, base)
    plan = creep_plan(args, first, trips20)
    history: list[tuple[str, Bug | None]] = []
    k = 0
    if args.creep_only:
        args.no_bisect = True
    for bug in bugs:
        for _ in range(args.noise):
            k += 1
            history.append((noise(repo, k), None))
        history.append((inject(repo, bug), bug))
    if bugs:
        k += 1
        history.append((noise(repo, k), None))
    rows = []
    parent = base
    for i, (sha, bug) in enumerate(history):
        if alternate:
            load.set(load.n > 0 and i % 2 == 0)  # the base ran without: each commit's parent had the other
        payload = ctx.sweep_at(sha, parent)
        found = findings(payload)
        rows.append({"commit": sha[:10], "bug": bug.name if bug else "noise", "findings": sorted(set(found)),
                     "ok": matches(found, bug) if bug else not found, "run": payload["run"]["id"],
                     "load": load.on})
        parent = sha

    bisect_ok, midpoints, bound, bisect_txt = True, 0, 0, "skipped"
    if not args.no_bisect:
        if alternate:
            load.set(False)
        git(repo, "checkout", "-q", "-b", "bisect", base)
        n = args.bisect_commits
        culprit_at = n // 2 + 1
        culprit = ""
        for i in range(1, n + 1):
            if i == culprit_at:
                culprit = inject(repo, BUGS[2])  # the range check, a clear accuracy failure
            else:
                noise(repo, 100 + i)
        tip = git(repo, "rev-parse", "HEAD")
        tip_run = ctx.sweep_at(tip, base)
        t0 = time.perf_counter()
        rc, bis = ctx.ampci("bisect", "--run", str(tip_run["run"]["id"]), "--json", ok=(0, 1, 2))
        bisect_s = time.perf_counter() - t0
        named = json.dumps(bis) if not isinstance(bis, str) else bis
        midpoints = _midpoint_runs(ctx, tip_run["run"]["id"])
        bisect_ok = culprit in named
        bound = math.ceil(math.log2(n))
        bisect_txt = (f"{'found' if bisect_ok else 'NOT found'} in {midpoints} midpoint runs (bound {bound}), "
                      f"{bisect_s:.0f} s, exit {rc}")

    creep_rows: list[dict[str, Any]] = []
    if args.creep > 0:
        git(repo, "checkout", "-q", "-b", "creep", base)
        parent = base
        steps = [*range(1, args.creep + 1), *([0] * (1 if args.quick else 2))]  # 0: a noise commit after it
        for i, step in enumerate(steps):
            if alternate:
                load.set(load.n > 0 and i % 2 == 0)
            sha = creep(repo, step, plan) if step else noise(repo, 200 + i)
            payload = ctx.sweep_at(sha, parent)
            creep_rows.append({"commit": sha[:10], "step": step, "findings": sorted(set(findings(payload))),
                               "drifts": drifts(payload), "load": load.on, "run": payload["run"]["id"]})
            parent = sha
        if not args.quick:  # the night after: any drift over the limit across the day's commits
            payload = ctx.sweep_at(parent, git(repo, "rev-parse", f"{parent}~1"), "--trigger", "nightly")
            creep_rows.append({"commit": parent[:10], "step": 0, "nightly": True, "load": load.on,
                               "findings": sorted(set(findings(payload))), "drifts": drifts(payload),
                               "run": payload["run"]["id"]})

    aa_flags = aa_comparisons = 0
    aa_runs: list[int] = []
    for j in range(args.aa):
        if alternate:
            load.set(load.n > 0 and j % 2 == 0)
        payload = ctx.sweep_at(base, base)
        aa_runs.append(payload["run"]["id"])
        aa_comparisons += timing_comparisons(payload)
        aa_flags += len(findings(payload))  # any open finding of a revision against itself is false
    return rows, (aa_flags, aa_comparisons, aa_runs), bisect_txt, bisect_ok, midpoints, bound, creep_rows, plan


def _infra_series(ctx: Ctx, args: argparse.Namespace, repo: Path, base: str, work: Path) -> int:
    """The infrastructure-fault series (:mod:`_infra_faults`); prints its table, exits 1 when a target is missed."""
    import _infra_faults

    bugs = [b for b in BUGS[:3] if any(m in args.models for m, _, _ in b.expect)]
    t0 = time.perf_counter()
    table = _infra_faults.run_series(lambda sha, parent: ctx.sweep_at(sha, parent), lambda i: noise(repo, i),
                                     lambda bug: inject(repo, bug), bugs, base, work / "data", matches)
    if args.json:
        print(json.dumps({k: v for k, v in table.items() if k != "rows"}, indent=2))
    else:
        _infra_faults.print_table(table)
        print(f"| sweeps / wall time | {ctx.sweeps} / {time.perf_counter() - t0:.0f} s | |")
    return 0 if _infra_faults.passed(table) else 1


def creep_plan(args: argparse.Namespace, first: dict[str, Any], trips20: int | None) -> CreepPlan:
    """The creep series' steps: ``--creep-ms`` of conversion; x``--creep-latency`` over the series of the slow
    model's latency (from the calibrated +20 % steps); the accuracy step from the base's own error (its first
    sweep's max_abs of the accuracy cell)."""
    from service.regressions.thresholds import Thresholds

    n = max(1, args.creep)
    trips = round(trips20 * (args.creep_latency - 1.0) / 0.2 / n) if trips20 and not args.quick else 0
    acc = 0.0
    if ACCURACY_CELL[0] in args.models and not args.quick:
        base_err = next((r.get("max_abs") for r in first.get("results", [])
                         if (r["model"], r["dtype"]) == ACCURACY_CELL), None)
        acc = accuracy_step(base_err, Thresholds().accuracy_for(*ACCURACY_CELL).floor)
    return CreepPlan(n, args.creep_ms / 1000, trips, acc, wait=args.creep_wait)


def _midpoint_runs(ctx: Ctx, after_run: int) -> int:
    """How many bisect-trigger runs were created after run ``after_run``."""
    _, runs = ctx.ampci("runs", "--json", "--limit", "1000")
    items = runs if isinstance(runs, list) else runs.get("runs", [])
    return sum(1 for r in items if r.get("trigger") == "bisect" and int(r.get("id", 0)) > after_run)


if __name__ == "__main__":
    sys.exit(main())
