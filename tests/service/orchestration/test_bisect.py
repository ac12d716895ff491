"""Bisection: midpoints between baseline and regressed revision, narrowing, skipping unbuildable commits."""

from __future__ import annotations

import json
import math

import pytest

from service.cli.main import main
from service.db import Store
from service.errors import NotFoundError
from service.orchestration.bisection import bisect_step
from service.orchestration.judge import detect_run
from service.regressions.bisect import classify, pick
from service.regressions.rules import CellSample
from service.regressions.thresholds import Thresholds
from tests.service.factories import chain, make_result, migrated_store, run_with, sha


def setup_regression(store: Store, n: int) -> tuple[list[str], int, int]:
    shas = chain(store, n)
    run_with(store, shas[0], [make_result(max_abs=1e-3)])
    bad_run = run_with(store, shas[-1], [make_result(status="fail_accuracy", max_abs=0.4)])
    (reg,) = store.regressions(run_id=bad_run)
    return shas, bad_run, reg.id


def work(store: Store, run_ids: list[int], shas: list[str], first_bad: int, unbuildable: set[int]) -> None:
    """Play the worker for queued bisect runs: write the result each commit would produce."""
    for run_id in run_ids:
        run = store.get_run(run_id)
        i = shas.index(run.revision_sha)
        if i in unbuildable:
            result = make_result(status="convert_error")
        elif i >= first_bad:
            result = make_result(status="fail_accuracy", max_abs=0.4, seed=i)
        else:
            result = make_result(max_abs=1e-3, seed=i)
        store.write_result(run_id, result)
        store.finish_run(run_id)


@pytest.mark.parametrize(("first_bad", "unbuildable"), [(5, set()), (1, set()), (16, set()), (9, {8, 7})])
def test_bisect_finds_first_bad_commit(sqlite_url: str, first_bad: int, unbuildable: set[int]) -> None:
    store = migrated_store(sqlite_url)
    shas, _, reg_id = setup_regression(store, 17)
    enqueued: list[int] = []
    steps = 0
    while True:
        state = bisect_step(store, reg_id, enqueue=enqueued.append)
        if state.status == "found":
            break
        assert state.status == "queued" and len(state.queued_runs) == 1
        assert bisect_step(store, reg_id, enqueue=enqueued.append).status == "waiting"  # no duplicate runs
        work(store, list(state.queued_runs), shas, first_bad, unbuildable)
        steps += 1
        assert steps <= 10
    assert state.first_bad == shas[first_bad]
    assert steps <= math.ceil(math.log2(15)) + len(unbuildable)
    assert len(enqueued) == steps == len(store.list_runs(trigger="bisect"))
    assert set(state.skipped) <= {shas[i] for i in unbuildable}
    assert all(state.verdicts[shas[i]] == "skip" for i in unbuildable if shas[i] in state.verdicts)
    assert shas[first_bad][:12] in state.describe()


def test_adjacent_commits_need_no_runs_and_parallel_picks(db_url: str) -> None:
    store = migrated_store(db_url)
    _, _, reg_id = setup_regression(store, 2)
    state = bisect_step(store, reg_id)
    assert (state.status, state.remaining, state.queued_runs) == ("found", 0, ())
    assert pick(list(range(1, 16)), 1) == [8] and pick(list(range(1, 16)), 3) == [4, 8, 12]
    assert pick([3], 5) == [3]
    store.dispose()


