"""The console script starts with the cyclic garbage collector paused (issue 25, service/cli/startup.py):
start-up's imports allocate only long-lived objects, so ``entry()`` turns the collector off, and it is on
again -- start-up's heap frozen out of it -- before the command's own work: just before the command runs, or
for a query command once its store is open (its store and driver imports are start-up too).  ``main()``
called as a library never touches the collector."""

from __future__ import annotations

import gc
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from service.cli import query_cmd, zoo_cmd
from service.cli.main import entry, main


@pytest.fixture
def collector() -> Iterator[None]:
    """This test process's collector on and unfrozen before and after (entry() freezes the heap)."""
    gc.enable()
    gc.unfreeze()
    yield
    gc.unfreeze()
    gc.enable()


@pytest.fixture
def embedded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AMPCI_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("AMPCI_DATABASE_URL", raising=False)
    monkeypatch.delenv("AMPCI_BROKER_URL", raising=False)


def _state() -> tuple[bool, int]:
    return gc.isenabled(), gc.get_freeze_count()


def _run_entry(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(sys, "argv", ["ampci", *argv])
    with pytest.raises(SystemExit) as exited:
        entry()
    return int(exited.value.code or 0)


def _recording(fn: Callable[..., Any], seen: list[tuple[bool, int]], after: bool = False) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not after:
            seen.append(_state())
        out = fn(*args, **kwargs)
        if after:
            seen.append(_state())
        return out
    return wrapper


def test_a_command_runs_with_the_collector_on_and_startup_frozen(
        collector: None, embedded: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """``ampci zoo list``: its function runs with the collector on and start-up's objects frozen out of it
    (a long-lived command -- serve, worker, sweep -- is collected as usual)."""
    seen: list[tuple[bool, int]] = []
    monkeypatch.setattr(zoo_cmd, "_list", _recording(zoo_cmd._list, seen))
    assert _run_entry(["zoo", "list", "--json"], monkeypatch) == 0
    assert json.loads(capsys.readouterr().out)  # the zoo's entries
    [(enabled, frozen)] = seen
    assert enabled and frozen > 10_000, (enabled, frozen)
    assert gc.isenabled()


def test_a_query_command_ends_startup_once_its_store_is_open(
        collector: None, embedded: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """``ampci runs --json``: the collector is still paused when the store is opened (the store's modules,
    SQLAlchemy's dialect and the driver load then) and on, start-up frozen, once it is open."""
    before: list[tuple[bool, int]] = []
    after: list[tuple[bool, int]] = []
    monkeypatch.setattr(query_cmd, "open_store",
                        _recording(_recording(query_cmd.open_store, after, after=True), before))
    assert _run_entry(["runs", "--json"], monkeypatch) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert before == [(False, 0)]
    [(enabled, frozen)] = after
    assert enabled and frozen > 10_000, (enabled, frozen)


def test_a_failed_startup_leaves_the_collector_on(collector: None, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A query command that fails before its store is open (a malformed database URL: exit 2) still leaves
    the collector on."""
    monkeypatch.setenv("AMPCI_DATABASE_URL", "nosuchdb://")
    assert _run_entry(["runs", "--json"], monkeypatch) == 2
    assert "error" in capsys.readouterr().err
    assert gc.isenabled()


def test_main_as_a_library_leaves_the_collector_alone(collector: None, embedded: None,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Tests and benchmarks call main(): the collector stays on and nothing is frozen."""
    seen: list[tuple[bool, int]] = []
    original = query_cmd.open_store
    query_cmd.open_store = _recording(original, seen)  # type: ignore[assignment]
    try:
        assert main(["runs", "--json"]) == 0
    finally:
        query_cmd.open_store = original  # type: ignore[assignment]
    assert seen == [(True, 0)] and _state() == (True, 0)
    capsys.readouterr()
