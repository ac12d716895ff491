"""A CLI that answers at once (issue 25): help and query commands import none of the model stack
(onnx, onnx_ir, numpy, onnxruntime, amp_pass) nor Alembic.  Each command runs in a fresh interpreter and
its ``sys.modules`` is checked, so a module-level import that drags them back in fails here.  The
commands are enumerated from the argparse tree, so a new command is covered without editing this file."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.cli.main import COMMAND_MODULES, COMMANDS, build_parser, command_modules
from service.db import migrate
from tests.service.factories import CELL, chain, make_result, migrated_store, run_with

ROOT = Path(__file__).resolve().parents[3]
#: packages no help or query command may import
FORBIDDEN = frozenset({"onnx", "onnx_ir", "numpy", "onnxruntime", "amp_pass", "alembic", "ml_dtypes", "sympy"})
#: the pass's stdlib-only modules a help page may load: the declaration of its convert options (``ampci
#: convert --help``); any other amp_pass module is the model stack.  Query commands load no amp_pass at all
#: (service.vocabulary spells the policy names and targets; tests/service/test_vocabulary.py)
LIGHT_AMP_PASS = frozenset({"amp_pass", "amp_pass.errors", "amp_pass.policy", "amp_pass.cli_args"})

_PROBE = """
import json, sys
from service.cli.main import main
try:
    rc = main(sys.argv[1:])
except SystemExit as exc:
    rc = exc.code
print("\\n@@" + json.dumps({"rc": rc, "modules": sorted(sys.modules)}))
"""


def _command_paths(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every command path of the argparse tree: (), ("runs",), ("db",), ("db", "upgrade"), ..."""
    yield path
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _command_paths(sub, (*path, name))


def _imports(argv: list[str], env: dict[str, str], forbidden: frozenset[str] = FORBIDDEN,
             allowed: frozenset[str] = LIGHT_AMP_PASS) -> tuple[int, set[str]]:
    """(exit status, modules of ``forbidden`` in sys.modules, less those ``allowed``) of ``ampci ARGV`` in a
    fresh interpreter."""
    proc = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=120)
    assert "@@" in proc.stdout, proc.stderr
    report = json.loads(proc.stdout.rsplit("@@", 1)[1])
    return report["rc"], {m for m in report["modules"]
                          if (m.split(".")[0] in forbidden or m in forbidden) and m not in allowed}


def _env(tmp_path: Path, db_url: str = "") -> dict[str, str]:
    return {**os.environ, "AMPCI_DATA_DIR": str(tmp_path), "AMPCI_DATABASE_URL": db_url, "COLUMNS": "120"}


def test_command_table_matches_what_the_modules_register() -> None:
    """COMMANDS (what ``ampci --help`` shows without importing a command module) names every command the
    modules register, in their order, with the same module and help line."""
    full = build_parser()
    sub = next(a for a in full._actions if isinstance(a, argparse._SubParsersAction))
    registered = {a.dest: a.help for a in sub._choices_actions}
    assert list(registered) == list(COMMANDS), "service/cli/main.py COMMANDS lists other commands"
    assert registered == {name: c.help for name, c in COMMANDS.items()}, "a help line in COMMANDS is stale"
    assert set(COMMAND_MODULES) == {c.module for c in COMMANDS.values()}
    for name, spec in COMMANDS.items():  # each command is registered by the module COMMANDS names
        lone = build_parser([spec.module])
        lone_sub = next(a for a in lone._actions if isinstance(a, argparse._SubParsersAction))
        command = lone_sub.choices[name]  # registered by the module, not a stub: it runs or has sub-commands
        assert "func" in command._defaults or command._subparsers is not None, f"{spec.module} lacks {name}"
    assert command_modules(["--help"]) == [] and command_modules(["nosuch"]) == []
    assert command_modules(["runs", "--json"]) == ["service.cli.query_cmd"]


def test_stored_head_is_alembics_head() -> None:
    """migrate.head() (read from the migration files, no Alembic import) is the head Alembic computes."""
    assert migrate.head() == migrate.alembic_head()


def test_schema_check_reads_the_stored_revision_without_alembic(sqlite_url: str) -> None:
    """current()/stored_revision() see no table, then the revision an upgrade recorded."""
    assert migrate.current(sqlite_url) is None
    migrate.upgrade(sqlite_url)
    assert migrate.current(sqlite_url) == migrate.head()


