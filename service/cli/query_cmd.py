"""Query commands over the results store (rich tables; ``--json`` for machines).

    ampci runs [--revision R] [--trigger T] [--status S] [--limit N]
    ampci run ID                                   # one run: summary line and its jobs
    ampci results [--run ID] [--revision R] [--model M] [--dtype D] [--policy P] [--target T] [--status S]
    ampci regressions [--open] [--since DATE] [--revision R] [--run ID] [--category C]
    ampci compare REV_A REV_B
    ampci history MODEL [--dtype D] [--policy P] [--target T] [--metric cosine|latency_p50|...] [--limit N]
    ampci ack ID [--false-positive] [--by NAME] [--note TEXT]

Revisions may be unique sha prefixes.  ``ampci regressions --revision R`` (or ``--run ID``) exits 1
when open regressions exist there, so it can gate CI.  Unknown ids/revisions/models exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import TYPE_CHECKING

from service.cli.argtypes import bounded_int, dtype_name, one_of, policy_name, target_name
from service.cli.startup import startup_complete
from service.errors import ConfigError
from service.vocabulary import RUN_STATES, TRIGGERS

if TYPE_CHECKING:
    from collections.abc import Iterable

    from rich.console import Console, RenderableType
    from rich.segment import Segment

    from service.cli.main import Subcommands
    from service.db.light import LightReader
    from service.db.records import RunInfo
    from service.db.store import Store
    from service.json_types import JsonList, JsonValue


def open_store() -> Store:
    """The Store of this process's settings; the schema must be at head (embedded SQLite is upgraded).
    Ends the console script's start-up (:func:`service.cli.startup.startup_complete`) once the store's
    modules, dialect and driver are imported: the commands that call it register ``startup_in_command``."""
    from service.db.migrate import head, stored_revision  # no Alembic import while the schema is current
    from service.db.store import Store
    from service.settings import Settings, redact_url

    settings = Settings.from_env()
    url = settings.effective_database_url
    store = Store.from_url(url)  # loads the database's dialect and driver: the last of start-up
    startup_complete()  # (service/cli/startup.py) the query's own objects are collected as usual
    at, want = stored_revision(store.engine), head()
    if at != want:
        if not settings.database_url:
            store.upgrade()
        else:
            raise ConfigError(f"database {redact_url(url)} is at schema {at or 'none'} but this ampci needs "
                              f"{want}; run `ampci db upgrade`")
    return store


def console(args: argparse.Namespace | None = None) -> Console:
    """The rich Console tables are printed on: the terminal's width, or for pipes and CI logs
    ``$COLUMNS`` (default 200, so tables are not squeezed); ``--wide`` asks for 200 columns or more
    anywhere.  Tables take its width (``render.NARROW``) to leave out low-value columns."""
    from rich.console import Console

    class PipeConsole(Console):
        def _render_buffer(self, buffer: Iterable[Segment]) -> str:
            # stored text (messages, names, reasons) never drives the terminal; rich's own
            # control segments and the styles it renders around the text are kept
            from rich.segment import Segment

            from service.cli.terminal import printable

            return str(super()._render_buffer(
                s if s.control else Segment(printable(s.text), s.style, s.control) for s in buffer))

        def on_broken_pipe(self) -> None:  # rich's own handler exits 1 (our "gate failed")
            self.quiet = True
            raise BrokenPipeError("stdout closed by the reader")  # service.cli.main: exit 141, quietly

    out = PipeConsole(highlight=False)
    wide = bool(getattr(args, "wide", False))
    if not out.is_terminal or wide:
        try:
            width = int(os.environ.get("COLUMNS") or 200)
        except ValueError:
            width = 200
        out = PipeConsole(highlight=False, width=max(width, 200) if wide else max(width, 20))
    return out


def emit(args: argparse.Namespace, data: JsonValue, *renderables: RenderableType,
         out: Console | None = None, rows: JsonList | None = None) -> None:
    """Print ``data`` as JSON with ``--json``; with ``--csv`` the rows of that JSON (``rows``, or ``data``
    itself when it is the list) as CSV (:mod:`service.cli.export`); else the rich renderables/strings (on
    ``out``, default :func:`console`), each line of a string wrapped at its spaces to the console's width
    (its indent kept), so no line is wider and no word is broken (:func:`service.cli.fit.wrap_lines`)."""
    if getattr(args, "json", False):
        print(json.dumps(data, indent=2, sort_keys=True, default=str))
        return
    if getattr(args, "csv", False):
        from service.cli.export import write_csv

        write_csv(rows if rows is not None else data)
        return
    console_ = out if out is not None else console(args)
    for r in renderables:
        if isinstance(r, str):
            from service.cli.fit import wrap_lines
            from service.cli.terminal import printable

            print(wrap_lines(printable(r), console_.width), flush=True)
        else:
            console_.print(r)


#: The help of a --revision option.
REVISION_HELP = "a sha, a unique prefix of one, a branch or a tag"


def _common(p: argparse.ArgumentParser, csv: bool = False) -> argparse.ArgumentParser:
    """--json (and with ``csv`` --csv, the same rows as CSV; one or the other) and --wide."""
    formats = p.add_mutually_exclusive_group()
    formats.add_argument("--json", action="store_true", help="print JSON instead of a table")
    if csv:
        formats.add_argument("--csv", action="store_true", help="print the rows --json prints as CSV (RFC 4180)")
    p.add_argument("--wide", action="store_true", help="every column, at least 200 characters wide")
    return p


def _result_statuses() -> tuple[str, ...]:
    from workers.result import STATUSES

    return STATUSES


def _metric_names() -> tuple[str, ...]:
    from service.vocabulary import METRICS

    return tuple(METRICS)


def _cell_filters(p: argparse.ArgumentParser) -> None:
    """--dtype, --policy, --target, each refusing a value no cell can have (exit 2, the choices listed)."""
    p.add_argument("--dtype", type=dtype_name, help="fp16 or bf16 (default: every dtype)")
    p.add_argument("--policy", type=policy_name, help="default, conservative, aggressive, auto or a policy file")
    p.add_argument("--target", type=target_name, help="cpu, cuda or a queue of one (cuda-a100)")


def register(subparsers: Subcommands) -> None:
    """Add runs, run, results, regressions, compare, history and ack."""
    from service.cli.argtypes import record_id, revision_arg, since_time, text_arg

    p = _common(subparsers.add_parser("runs", help="list runs, newest first"), csv=True)
    p.add_argument("--revision", type=revision_arg, help=REVISION_HELP)
    p.add_argument("--trigger", type=one_of("trigger", TRIGGERS), help="push, pull_request, nightly, manual or bisect")
    p.add_argument("--status", type=one_of("run status", RUN_STATES),
                   help="queued, running, complete, partial, failed or cancelled")
    p.add_argument("--limit", type=bounded_int(1, 1_000_000), default=50, help="at most N runs (default 50)")
    p.set_defaults(func=cmd_runs, startup_in_command=True)

    p = _common(subparsers.add_parser("run", help="one run: summary and jobs"))
    p.add_argument("run_id", type=record_id("run"), metavar="ID", help="the run's id (ampci runs)")
    p.set_defaults(func=cmd_run, startup_in_command=True)

    p = _common(subparsers.add_parser("results", help="stored results, filtered"), csv=True)
    p.add_argument("--run", type=record_id("run"), dest="run_id", help="only this run's results (its id)")
    p.add_argument("--revision", type=revision_arg, help=REVISION_HELP)
    p.add_argument("--model", type=text_arg("model"), help="only this model's results (ampci zoo list)")
    _cell_filters(p)
    p.add_argument("--status", type=one_of("result status", _result_statuses), help="pass, fail_accuracy, ...")
    p.add_argument("--limit", type=bounded_int(1, 1_000_000), default=5000, help="at most N results (default 5000)")
    p.add_argument("--stderr", action="store_true",
                   help="below the table, the last lines the pass wrote on stderr for each failed cell "
                        "(--json always has them as stderr_tail)")
    p.set_defaults(func=cmd_results, startup_in_command=True)

    p = _common(subparsers.add_parser("regressions", help="regressions, improvements and flaky cells"), csv=True)
    p.add_argument("--open", action="store_true", help="only open findings")
    p.add_argument("--since", metavar="DATE", type=since_time, help="ISO date/datetime (UTC) or 7d / 12h ago")
    p.add_argument("--revision", type=revision_arg, help="only this revision; exit 1 if it has open regressions")
    p.add_argument("--run", type=record_id("run"), dest="run_id",
                   help="only this run; exit 1 if it has open regressions")
    p.add_argument("--category", choices=["regression", "improvement", "flaky"],
                   help="only regressions, improvements or flaky cells")
    p.add_argument("--limit", type=bounded_int(1, 1_000_000), default=1000, help="at most N findings (default 1000)")
    p.set_defaults(func=cmd_regressions, startup_in_command=True)

    p = _common(subparsers.add_parser("compare", help="cell-by-cell comparison of two revisions"), csv=True)
    p.add_argument("rev_a", metavar="REV_A", type=revision_arg, help="the older revision (" + REVISION_HELP + ")")
    p.add_argument("rev_b", metavar="REV_B", type=revision_arg, help="the newer revision; deltas are B - A")
    p.set_defaults(func=cmd_compare, startup_in_command=True)

    p = _common(subparsers.add_parser("history", help="a metric of a model over runs, with a plot"), csv=True)
    p.add_argument("model", metavar="MODEL", type=text_arg("model"), help="the model's name (ampci zoo list)")
    _cell_filters(p)
    p.add_argument("--metric", type=text_arg("metric", 100), default="cosine",
                   help=f"the metric to show (default cosine): {', '.join(_metric_names())}")
    p.add_argument("--limit", type=bounded_int(1, 1_000_000), default=200, help="the last N values (default 200)")
    p.set_defaults(func=cmd_history, startup_in_command=True)

    p = _common(subparsers.add_parser("ack", help="acknowledge a regression (or mark it a false positive)"))
    p.add_argument("regression_id", type=record_id("regression"), metavar="ID",
                   help="the finding's id (ampci regressions)")
    p.add_argument("--false-positive", action="store_true",
                   help="the finding is wrong (the run's gate no longer counts it), not only acknowledged")
    p.add_argument("--by", type=text_arg("by", 200), default=os.environ.get("USER") or None,
                   help="who triaged it (default $USER)")
    p.add_argument("--note", type=text_arg("note", 2000), help="why, shown with the finding")
    p.set_defaults(func=cmd_ack, startup_in_command=True)


#: Whether the commands that can answer through :mod:`service.db.light` (without SQLAlchemy) do; tests turn it
#: off to compare both paths' output (tests/service/db/test_light.py).
LIGHT_READS = True
#: The commands that read through :mod:`service.db.light` when they can (the others always open the store).
LIGHT_COMMANDS = frozenset({"runs"})


def _light_reader() -> LightReader | None:
    """A read-only reader of this process's database whose schema is at head (:func:`service.db.light.open_light`),
    or None where the store must answer (reads off, a URL the light path does not read, an embedded SQLite the
    store creates or upgrades).  Ends start-up once it is open, as :func:`open_store` does."""
    if not LIGHT_READS:
        return None
    from service.db.light import open_light
    from service.settings import Settings

    settings = Settings.from_env()
    reader = open_light(settings.effective_database_url, may_upgrade=not settings.database_url)
    if reader is not None:
        startup_complete()
    return reader


def _listed_runs(args: argparse.Namespace) -> tuple[list[RunInfo], dict[int, tuple[int, tuple[int, ...]]]]:
    """The runs ``ampci runs`` lists and what later runs resolved of each: read through the light path when it
    can (none of the runs needs its verdict recorded: listing a finished run without one judges and stores it,
    which the store does), else through the store (:func:`service.orchestration.judge.listed_verdicts`)."""
    from service.db.light import Unreadable

    reader = _light_reader()
    if reader is not None:
        with reader:
            try:
                runs = reader.list_runs(limit=args.limit, revision=args.revision, trigger=args.trigger,
                                        status=args.status)
                if not any(r.verdict is None and r.finished_at is not None for r in runs):
                    return runs, reader.resolved_since(r.id for r in runs)
            except Unreadable:
                pass  # a value only the store reads (as it does)
    from service.orchestration.judge import listed_verdicts

    store = open_store()
    return listed_verdicts(store, store.list_runs(limit=args.limit, revision=args.revision, trigger=args.trigger,
                                                  status=args.status))


def cmd_runs(args: argparse.Namespace) -> int:
    """List runs."""
    if not (args.json or args.csv):  # no table, no rich; a table's modules are imported during start-up
        from service.cli.tables import runs_table

    runs, resolved = _listed_runs(args)
    rows = [{**r.to_dict(), "resolved_since": ({"regressions": resolved[r.id][0], "runs": list(resolved[r.id][1])}
                                               if r.id in resolved else None)} for r in runs]
    if args.json or args.csv:
        emit(args, rows)
        return 0
    out = console(args)
    emit(args, rows, runs_table(runs, out.width, resolved), out=out)
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """Show one run."""
    from service.cli.tables import jobs_table, runs_table
    from service.orchestration.judge import listed_verdicts

    store = open_store()
    run, jobs, summary = store.get_run(args.run_id), store.jobs(args.run_id), store.run_summary(args.run_id)
    (run,), resolved = listed_verdicts(store, [run])  # its stored verdict, a later resolution beside it
    messages = [f"{r.model} {r.dtype}/{r.policy}/{r.target} {r.status}: {r.message}"
                for r in store.results(run_id=args.run_id)
                if r.message and r.status != "pass"]
    out = console(args)
    emit(args, {"run": run.to_dict(), "summary": summary.to_dict(), "description": summary.describe(),
                "jobs": [j.to_dict() for j in jobs]}, runs_table([run], out.width, resolved), summary.describe(),
         jobs_table(jobs, out.width), *(["messages (full):", *messages] if messages else []), out=out)
    return 0


def cmd_results(args: argparse.Namespace) -> int:
    """Filtered results; with ``--stderr`` (and always in ``--json``) the pass's stderr tail of each failed
    result (:mod:`service.db.tails`)."""
    from service.cli.tables import results_table
    from service.db.tails import stderr_tails

    store = open_store()
    rows = store.results(run_id=args.run_id, revision=args.revision, model=args.model, dtype=args.dtype,
                         policy=args.policy, target=args.target, status=args.status, limit=args.limit)
    want = args.json or args.csv or args.stderr
    tails = stderr_tails(store, [r.id for r in rows if r.status != "pass"]) if want else {}
    dicts = [r.to_dict() | ({"stderr_tail": tails[r.id]} if r.id in tails else {}) for r in rows]
    out = console(args)
    shown = [f"stderr of {r.model} {r.dtype}/{r.policy}/{r.target} {r.status} (run {r.run_id}):\n"
             + "\n".join(f"  {line}" for line in tails[r.id].splitlines())
             for r in rows if args.stderr and r.id in tails]
    emit(args, dicts, results_table(rows, out.width), *shown, out=out)
    return 0


def cmd_regressions(args: argparse.Namespace) -> int:
    """Findings; exit 1 when --revision/--run has open regressions, or (--run) the run's gate fails (a cell
    that could not measure: :mod:`service.regressions.verdict`)."""
    from service.cli.tables import regressions_table

    store = open_store()
    if args.run_id is not None:
        store.get_run(args.run_id)
    since = args.since  # a datetime: --since's type (service.cli.argtypes.since_time) parsed it
    regs = store.regressions(state="open" if args.open else None, since=since, revision=args.revision,
                             run_id=args.run_id, category=args.category, limit=args.limit)
    out = console(args)
    emit(args, [r.to_dict() for r in regs], regressions_table(regs, out.width), out=out)
    # --revision gates on the open findings at that revision; --run on the run's stored verdict alone
    blocking = [r for r in regs if r.category == "regression" and r.state == "open"] if args.run_id is None else []
    failed = False
    # --run: the run's whole verdict: cells that could not measure fail it too, and cells without a baseline
    # are said to be not compared (--revision gates on the open findings at that revision, which triage clears)
    run_id = args.run_id
    if run_id is not None:
        import sys

        from service.orchestration.judge import run_verdict

        verdict = run_verdict(store, run_id)
        failed = bool(verdict.exit_code)
        print(f"run {run_id}: {verdict.headline()}", file=sys.stderr if args.json or args.csv else sys.stdout)
        if not (args.json or args.csv):
            for reason in verdict.decision.reasons:
                print(f"  {reason}")
    return 1 if (args.revision is not None and blocking) or failed else 0


def cmd_compare(args: argparse.Namespace) -> int:
    """Compare two revisions."""
    from service.cli.revision_lookup import resolve_with_results

    if not (args.json or args.csv):  # no table, no rich; a table's modules are imported during start-up
        from service.cli.tables import compare_table
    store = open_store()  # branch, tag or short sha, like --revision; a revision without results says so
    a, b = resolve_with_results(store, args.rev_a), resolve_with_results(store, args.rev_b)
    rows = store.compare(a, b)
    if args.json or args.csv:
        cells = [r.to_dict() for r in rows]
        emit(args, {"a": a, "b": b, "cells": cells}, rows=cells)
        return 0
    out = console(args)
    emit(args, {"a": a, "b": b, "cells": [r.to_dict() for r in rows]}, compare_table(rows, a, b, out.width), out=out)
    return 0


def cmd_history(args: argparse.Namespace) -> int:
    """History of one metric of a model (every dtype/policy/target, or those given), with a chart per cell
    (:mod:`service.cli.charts`)."""
    from service.cli.charts import history_charts
    from service.cli.tables import history_table
    from service.vocabulary import metric_column

    metric = metric_column(args.metric)
    points = open_store().history(args.model, args.dtype, policy=args.policy, target=args.target, metric=metric,
                                  limit=args.limit)
    out = console(args)
    dicts = [p.to_dict() for p in points]
    emit(args, {"model": args.model, "dtype": args.dtype, "metric": metric, "points": dicts},
         history_table(points, metric, out.width), *history_charts(points, args.model, metric, out.width), out=out,
         rows=dicts)
    return 0


def cmd_ack(args: argparse.Namespace) -> int:
    """Acknowledge a finding."""
    store = open_store()
    reg = store.ack(args.regression_id, by=args.by, false_positive=args.false_positive, note=args.note)
    from service.orchestration.judge import record_verdict

    record_verdict(store, reg.run_id)  # a false positive can turn the run's gate: `ampci runs` follows
    from service.cli.pr_refresh import refresh_pr_report

    refresh_pr_report(store, reg.run_id)
    emit(args, reg.to_dict(), f"regression {reg.id} ({reg.kind} {'/'.join(reg.cell)}): {reg.state}")
    return 0
