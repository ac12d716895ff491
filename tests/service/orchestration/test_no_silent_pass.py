"""No silent pass: a run whose cells could not measure fails the gate on every surface, with or without a
baseline (the commit status, ``ampci regressions --run``, the run page's headline), unless the baseline
failed the same way; a cell without a baseline is "not compared", never "no regressions"."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from service.cli.main import main
from service.db import Store
from service.github.reporter import status_text
from service.orchestration.judge import run_verdict
from tests.service.dashboard.conftest import BROWSER, TOKEN, make_app
from tests.service.factories import chain, make_result, migrated_store, run_with
from workers.result import JobResult

A, B = ("tiny_mlp", "fp16", "default", "cpu"), ("tiny_mlp", "bf16", "default", "cpu")
NOT_IN_REPO = "commit deadbeef is not in the pass repository"


def _with_message(result: JobResult) -> JobResult:
    return replace(result, message=NOT_IN_REPO)


def _page(store: Store, url: str, run_id: int) -> str:
    from fastapi.testclient import TestClient

    with TestClient(make_app(store, url), raise_server_exceptions=True, headers=BROWSER) as c:
        r = c.get(f"/runs/{run_id}")
    assert r.status_code == 200
    return r.text


def _cli(url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *argv: str) -> \
        tuple[int, str]:
    monkeypatch.setenv("AMPCI_DATABASE_URL", url)
    monkeypatch.setenv("COLUMNS", "170")
    code = main(list(argv))
    return code, capsys.readouterr().out


def test_bad_spec_on_cells_with_a_baseline_fails_everywhere(db_url: str, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    store = migrated_store(db_url)
    shas = chain(store, 2)
    run_with(store, shas[0], [make_result(A), make_result(B)])
    bad = run_with(store, shas[1], [_with_message(make_result(A, status="bad_spec")),
                                    _with_message(make_result(B, status="bad_spec"))])
    assert store.regressions(run_id=bad, category="regression") == []  # no finding: the rules see nothing
    verdict = run_verdict(store, bad)
    assert verdict.exit_code == 1 and verdict.state == "error"
    summary = store.run_summary(bad)
    state, description = status_text(store, bad, summary)
    assert state == "error" == verdict.state
    assert description.startswith("2 of 2 cells could not measure (2 bad_spec)") and len(description) <= 140
    assert "no regressions" not in description
    from fastapi.testclient import TestClient

    with TestClient(make_app(store, db_url), raise_server_exceptions=True) as c:
        api = c.get(f"/api/runs/{bad}", headers={"Authorization": f"Bearer {TOKEN}"}).json()["verdict"]
    assert (api["state"], api["gate"]["exit_code"]) == ("error", 1)
    assert [u["status"] for u in api["gate"]["unmeasured"]] == ["bad_spec", "bad_spec"]
    page = _page(store, db_url, bad)
    headline = page.index('id="verdict"')
    assert "gate fails: 2 of 2 cells could not measure (2 bad_spec)" in page
    assert headline < page.index("Regressions (")  # the headline says it first
    assert "No regressions" not in page
    store.dispose()
    code, out = _cli(db_url, monkeypatch, capsys, "regressions", "--run", str(bad))
    assert code == 1
    assert "could not measure" in out and NOT_IN_REPO in out


@pytest.mark.parametrize("status", ["crash", "timeout", "convert_error", "fail_accuracy"])
def test_every_unmeasured_status_fails_against_a_passing_baseline(sqlite_url: str, status: str) -> None:
    store = migrated_store(sqlite_url)
    shas = chain(store, 2)
    run_with(store, shas[0], [make_result(A)])
    run = run_with(store, shas[1], [make_result(A, status=status)])
    verdict = run_verdict(store, run)
    assert verdict.exit_code == 1 and verdict.state == "failure"
    assert verdict.decision.unmeasured == ((A, status),)
    store.dispose()


def test_same_failure_at_the_baseline_is_a_known_failure(sqlite_url: str, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    store = migrated_store(sqlite_url)
    shas = chain(store, 2)
    run_with(store, shas[0], [make_result(A, status="convert_error"), make_result(B)])
    run = run_with(store, shas[1], [make_result(A, status="convert_error"), make_result(B)])
    verdict = run_verdict(store, run)
    assert verdict.exit_code == 0 and verdict.state == "success"
    assert verdict.decision.known_failures == ((A, "convert_error"),)
    said = "1 cell fails to convert, as at the baseline"  # a failing cell in every view, never a pass
    assert said in verdict.headline() and "known failure" not in verdict.headline()
    assert said in status_text(store, run, store.run_summary(run))[1]
    assert said in _page(store, sqlite_url, run)
    store.dispose()
    code, out = _cli(sqlite_url, monkeypatch, capsys, "regressions", "--run", str(run))
    assert code == 0 and said in out


def test_cells_without_a_baseline_are_not_compared_never_no_regressions(
        sqlite_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    store = migrated_store(sqlite_url)
    shas = chain(store, 1)
    run = run_with(store, shas[0], [make_result(A), make_result(B)])
    verdict = run_verdict(store, run)
    assert verdict.exit_code == 0
    texts = {"headline": verdict.headline(), "status": status_text(store, run, store.run_summary(run))[1],
             "page": _page(store, sqlite_url, run)}
    store.dispose()
    code, texts["cli"] = _cli(sqlite_url, monkeypatch, capsys, "regressions", "--run", str(run))
    assert code == 0
    for where, text in texts.items():
        assert "2 of 2 cells not compared (no baseline result)" in text, where
        assert "no regressions" not in text.lower(), where


def test_mixed_run_says_what_was_compared(sqlite_url: str) -> None:
    store = migrated_store(sqlite_url)
    shas = chain(store, 2)
    run_with(store, shas[0], [make_result(A)])
    run = run_with(store, shas[1], [make_result(A), make_result(B)])
    line = run_verdict(store, run).headline()
    assert line == ("gate passes: 1 of 2 cells not compared (no baseline result); "
                    "no regressions in 1 compared cell")
    page = _page(store, sqlite_url, run)
    assert "No regressions in the 1 cells compared against the baseline; 1 not compared" in page
    store.dispose()


@pytest.mark.parametrize("status", ["convert_error", "bad_spec", "timeout"])
def test_the_worker_path_keeps_the_status_that_fails_the_gate(db_url: str, status: str) -> None:
    """Results written the way workers write them (begin_job, complete_job, finish_if_complete) keep their own
    status: a cell that could not measure is never stored as measured, and the gate fails."""
    from service.orchestration.jobs import complete_job, finish_if_complete

    store = migrated_store(db_url)
    shas = chain(store, 2)
    run_with(store, shas[0], [make_result(A)])
    run = store.create_run(shas[1], "push", cells=[A])
    (job,) = store.jobs(run)
    start = store.begin_job(job.id, "w:1")
    _, pending = complete_job(store, start.run, start.job, make_result(A, status=status))
    assert not pending and finish_if_complete(store, run)
    assert [r.status for r in store.results(run_id=run)] == [status]
    assert [j.status for j in store.jobs(run)] == ["done"]
    verdict = run_verdict(store, run)
    assert verdict.exit_code == 1 and verdict.decision.unmeasured == ((A, status),)
    store.dispose()


def test_ampci_sweep_of_a_pass_that_cannot_convert_says_so_first(
        sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI gate end to end (embedded pool, real worker subprocess): a revision whose pass cannot convert
    fails the gate, and the line after the table says that first, never "no regressions"."""
    import subprocess

    from tests.service.cli.test_sweep_validation import _model, _sweep_text

    repo = tmp_path / "passrepo"
    (repo / "amp_pass").mkdir(parents=True)
    (repo / "amp_pass" / "__init__.py").write_text("VALUE = 1\n")  # no converter
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "one"]):
        subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=repo, check=True,
                       capture_output=True)
    digest = _model(tmp_path / "tiny.onnx")
    zoo = tmp_path / "zoo.toml"
    zoo.write_text(f'[models.tiny]\nsource = {{ path = "tiny.onnx" }}\nsha256 = "{digest}"\ntags = ["t"]\n'
                   'inputs.x = { shape = [1, 4], dtype = "float32" }\n')
    (tmp_path / "s.toml").write_text(_sweep_text(zoo))
    for key, value in (("AMPCI_DATABASE_URL", sqlite_url), ("AMPCI_CACHE_DIR", str(tmp_path / "cache")),
                       ("AMPCI_DATA_DIR", str(tmp_path / "data")), ("AMPCI_PASS_REPO", str(repo)),
                       ("COLUMNS", "170")):
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AMPCI_BROKER_URL", raising=False)
    code = main(["sweep", "--config", str(tmp_path / "s.toml"), "--revision", "main", "--workers", "1"])
    out = capsys.readouterr().out
    assert code == 1
    assert "gate fails: 1 of 1 cells could not measure" in out and "no regressions" not in out.lower()


def test_a_push_of_commits_missing_from_the_pass_repository_is_no_known_failure(sqlite_url: str) -> None:
    """The issue's push: its head (and its baseline) are not in the pass repository, so both runs end
    bad_spec; the head's failure names its own commit, so it is not "the same failure" as the baseline's."""
    store = migrated_store(sqlite_url)
    shas = chain(store, 2)
    for sha in shas:
        missing = f"commit {sha} is not in the pass repository /srv/pass"
        run = run_with(store, sha, [replace(make_result(c, status="bad_spec"), message=missing) for c in (A, B)])
    verdict = run_verdict(store, run)
    assert verdict.exit_code == 1 and verdict.state == "error" and verdict.decision.known_failures == ()
    assert verdict.headline().startswith("gate fails: 2 of 2 cells could not measure (2 bad_spec)")
    store.dispose()