HELP_PATHS = list(_command_paths(build_parser()))


def test_help_paths_cover_every_command_and_verb() -> None:
    """The parametrisation below walks the whole argparse tree: every command, and the verbs under
    ``db`` and ``zoo`` (a walk that stopped at the top level would leave ``convert --help`` unchecked)."""
    assert {p[0] for p in HELP_PATHS if p} == set(COMMANDS)
    assert {("convert",), ("zoo", "list"), ("zoo", "add"), ("db", "upgrade")} <= set(HELP_PATHS)


@pytest.mark.parametrize("path", HELP_PATHS, ids=lambda p: " ".join(p) or "ampci")
def test_help_imports_no_model_stack(path: tuple[str, ...], tmp_path: Path) -> None:
    """``ampci [COMMAND [VERB]] --help`` imports none of FORBIDDEN (``convert`` included: its options are
    declared without importing amp_pass.cli or workers.revision.autoconvert)."""
    rc, heavy = _imports([*path, "--help"], _env(tmp_path))
    assert rc == 0
    assert not heavy, f"`ampci {' '.join(path)} --help` imports {sorted(heavy)}"


def test_convert_usage_error_imports_no_model_stack(tmp_path: Path) -> None:
    """A convert usage error (here: -o missing) is answered from the declared options, exit 2."""
    rc, heavy = _imports(["convert", "model.onnx"], _env(tmp_path))
    assert rc == 2 and not heavy, f"exit {rc}, imports {sorted(heavy)}"


def _signature(parser: argparse.ArgumentParser) -> list[tuple[object, ...]]:
    """What an option is to a user and to the command: kind, strings, destination, default, choices,
    nargs, required, help, metavar, const and type (Path/int/float/None, or "custom": a custom type's
    behaviour is compared separately)."""
    return [(type(a).__name__, tuple(a.option_strings), a.dest, a.default,
             None if a.choices is None else list(a.choices), a.nargs, a.required, a.help, a.metavar, a.const,
             a.type if a.type in (None, Path, int, float) else "custom")
            for a in parser._actions]


def test_convert_declares_the_options_of_amp_pass_and_autoconvert() -> None:
    """``ampci convert``'s options are exactly those of ``amp_pass.cli.add_convert_arguments`` +
    ``workers.revision.autoconvert.add_auto_arguments`` (which the command runs with), and the dtype names the
    numpy-free declaration offers are the pass's own ``amp_pass.options.DTYPES``."""
    from amp_pass.cli import add_convert_arguments
    from amp_pass.cli_args import DTYPE_NAMES
    from amp_pass.options import DTYPES
    from service.cli import convert_cmd
    from workers.revision.autoconvert import add_auto_arguments

    reference, declared = argparse.ArgumentParser(), argparse.ArgumentParser()
    add_convert_arguments(reference)
    add_auto_arguments(reference)
    convert_cmd.add_arguments(declared)
    assert _signature(declared) == _signature(reference)
    assert DTYPE_NAMES == tuple(sorted(DTYPES))


def test_task_metric_names_are_the_computed_task_metrics() -> None:
    """The zoo manifest validates ``task`` against workers.tolerance (numpy-free); workers.measure.metrics computes
    exactly those."""
    from workers.measure.metrics import TASK_METRICS
    from workers.tolerance import TASK_METRIC_NAMES

    assert tuple(TASK_METRICS) == TASK_METRIC_NAMES


@pytest.mark.parametrize("argv", [["zoo", "list"], ["zoo", "list", "--json"], ["zoo", "list", "--tag", "smoke"]],
                         ids=" ".join)
def test_zoo_list_imports_no_model_stack(argv: list[str], tmp_path: Path) -> None:
    """Listing the zoo reads the manifests (built-in and user zoo) and loads none of FORBIDDEN."""
    rc, heavy = _imports(argv, _env(tmp_path))
    assert rc == 0 and not heavy, f"`ampci {' '.join(argv)}` exited {rc}, imports {sorted(heavy)}"


