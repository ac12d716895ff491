"""Start-up cost of the ampci CLI beside its anchors, whole processes timed in alternation (issue 25).

    python bench/bench_cli.py [--admin-url URL] [--revisions 200] [--cells 500] [--rounds 15] [--quick]

Seeds a fresh PostgreSQL database (dropped at the end) with ``bench/bench_queries.py``'s history
(200 revisions x 500 cells = 100,000 results by default) and the embedded SQLite (a temporary AMPCI_DATA_DIR)
with the same revisions and their runs, each with a recorded verdict (what ``ampci runs`` reads), then times, round after round and in
alternation so that load on the machine hits every command alike, the whole processes

    python -c pass                    (anchor of ``ampci --help``, ``convert --help`` and ``zoo list``)
    python -c "import sqlalchemy"     (anchor of the query commands)
    python -c "import psycopg"        (anchor of ``ampci runs`` on PostgreSQL)
    ampci --help
    ampci convert --help              (its options are declared without importing onnx: issue 25)
    ampci zoo list                    (the manifests are read without numpy)
    ampci runs --json
    ampci compare REV_A REV_B
    ampci runs --json                 (embedded mode: the SQLite under AMPCI_DATA_DIR, nothing configured)
    ampci runs                        (its table; embedded SQLite, and PostgreSQL: issue 42)

and, in this process and in the same rounds, "the query itself" of each query command: the same command
run in-process once its modules are imported (this process's heap frozen out of the collector, as the
command's start-up heap is) (opening the store, the schema check, the Store calls and formatting the
output: JSON, or the rich table of 500 cells), output thrown away.  Prints medians, ratios and
PASS/FAIL per target:

    ampci --help       <= 3 x (python -c pass) + 0.1 s   (and ``convert --help``, ``zoo list``, the same)
    ampci runs         <= 3 x (python -c pass) + 0.1 s   (issue 42, the embedded SQLite: it reads through
                                                          service/db/light.py, without SQLAlchemy)
    ampci runs         <= 3 x (python -c "import psycopg") + 0.1 s   (on PostgreSQL: its driver is the floor)
    ampci runs --json  <= 1.5 x (python -c "import sqlalchemy") + the query itself
    ampci compare      <= 1.5 x (python -c "import sqlalchemy") + the query itself
    (and ``runs --json`` on the embedded SQLite, the same)

Each process's CPU seconds (user + system, from the kernel's accounting of the child) are printed beside
its wall seconds, with the same ratios: on a shared, busy machine wall time mostly measures the wait
for a core, and the CPU ratios say what the command itself costs.  The targets are judged on wall time.

Every timed process may write and reuse bytecode (``PYTHONDONTWRITEBYTECODE`` cleared, a private
``PYTHONPYCACHEPREFIX`` in a temporary folder, written by the uncounted round 0): an installed ampci runs
from compiled bytecode, and where the environment forbids writing it (as the CI machine's does) the
checkout's own modules would otherwise be compiled from source in every process, which the anchors
(site-packages, compiled at install) never are.

Exit 1 when a target is missed or a command fails.  ``--quick`` (seconds: 3 revisions x 10 cells, 3
rounds) checks what must hold on any machine: each command exits 0, ``runs --json`` lists the seeded
runs, ``compare`` names both revisions, ``--help`` lists every command, ``convert --help`` its auto options,
``zoo list`` the smoke models, ``ampci runs`` the seeded runs on both stores; the timing table is printed
but not judged (three rounds on a busy machine are not a measurement).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_queries import T0, seed  # noqa: E402

from service.db.admin import create_database, drop_database  # noqa: E402
from service.db.migrate import upgrade  # noqa: E402

HELP_FACTOR, HELP_SLACK_S = 3.0, 0.1
QUERY_FACTOR = 1.5
EMBEDDED = "ampci runs --json (embedded SQLite)"
RUNS_EMBEDDED, RUNS_PG = "ampci runs (embedded SQLite)", "ampci runs (PostgreSQL)"
#: judged as ``ampci --help`` is: they answer from the parser, a manifest or (``ampci runs``, issue 42) the
#: light read path, and import no model stack (nor SQLAlchemy)
HELP_LIKE = ("ampci --help", "ampci convert --help", "ampci zoo list", RUNS_EMBEDDED)
PSYCOPG = 'python -c "import psycopg"'  #: the floor of a command that reads PostgreSQL: its driver


def seed_embedded(url: str, shas: list[str], cells: int) -> None:
    """The embedded SQLite at ``url`` upgraded and holding ``shas`` and one finished run of each, its verdict
    recorded (a run without one is judged by the first listing: round 0), as ``bench_queries.seed`` creates them."""
    import sqlalchemy as sa

    from service.db import models as m

    upgrade(url)
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(m.Revision.__table__.insert(), [
            {"sha": s, "parents": [shas[i - 1]] if i else [], "branch": "main", "author": "bench",
             "message": f"commit {i}", "committed_at": T0 + timedelta(hours=i), "created_at": T0}
            for i, s in enumerate(shas)])
        conn.execute(m.Run.__table__.insert(), [
            {"revision_sha": s, "trigger": "push", "status": "complete", "sweep": "full", "meta": {},
             "created_at": T0 + timedelta(hours=i, minutes=5), "finished_at": T0 + timedelta(hours=i, minutes=50),
             "verdict": {"state": "success", "compared": cells, "regressions": 0}}
            for i, s in enumerate(shas)])
    engine.dispose()


def ampci_argv() -> list[str]:
    """The installed console script next to this interpreter (what a user runs), else ``-m``."""
    script = Path(sys.executable).with_name("ampci")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "service.cli.main"]


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_timed(argv: list[str], env: dict[str, str]) -> tuple[float, float, subprocess.CompletedProcess[str]]:
    """Wall seconds and CPU seconds (user + system) of one whole process, and what it printed (this
    process runs one child at a time, so the growth of its children's CPU time is that child's)."""
    cpu, t = _children_cpu(), time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    return time.perf_counter() - t, _children_cpu() - cpu, proc


def timed_call(fn: Callable[[], object]) -> tuple[float, float]:
    """Wall seconds and CPU seconds (this process's) of one call of ``fn``."""
    c, t = time.process_time(), time.perf_counter()
    fn()
    return time.perf_counter() - t, time.process_time() - c


def in_process_command(environ: dict[str, str], argv: list[str]) -> Callable[[], object]:
    """The command's own work once its modules are imported -- "the query itself": ``ampci ARGV`` called
    in this process under ``environ`` (opening the store, the schema check, the Store calls, formatting
    its output) with its output thrown away."""
    from service.cli.main import main as ampci_main

    def call() -> object:
        saved = {k: os.environ.get(k) for k in environ}
        os.environ.update(environ)
        try:
            with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
                rc = ampci_main(argv)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        assert rc == 0, f"ampci {' '.join(argv)} exited {rc}"
        return rc
    return call


def main(argv: list[str] | None = None) -> int:
    """Seed, time, print the table; exit 1 when an invariant or (full mode) a target fails."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--admin-url", default=os.environ.get("AMPCI_TEST_DATABASE_URL",
                                                          "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"))
    ap.add_argument("--revisions", type=int, default=200)
    ap.add_argument("--cells", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--quick", action="store_true", help="seconds, tiny inputs: check invariants only")
    args = ap.parse_args(argv)
    if args.quick:
        args.revisions, args.cells, args.rounds = 3, 10, 3

    url = create_database(args.admin_url, "ampci_bench_cli")
    embedded_dir = tempfile.TemporaryDirectory(prefix="ampci-bench-cli-")
    failures: list[str] = []
    try:
        upgrade(url)
        shas = seed(url, args.revisions, args.cells)
        rev_a, rev_b = shas[len(shas) // 2 - 1][:10], shas[len(shas) // 2][:10]
        bytecode = {"PYTHONDONTWRITEBYTECODE": "", "PYTHONPYCACHEPREFIX": str(Path(embedded_dir.name) / "pycache")}
        on_pg = {"AMPCI_DATABASE_URL": url, "COLUMNS": "200", **bytecode}
        embedded = {"AMPCI_DATABASE_URL": "", "AMPCI_DATA_DIR": str(Path(embedded_dir.name) / "data"), "COLUMNS": "200",
                    **bytecode}
        seed_embedded(f"sqlite:///{Path(embedded['AMPCI_DATA_DIR']) / 'ampci.sqlite3'}", shas, args.cells)
        py = sys.executable
        commands: dict[str, tuple[list[str], dict[str, str]]] = {
            "python -c pass": ([py, "-c", "pass"], on_pg),
            "ampci --help": ([*ampci_argv(), "--help"], on_pg),
            "ampci convert --help": ([*ampci_argv(), "convert", "--help"], on_pg),
            "ampci zoo list": ([*ampci_argv(), "zoo", "list"], embedded),
            'python -c "import sqlalchemy"': ([py, "-c", "import sqlalchemy"], on_pg),
            PSYCOPG: ([py, "-c", "import psycopg"], on_pg),
            "ampci runs --json": ([*ampci_argv(), "runs", "--json"], on_pg),
            "ampci compare A B": ([*ampci_argv(), "compare", rev_a, rev_b], on_pg),
            EMBEDDED: ([*ampci_argv(), "runs", "--json"], embedded),
            RUNS_EMBEDDED: ([*ampci_argv(), "runs"], embedded),
            RUNS_PG: ([*ampci_argv(), "runs"], on_pg),
        }
        # "the query itself": each query command called in this process, in the same rounds as the
        # processes (the same load), after round 0 imported its modules; this process's own heap (the
        # seeding's) frozen out of the collector, as a command's start-up heap is (service/cli/startup.py)
        in_proc = {"ampci runs --json": in_process_command(on_pg, ["runs", "--json"]),
                   "ampci compare A B": in_process_command(on_pg, ["compare", rev_a, rev_b]),
                   EMBEDDED: in_process_command(embedded, ["runs", "--json"])}
        q_times: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in in_proc}
        times: dict[str, list[float]] = {name: [] for name in commands}
        cpu_times: dict[str, list[float]] = {name: [] for name in commands}
        last: dict[str, subprocess.CompletedProcess[str]] = {}
        gc.collect()
        gc.freeze()
        for i in range(args.rounds + 1):  # round 0 warms the page cache, writes the bytecode and creates the
            order = list(commands) if i % 2 else list(reversed(commands))  # SQLite: not counted; alternate
            for name in order:                                              # who goes first
                argv_, environ = commands[name]
                seconds, cpu, proc = run_timed(argv_, {**os.environ, **environ})
                if i:
                    times[name].append(seconds)
                    cpu_times[name].append(cpu)
                last[name] = proc
            for name, fn in in_proc.items():
                seconds, cpu = timed_call(fn)
                if i:
                    q_times[name][0].append(seconds)
                    q_times[name][1].append(cpu)
        gc.unfreeze()
        for name, proc in last.items():
            if proc.returncode != 0:
                failures.append(f"`{name}` exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
        if not failures:
            listed = json.loads(last["ampci runs --json"].stdout)
            if len(listed) != min(50, args.revisions):
                failures.append(f"`ampci runs --json` listed {len(listed)} runs, expected {min(50, args.revisions)}")
            if rev_a not in last["ampci compare A B"].stdout or rev_b not in last["ampci compare A B"].stdout:
                failures.append("`ampci compare` does not name both revisions")
            from service.cli.main import COMMANDS

            missing = [c for c in COMMANDS if c not in last["ampci --help"].stdout]
            if missing:
                failures.append(f"`ampci --help` does not list {missing}")
            if "--calibration-data" not in last["ampci convert --help"].stdout:
                failures.append("`ampci convert --help` does not list --calibration-data")
            if "smoke" not in last["ampci zoo list"].stdout:
                failures.append("`ampci zoo list` lists no smoke model")
            if len(json.loads(last[EMBEDDED].stdout)) != min(50, args.revisions):
                failures.append("`ampci runs --json` on the embedded SQLite does not list the seeded runs")
            for name in (RUNS_EMBEDDED, RUNS_PG):
                if shas[-1][:8] not in last[name].stdout:  # the newest run's revision
                    failures.append(f"`{name}` does not list revision {shas[-1][:8]}")
    finally:
        drop_database(args.admin_url, url)
        embedded_dir.cleanup()

    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    n_results = args.revisions * args.cells
    print(f"{n_results:,} results on PostgreSQL ({args.revisions} runs in the embedded SQLite); {args.rounds} "
          f"alternating rounds, "
          f"medians; load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (1/5/15 min) on {os.cpu_count()} CPUs")
    queries = {name: (statistics.median(w), statistics.median(c)) for name, (w, c) in q_times.items()}
    for kind, samples, index, judged in (("wall", times, 0, True), ("CPU (user + system)", cpu_times, 1, False)):
        med = {name: statistics.median(ts) for name, ts in samples.items()}
        bare, sqla = med["python -c pass"], med['python -c "import sqlalchemy"']
        targets = [(name, "python -c pass", bare, HELP_FACTOR * bare + HELP_SLACK_S,
                    f"<= {HELP_FACTOR:g} x anchor + {HELP_SLACK_S:g} s") for name in HELP_LIKE]
        targets.append((RUNS_PG, PSYCOPG, med[PSYCOPG], HELP_FACTOR * med[PSYCOPG] + HELP_SLACK_S,
                        f"<= {HELP_FACTOR:g} x anchor + {HELP_SLACK_S:g} s"))
        targets += [(name, 'python -c "import sqlalchemy"', sqla, QUERY_FACTOR * sqla + q[index],
                     f"<= {QUERY_FACTOR:g} x anchor + query {q[index] * 1000:.0f} ms") for name, q in queries.items()]
        print(f"\n{kind} seconds{'' if judged else ' (printed, not judged: what the commands cost on a busy machine)'}")
        print("| command | anchor | command s | anchor s | ratio | limit s | target | met |\n"
              "|---|---|---:|---:|---:|---:|---|:--:|")
        for name, anchor, anchor_s, limit, rule in targets:
            value = med[name]
            met = value <= limit
            if judged and not met and not args.quick:
                failures.append(f"{name}: {value:.3f} s > {limit:.3f} s")
            print(f"| `{name}` | `{anchor}` | {value:.3f} | {anchor_s:.3f} | {value / anchor_s:.2f} | {limit:.3f} | "
                  f"{rule} | {'PASS' if met else 'FAIL'} |")
    if args.quick:
        print("(--quick: timings printed, not judged)")
    for f in failures:
        print(f"FAILED: {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
