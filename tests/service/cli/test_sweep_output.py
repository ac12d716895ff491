"""`ampci sweep`'s closing line says how many cells had a baseline result to compare with."""

from __future__ import annotations

import argparse
import json

import pytest

from service.cli.sweep_cmd import _emit, compared_cells
from service.orchestration.judge import baseline_revisions
from service.orchestration.scheduler import StartedRun
from tests.service.factories import CELL, chain, make_result, migrated_store, run_with

OTHER = ("tiny_mlp", "bf16", "default", "cpu")


def _print(store, run_id: int, baseline: str | None, as_json: bool, capsys: pytest.CaptureFixture[str]) -> str:
    results = store.results(run_id=run_id)
    regs = [r for r in store.regressions(run_id=run_id, category="regression") if r.state == "open"]
    comparison = compared_cells(store, run_id, len(results), baseline, len(regs))
    run = store.get_run(run_id)
    started = StartedRun(run_id, run.revision_sha, baseline, len(results), created=True)
    _emit(argparse.Namespace(json=as_json), {"comparison": comparison},
          (run, results, regs, started, comparison))
    return capsys.readouterr().out


def test_first_run_compares_nothing_and_says_so(db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    store = migrated_store(db_url)
    shas = chain(store, 3)
    first = run_with(store, shas[1], [make_result(CELL), make_result(OTHER)], trigger="manual")
    assert baseline_revisions(store, first) == {}
    out = _print(store, first, shas[0], False, capsys)
    assert "no baseline results yet: first run of these cells" in out and "no regressions" not in out
    c = json.loads(_print(store, first, shas[0], True, capsys))["comparison"]
    assert (c["compared"], c["cells"], c["without_baseline"]) == (0, 2, 2)

    # the next revision: one cell has a baseline result at shas[1], the new one has none
    third = ("conv_net", "fp16", "default", "cpu")
    second = run_with(store, shas[2], [make_result(CELL), make_result(third)], trigger="manual")
    assert baseline_revisions(store, second) == {CELL: shas[1]}
    out = _print(store, second, shas[1], False, capsys)
    assert (f"no regressions in 1 compared cells (against baseline {shas[1][:12]}); 1 not compared (no baseline "
            "result)") in out
    c = json.loads(_print(store, second, shas[1], True, capsys))["comparison"]
    assert (c["compared"], c["without_baseline"], c["baseline_revisions"]) == (1, 1, [shas[1]])
    store.dispose()


def test_regressions_title_counts_compared_cells(sqlite_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    store = migrated_store(sqlite_url)
    shas = chain(store, 2)
    run_with(store, shas[0], [make_result(CELL), make_result(OTHER)])
    bad = run_with(store, shas[1], [make_result(CELL, status="fail_accuracy", max_abs=0.4), make_result(OTHER)])
    out = _print(store, bad, shas[0], False, capsys)
    assert f"1 regression(s) against baseline {shas[0][:12]} (2 of 2 cells compared)" in out
    assert json.loads(_print(store, bad, shas[0], True, capsys))["comparison"]["compared"] == 2
    store.dispose()


@pytest.mark.parametrize(("argv", "message"), [(["--timeout", "-1"], "expected a number of seconds"),
                                               (["--timeout", "nan"], "expected a number of seconds"),
                                               (["--timeout", "0"], "must be > 0"),
                                               (["--workers", "0"], "must be between 1 and 256")])
def test_bad_wait_options_are_refused_before_any_run(sqlite_url: str, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str], argv: list[str],
                                                     message: str) -> None:
    """A negative --timeout once created a run and cancelled it at once; now nothing is created."""
    from service.cli.main import main

    store = migrated_store(sqlite_url)
    monkeypatch.setenv("AMPCI_DATABASE_URL", sqlite_url)
    monkeypatch.delenv("AMPCI_BROKER_URL", raising=False)
    with pytest.raises(SystemExit) as refused:  # typed options: argparse's one-line usage error (issue 24)
        main(["sweep", *argv])
    err = capsys.readouterr().err
    assert refused.value.code == 2
    assert err.startswith(f"ampci sweep: error: argument {argv[0]}") and message in err and err.count("\n") == 1
    assert store.list_runs(limit=10) == []


def test_bf16_latency_on_the_cpu_provider_is_said_once(sqlite_url: str) -> None:
    """Every bf16 cell on a CPU worker used to carry onnxruntime's NOT_IMPLEMENTED error; the sweep says it
    once, as information, naming the cells."""
    from service.cli.sweep_cmd import latency_notes
    from workers.result import LATENCY_UNSUPPORTED, LatencyStats

    store = migrated_store(sqlite_url)
    shas = chain(store, 1)
    why = "onnxruntime's CPU provider has no bf16 kernels for these ops (first missing: Conv); bf16 latency ..."
    cells = [("m1", "bf16", "default", "cpu"), ("m2", "bf16", "default", "cpu"), ("m3", "fp16", "default", "cpu")]
    made = []
    for cell in cells:
        r = make_result(cell, latency_ms=None if cell[1] == "bf16" else 2.0)
        if cell[1] == "bf16":
            r.latency = LatencyStats(provider="CPUExecutionProvider", error=LATENCY_UNSUPPORTED + why)
        made.append(r)
    made.append(make_result(("m4", "bf16", "default", "cpu"), latency_ms=None))  # no latency at all: not said
    run = run_with(store, shas[0], made)
    notes = latency_notes(store, store.results(run_id=run))
    assert notes == [f"info: latency not measured for 2 cell(s) (m1/bf16/default/cpu, m2/bf16/default/cpu): {why}"]
    store.dispose()
