"""Rough edges a new user hits (issue 18): sweep progress counts failed cells, the sweep table at 80
columns, ``db downgrade`` asks first, and a closed output pipe ends any command quietly."""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from service.cli.main import BROKEN_PIPE_EXIT, main
from service.cli.sweep_cmd import _emit, _wait_with_progress, compared_cells
from service.db import migrate
from service.orchestration.scheduler import StartedRun
from tests.service.factories import CELL, chain, make_result, migrated_store, run_with

ROOT = Path(__file__).resolve().parents[3]
LONG = ("NotImplementedError: the pass has no rule for op type ScatterND with reduction='max' at opset 18 "
        "(node /blocks.3/ScatterND_1)")
WIDE_CELL = ("mini_resnet_block", "bf16", "conservative", "cpu")


def test_sweep_progress_counts_failed_results_not_only_failed_jobs(sqlite_url: str,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A job that ends ``done`` with a ``convert_error`` (or ``fail_accuracy``) result is a failed cell;
    so is a crashed job without a result; a passing result wins over its job's error."""
    store = migrated_store(sqlite_url)
    shas = chain(store, 1)
    crashed = ("crashy", "fp16", "default", "cpu")
    run_id = run_with(store, shas[0], [make_result(CELL), make_result(WIDE_CELL, status="convert_error"),
                                       make_result(("acc", "fp16", "default", "cpu"), status="fail_accuracy")],
                      trigger="manual", detect=False)
    assert {j.status for j in store.jobs(run_id)} == {"done"}  # the old count (job statuses) said 0 failed
    other = store.create_run(shas[0], "manual", cells=[crashed, CELL])
    job = next(j for j in store.jobs(other) if j.cell == crashed)
    store.mark_job(job.id, "crashed", error="worker died")
    store.write_result(other, make_result(CELL))
    store.mark_job(next(j for j in store.jobs(other) if j.cell == CELL).id, "error")  # the result says pass
    capsys.readouterr()
    _wait_with_progress(store, run_id, 3, timeout=5)
    assert "2 failed" in capsys.readouterr().err
    _wait_with_progress(store, other, 2, timeout=5)
    assert "1 failed" in capsys.readouterr().err
    store.dispose()


def _sweep_table(store: object, run_id: int, capsys: pytest.CaptureFixture[str]) -> str:
    results = store.results(run_id=run_id)  # type: ignore[attr-defined]
    run = store.get_run(run_id)  # type: ignore[attr-defined]
    comparison = compared_cells(store, run_id, len(results), None, 0)
    _emit(argparse.Namespace(json=False), {}, (run, results, [], StartedRun(run_id, run.revision_sha, None,
                                                                            len(results), created=True), comparison))
    return capsys.readouterr().out


@pytest.mark.parametrize("columns", ["80", "170"])
def test_sweep_table_is_readable_at_80_columns(columns: str, sqlite_url: str, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """No cell, status or number is cut to ``…``, nothing runs past the width, and the whole message is
    printed (at 80 columns below the table, one line per failed cell)."""
    monkeypatch.setenv("COLUMNS", columns)
    store = migrated_store(sqlite_url)
    bad = make_result(WIDE_CELL, status="convert_error")
    bad.message = LONG
    run_id = run_with(store, chain(store, 1)[0], [make_result(CELL), bad], trigger="manual")
    out = _sweep_table(store, run_id, capsys)
    assert "…" not in out
    assert max(len(line) for line in out.splitlines()) <= int(columns)
    assert "convert_error" in out and "0.99990" in out
    flat = " ".join(line.strip("│ ").replace(" │ ", " ") for line in out.splitlines())
    for word in LONG.split():
        assert word in out or word in flat.replace(" ", ""), word
    if columns == "80":
        assert f"{WIDE_CELL[0]} bf16/conservative/cpu convert_error: NotImplementedError:" in out
        assert " ".join(out.split()).count(" ".join(LONG.split())) == 1  # whole, once
    store.dispose()


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_db_downgrade_needs_yes_or_a_typed_yes(sqlite_url: str, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("AMPCI_DATABASE_URL", sqlite_url)
    migrate.upgrade(sqlite_url)
    head = migrate.head()
    for argv in (["db", "downgrade", "--revision", "base"], ["db", "downgrade"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("ampci: error: db downgrade") and "--yes" in err
        assert migrate.current(sqlite_url) == head  # nothing dropped
    monkeypatch.setattr(sys, "stdin", _Terminal("no\n"))  # a terminal: asked, and refused
    assert main(["db", "downgrade", "--revision", "base"]) == 2
    assert "not confirmed" in capsys.readouterr().err and migrate.current(sqlite_url) == head
    monkeypatch.setattr(sys, "stdin", _Terminal("yes\n"))
    assert main(["db", "downgrade", "--revision", "base"]) == 0
    assert migrate.current(sqlite_url) is None
    migrate.upgrade(sqlite_url)
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    assert main(["db", "downgrade", "--revision", "base", "--yes"]) == 0
    assert migrate.current(sqlite_url) is None


@pytest.mark.parametrize("argv", [["zoo", "list", "--json"], ["runs"], ["runs", "--json"]])
def test_closed_output_pipe_ends_quietly(argv: list[str], tmp_path: Path) -> None:
    """``ampci zoo list --json | head``: the reader is gone before ampci writes (a pipe whose read end is
    closed): no traceback, nothing on stderr, exit 141 as a tool killed by SIGPIPE."""
    read, write = os.pipe()
    os.close(read)
    env = {**os.environ, "AMPCI_DATA_DIR": str(tmp_path), "AMPCI_DATABASE_URL": ""}
    try:
        proc = subprocess.run([sys.executable, "-m", "service.cli.main", *argv], stdout=write,
                              stderr=subprocess.PIPE, env=env, cwd=ROOT, timeout=120)
    finally:
        os.close(write)
    assert proc.stderr.decode() == "" and proc.returncode == BROKEN_PIPE_EXIT