def _query_argvs(store_url: str) -> dict[str, list[str]]:
    """A real query for each read-only command over a store holding two revisions."""
    store = migrated_store(store_url)
    a, b = chain(store, 2)
    run_with(store, a, [make_result(CELL)])
    run_id = run_with(store, b, [make_result(CELL, max_abs=0.5)])
    store.dispose()
    model, dtype = CELL[0], CELL[1]
    return {
        "runs": ["runs", "--json"], "run": ["run", str(run_id)], "results": ["results", "--run", str(run_id)],
        "regressions": ["regressions", "--run", str(run_id), "--json"], "compare": ["compare", a[:12], b[:12]],
        "history": ["history", model, "--dtype", dtype, "--target", CELL[3], "--policy", CELL[2]], "deliveries": ["deliveries", "--json"],
        "db current": ["db", "current"],
    }


#: read-only commands that must be covered by _query_argvs (the query module's, and the other readers)
QUERY_COMMANDS = {name for name, c in COMMANDS.items() if c.module == "service.cli.query_cmd"} - {"ack"} | {
    "deliveries", "db current"}


def _format_variants(argv: list[str]) -> list[list[str]]:
    """``argv`` as a table, and with ``--json`` / ``--csv`` where its command has them (read from the parser)."""
    parser = build_parser(command_modules(argv))
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[argv[0]]
    if argv[0] == "db":
        return [argv]
    options = {s for a in sub._actions for s in a.option_strings}
    bare = [w for w in argv if w not in ("--json", "--csv")]
    return [bare, *([*bare, f] for f in ("--json", "--csv") if f in options)]


def test_queries_import_no_model_stack_nor_alembic(tmp_path: Path) -> None:
    """Every query command, its --target/--policy filters validated, as a table and with --json and --csv,
    imports none of FORBIDDEN, not even the pass's light modules (issue 42)."""
    url = f"sqlite:///{tmp_path / 'q.sqlite3'}"
    argvs = _query_argvs(url)
    assert set(argvs) == QUERY_COMMANDS, "a query command has no probe here"
    for variant in (v for argv in argvs.values() for v in _format_variants(argv)):
        rc, heavy = _imports(variant, _env(tmp_path, url), allowed=frozenset())
        assert rc in (0, 1), f"`ampci {' '.join(variant)}` exited {rc}"  # regressions exits 1 when open ones exist
        assert not heavy, f"`ampci {' '.join(variant)}` imports {sorted(heavy)}"


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_runs_imports_no_sqlalchemy(backend: str, tmp_path: Path) -> None:
    """``ampci runs`` (table, --json, --csv) reads through service.db.light: no SQLAlchemy, no Alembic, none of
    FORBIDDEN, on the embedded SQLite and on PostgreSQL (issue 42: ``ampci runs`` within 3x ``python -c pass``
    + 0.1 s; bench/bench_cli.py)."""
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'q.sqlite3'}"
        argvs = _query_argvs(url)
        env = _env(tmp_path, "")  # nothing configured: the embedded store (created and upgraded first)
        (tmp_path / "q.sqlite3").rename(tmp_path / "ampci.sqlite3")
    else:
        from tests.conftest import fresh_pg_database

        pg = fresh_pg_database()
        url = next(pg)
        argvs = _query_argvs(url)
        env = _env(tmp_path, url)
    try:
        for variant in _format_variants(argvs["runs"]):
            rc, heavy = _imports(variant, env, FORBIDDEN | {"sqlalchemy"}, frozenset())
            assert rc == 0 and not heavy, f"`ampci {' '.join(variant)}` exited {rc}, imports {sorted(heavy)}"
    finally:
        if backend == "postgres":
            next(pg, None)


def test_json_answers_build_no_table(tmp_path: Path) -> None:
    """``runs --json`` and ``compare --json`` print JSON without importing rich (its console and tables), and
    no query imports the SQLAlchemy ORM (the store is Core tables and statements)."""
    url = f"sqlite:///{tmp_path / 'q.sqlite3'}"
    argvs = _query_argvs(url)
    for argv in (argvs["runs"], [*argvs["compare"], "--json"]):
        rc, heavy = _imports(argv, _env(tmp_path, url), FORBIDDEN | {"rich", "sqlalchemy.orm"}, frozenset())
        assert rc == 0 and not heavy, f"`ampci {' '.join(argv)}` exited {rc}, imports {sorted(heavy)}"