def test_classify_conversion_and_skips() -> None:
    th = Thresholds()
    ok, bad = CellSample("pass", max_abs=1e-3), CellSample("convert_error")
    assert classify("conversion", ok, bad, CellSample("pass"), th, "m", "fp16") == "good"
    assert classify("conversion", ok, bad, CellSample("convert_error"), th, "m", "fp16") == "bad"
    assert classify("conversion", ok, bad, CellSample("timeout"), th, "m", "fp16") == "skip"
    assert classify("conversion", ok, bad, CellSample("bad_model"), th, "m", "fp16") == "skip"
    worse = CellSample("fail_accuracy", max_abs=0.5)
    assert classify("accuracy", ok, worse, CellSample("crash"), th, "m", "fp16") == "skip"
    assert classify("accuracy", ok, worse, CellSample("pass", max_abs=1e-3), th, "m", "fp16") == "good"
    assert classify("accuracy", ok, worse, CellSample("fail_accuracy", max_abs=0.3), th, "m", "fp16") == "bad"


def test_bisect_cli(sqlite_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    store = migrated_store(sqlite_url)
    shas, bad_run, reg_id = setup_regression(store, 9)
    monkeypatch.setenv("AMPCI_DATABASE_URL", sqlite_url)
    monkeypatch.delenv("AMPCI_BROKER_URL", raising=False)
    assert main(["bisect", "--run", str(bad_run), "--step", "--json"]) == 0
    (state,) = json.loads(capsys.readouterr().out)
    assert state["status"] == "queued" and state["regression_id"] == reg_id and len(state["queued_runs"]) == 1
    assert main(["bisect", "--run", str(bad_run), "--step"]) == 0
    assert "waiting for" in capsys.readouterr().out
    # nothing to bisect is never an empty answer with exit 0
    good_run = store.list_runs(revision=shas[0])[0].id
    assert main(["bisect", "--run", str(good_run), "--json"]) == 1
    out = capsys.readouterr()
    assert out.out == "" and "no open regressions" in out.err
    orphan = sha(900)  # no recorded ancestry back to its baseline
    store.upsert_revision(orphan, [], "elsewhere")
    lost = run_with(store, orphan, [make_result(status="fail_accuracy", max_abs=0.4)], trigger="manual",
                    baseline=shas[0])
    assert len(store.regressions(run_id=lost)) == 1
    assert main(["bisect", "--run", str(lost), "--json"]) == 1
    assert "cannot be bisected" in capsys.readouterr().err
    assert main(["bisect", "--run", str(bad_run), "--regression", "999"]) == 2
    assert main(["bisect", "--run", "999"]) == 2
    with pytest.raises(SystemExit) as refused:  # a typed option: argparse's usage error (issue 24)
        main(["bisect", "--run", str(bad_run), "--parallel", "0"])
    assert refused.value.code == 2
    monkeypatch.delenv("AMPCI_BROKER_URL", raising=False)
    assert main(["bisect", "--run", str(bad_run), "--dispatch"]) == 2
    assert "AMPCI_BROKER_URL" in capsys.readouterr().err


def test_unknown_regression(sqlite_url: str) -> None:
    store = migrated_store(sqlite_url)
    with pytest.raises(NotFoundError):
        bisect_step(store, 1)


def test_bisect_runs_store_no_open_regressions(db_url: str, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    store = migrated_store(db_url)
    shas, bad_run, reg_id = setup_regression(store, 9)
    (run_id,) = bisect_step(store, reg_id).queued_runs
    mid = store.get_run(run_id)
    store.write_result(run_id, make_result(status="fail_accuracy", max_abs=0.4))  # the midpoint is bad too
    store.finish_run(run_id)
    assert detect_run(store, run_id) == [] and detect_run(store, run_id) == []
    assert [r.id for r in store.regressions(state="open")] == [reg_id]
    # ... yet the bisection still uses its result
    assert bisect_step(store, reg_id).verdicts[mid.revision_sha] == "bad"
    monkeypatch.setenv("AMPCI_DATABASE_URL", db_url)
    assert main(["regressions", "--open", "--json"]) == 0
    assert [r["id"] for r in json.loads(capsys.readouterr().out)] == [reg_id]
    assert main(["regressions", "--revision", mid.revision_sha]) == 0  # the CI gate ignores bisect runs
    assert main(["regressions", "--revision", shas[-1]]) == 1
    store.dispose()
