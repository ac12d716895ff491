"""One decider, every surface agrees: for each verdict state a run can end in, the commit status, the check run's
conclusion, the pull-request comment's headline, the API's verdict, the run page's headline and the exit code of
``ampci regressions --run`` all say the same thing (:func:`service.regressions.verdict.decide_run`)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from service.cli.main import main
from service.db import Store, verdicts
from service.github import comment
from service.github.pr_report import build_report
from service.github.reporter import status_text
from service.orchestration.judge import run_verdict
from service.regressions.verdict import RunFacts, decide_run
from service.regressions.verdict_stored import from_stored
from tests.service.dashboard.conftest import TOKEN, make_app
from tests.service.factories import chain, make_result, migrated_store, run_with

A, B = ("tiny_mlp", "fp16", "default", "cpu"), ("tiny_mlp", "bf16", "default", "cpu")
#: What a surface says for each final state: the check run's conclusion, how the comment's headline starts,
#: how the verdict's headline starts, the exit code.
SAYS = {"success": ("success", ("✅", "⚡", "🆕"), "gate passes", 0),
        "failure": ("failure", ("❌", "⚠️"), "gate fails", 1),
        "error": ("failure", ("❌", "⚠️"), "gate fails", 1)}


def _passing(store: Store) -> int:
    shas = chain(store, 2)
    run_with(store, shas[0], [make_result(A)])
    return run_with(store, shas[1], [make_result(A)])


def _regressed(store: Store) -> int:
    shas = chain(store, 2)
    run_with(store, shas[0], [make_result(A)])
    return run_with(store, shas[1], [make_result(A, max_abs=1.0)])


def _new_cell_convert_error(store: Store) -> int:
    (sha,) = chain(store, 1)
    return run_with(store, sha, [make_result(A, status="convert_error")])


def _bad_spec(store: Store) -> int:
    shas = chain(store, 2)
    run_with(store, shas[0], [make_result(A)])
    return run_with(store, shas[1], [make_result(A, status="bad_spec")])


def _job_error_without_result(store: Store) -> int:
    shas = chain(store, 2)
    run_with(store, shas[0], [make_result(A), make_result(B)])
    run_id = store.create_run(shas[1], "push", cells=[A, B])
    store.write_result(run_id, make_result(A))
    (job,) = [j for j in store.jobs(run_id) if j.cell == B]
    store.mark_job(job.id, "error", "worker lost")
    store.finish_run(run_id)
    return run_id


def _job_error_with_its_result(store: Store) -> int:
    """A job that stored its (passing) result and then ended ``error``: infrastructure failed, so never a pass
    (the comment's headline used to say "no change" here while the status said error)."""
    shas = chain(store, 2)
    run_with(store, shas[0], [make_result(A), make_result(B)])
    run_id = store.create_run(shas[1], "push", cells=[A, B])
    store.write_result(run_id, make_result(A))
    store.write_result(run_id, make_result(B))
    (job,) = [j for j in store.jobs(run_id) if j.cell == B]
    store.mark_job(job.id, "error", "worker lost after writing its result")
    store.finish_run(run_id)
    assert store.get_run(run_id).status == "partial"  # not "failed": the comment must say why it is not a pass
    return run_id


def _cancelled(store: Store) -> int:
    shas = chain(store, 2)
    run_with(store, shas[0], [make_result(A)])
    run_id = run_with(store, shas[1], [make_result(A)])
    store.set_run_status(run_id, "cancelled")
    return run_id


CASES: dict[str, tuple[Callable[[Store], int], str]] = {
    "passes": (_passing, "success"),
    "regression": (_regressed, "failure"),
    "new cell convert_error, no baseline": (_new_cell_convert_error, "failure"),
    "bad_spec": (_bad_spec, "error"),
    "job ended error without a result": (_job_error_without_result, "error"),
    "job ended error with its result": (_job_error_with_its_result, "error"),
    "run cancelled": (_cancelled, "error"),
}


def _surfaces(store: Store, url: str, run_id: int) -> dict[str, Any]:
    from fastapi.testclient import TestClient

    report = build_report(store, run_id, "https://ci.example.com")
    check = comment.check_run(replace(report, repo="o/r"))
    assert check is not None
    with TestClient(make_app(store, url), raise_server_exceptions=True) as c:
        api = c.get(f"/api/runs/{run_id}", headers={"Authorization": f"Bearer {TOKEN}"}).json()["verdict"]
    return {"status": status_text(store, run_id, store.run_summary(run_id))[0], "report": report.state,
            "conclusion": check.conclusion, "comment": comment.headline(report), "api": api["state"],
            "api_exit": api["gate"]["exit_code"], "api_headline": api["headline"],
            "headline": run_verdict(store, run_id).headline()}


@pytest.mark.parametrize("case", list(CASES))
def test_every_surface_says_the_same(sqlite_url: str, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str], case: str) -> None:
    make, state = CASES[case]
    store = migrated_store(sqlite_url)
    run_id = make(store)
    got = _surfaces(store, sqlite_url, run_id)
    store.dispose()
    monkeypatch.setenv("AMPCI_DATABASE_URL", sqlite_url)
    code = main(["regressions", "--run", str(run_id)])
    out = capsys.readouterr().out
    conclusion, comment_leads, lead, exit_code = SAYS[state]
    assert got["status"] == got["report"] == got["api"] == state, got
    assert got["conclusion"] == conclusion, got
    assert got["comment"].startswith(comment_leads), got
    assert got["headline"] == got["api_headline"] and got["headline"].startswith(lead + ":"), got
    assert code == got["api_exit"] == exit_code, (code, got)
    assert f"run {run_id}: {lead}:" in out
    if state != "success":
        assert "passes" not in got["headline"] and "no change" not in got["comment"]


def test_a_pending_run_is_pending_everywhere_it_is_read(sqlite_url: str) -> None:
    store = migrated_store(sqlite_url)
    (sha,) = chain(store, 1)
    run_id = store.create_run(sha, "push", cells=[A, B])
    store.write_result(run_id, make_result(A))
    got = _surfaces(store, sqlite_url, run_id)
    store.dispose()
    assert got["status"] == got["report"] == got["api"] == "pending", got
    assert got["headline"].startswith("pending:") and "passes" not in got["headline"]


@pytest.mark.parametrize(("facts", "state", "exit_code"), [
    (RunFacts(1, "complete", 1), "success", 0),
    (RunFacts(1, "complete", 1, regressions={"latency": 1}), "failure", 1),
    (RunFacts(1, "running", 2, pending=1), "pending", 0),
    (RunFacts(1, "complete", 1, waiting_for=(7,)), "pending", 0),
    (RunFacts(1, "failed", 1), "error", 1),
    (RunFacts(1, "cancelled", 1), "error", 1),
    (RunFacts(1, "partial", 2, errored_jobs=1), "error", 1),
])
def test_the_decider_over_plain_data(facts: RunFacts, state: str, exit_code: int) -> None:
    verdict = decide_run(facts)
    assert (verdict.state, verdict.exit_code, verdict.decision.exit_code) == (state, exit_code, exit_code)
    assert bool(verdict.decision.reasons) == bool(exit_code)
    assert verdict.headline().startswith({"pending": "pending", "success": "gate passes"}.get(state, "gate fails"))


def test_the_reporter_decides_once_and_its_reports_agree(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A finished pull-request run: its verdict is decided once, and the commit status, the comment and the
    check run queued from it say the same."""
    from service.github.client import GitHubStatusClient
    from service.github.outbox import MemoryOutbox
    from service.github.reporter import StatusReporter
    from service.orchestration import judge as verdict_mod

    store = migrated_store(sqlite_url)
    (sha,) = chain(store, 1)
    run_id = store.create_run(sha, "pull_request", cells=[A], meta={"github": {"repo": "o/r", "pr": 7}})
    store.write_result(run_id, make_result(A, status="convert_error"))
    store.finish_run(run_id)
    decided: list[int] = []
    real = verdict_mod.run_verdict

    def counted(store: Store, run_id: int) -> Any:
        decided.append(run_id)
        return real(store, run_id)

    monkeypatch.setattr(verdict_mod, "run_verdict", counted)
    outbox = MemoryOutbox()
    from service.github_auth.app import AppAuth
    from tests.service.github.github_standin import APP_ID, app_key

    # check runs are queued only when reporting as an App (nothing is sent: the outbox is only read)
    client = GitHubStatusClient("http://127.0.0.1:9", auth=AppAuth(APP_ID, app_key()[0]))
    reporter = StatusReporter(outbox, client, public_url="https://ci",
                              store=store, reports=frozenset({"status", "comment", "check"}))
    assert reporter.finished(store.get_run(run_id), store.run_summary(run_id), store)
    assert decided == [run_id]
    queued = {type(item.status).__name__: item.status for item in outbox.claim(float("inf"), 10, 60.0)}
    status, check = queued["CommitStatus"], queued["CheckRun"]
    assert (status.state, check.conclusion) == ("failure", "failure"), queued
    assert "could not be measured" in queued["PullRequestComment"].body
    store.dispose()


#: Every view of a run's verdict (issue 39), each read by :func:`_views` below.
VIEWS = ("commit status", "pull-request report", "comment headline", "check run", "api", "run page",
         "runs page", "ampci runs", "ampci runs --json", "ampci regressions --run", "ampci run")


def _views(store: Store, url: str, run_id: int, monkeypatch: pytest.MonkeyPatch,
           capsys: pytest.CaptureFixture[str]) -> dict[str, tuple[str, ...]]:
    """``(state word, text)`` of run ``run_id``'s verdict in every one of :data:`VIEWS`."""
    from fastapi.testclient import TestClient

    from tests.service.dashboard.conftest import BROWSER
    from tests.service.orchestration.test_verdict_lists import runs_page

    report = build_report(store, run_id, "https://ci.example.com")
    check = comment.check_run(replace(report, repo="o/r"))
    assert check is not None
    status = status_text(store, run_id, store.run_summary(run_id))
    with TestClient(make_app(store, url), raise_server_exceptions=True) as c:
        api = c.get(f"/api/runs/{run_id}", headers={"Authorization": f"Bearer {TOKEN}"}).json()
    with TestClient(make_app(store, url), raise_server_exceptions=True, headers=BROWSER) as c:
        page = c.get(f"/runs/{run_id}").text
    row = runs_page(store, url)[run_id]
    out: dict[str, tuple[str, ...]] = {
        "commit status": status, "pull-request report": (report.state, " ".join(report.verdict_parts)),
        "comment headline": (report.state, comment.headline(report)), "check run": (check.conclusion, check.title),
        "api": (api["verdict"]["state"], api["verdict"]["headline"]),
        "run page": (re.search(r'id="verdict"[^>]*>([^<]*)<', page).group(1).split(":")[0],  # type: ignore[union-attr]
                     re.search(r'id="verdict"[^>]*>([^<]*)<', page).group(1)),  # type: ignore[union-attr]
        "runs page": (re.search(r'class="badge st-(\w+)"', row).group(1), re.sub(r"<[^>]+>", " ", row), row),  # type: ignore[union-attr]
    }
    assert "verdict" not in api["run"], api["run"]  # one verdict field
    out["api exit"] = (str(api["verdict"]["exit_code"]), "")
    monkeypatch.setenv("AMPCI_DATABASE_URL", url)
    monkeypatch.setenv("COLUMNS", "250")
    for name, argv in (("ampci runs", ["runs"]), ("ampci runs --json", ["runs", "--json"]),
                       ("ampci regressions --run", ["regressions", "--run", str(run_id)]),
                       ("ampci run", ["run", str(run_id)])):
        code = main(argv)
        text = capsys.readouterr().out
        if name == "ampci runs --json":
            (mine,) = [r for r in json.loads(text) if r["id"] == run_id]
            out[name] = (mine["verdict"]["state"], json.dumps(mine.get("resolved_since")))
        else:
            line = next((ln for ln in text.splitlines() if re.match(rf"[│|]\s+{run_id} [│|]", ln)), text)
            out[name] = (str(code), line if name != "ampci regressions --run" else text)
    return out


def _resolved_later(store: Store) -> tuple[int, int]:
    """Run B regresses two cells against A; run C reverts them and resolves B's regressions (the real finisher)."""
    from tests.service.orchestration.test_verdict_lists import finished

    a, b, c = chain(store, 3)
    finished(store, a, [make_result(A), make_result(B)])
    bad = finished(store, b, [make_result(A, max_abs=1.0, seed=1), make_result(B, max_abs=1.0, seed=1)])
    fixed = finished(store, c, [make_result(A, seed=2), make_result(B, seed=2)])
    assert {r.state for r in store.regressions(run_id=bad)} == {"resolved"}, store.regressions(run_id=bad)
    return bad, fixed


@pytest.mark.parametrize("stored", [True, False], ids=["stored", "judged-before-the-column"])
def test_a_run_whose_regressions_were_resolved_later_fails_in_every_view(
        db_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], stored: bool) -> None:
    """Issue 39: after run C resolved run B's regressions, every view of B still says what B's gate decided
    (fails, exit 1), with the resolution beside it ("resolved since by run C"), never instead of it.  A run
    judged before verdicts were stored whole (``stored`` False: its ``runs.judgement`` and ``runs.verdict``
    empty) is decided on its first read, the same way, and stored then."""
    store = migrated_store(db_url)
    bad, fixed = _resolved_later(store)
    if not stored:
        with store.transaction() as conn:
            verdicts.record(conn, run_id=bad, brief=None, judgement=None)
    got = _views(store, db_url, bad, monkeypatch, capsys)
    since = f"resolved since by run {fixed}"
    assert set(got) == {*VIEWS, "api exit"}, sorted(got)
    assert got["commit status"][0] == got["pull-request report"][0] == got["api"][0] == "failure", got
    assert got["check run"][0] == "failure" and got["api exit"][0] == "1", got
    assert got["run page"][0] == "gate fails" and got["runs page"][0] == "error", got
    assert got["ampci regressions --run"][0] == "1" and got["ampci runs --json"][0] == "failure", got
    for view in ("commit status", "comment headline", "api", "run page", "runs page", "ampci runs",
                 "ampci regressions --run", "ampci run"):
        assert since in got[view][1], (view, got[view][1])
        assert "passes" not in got[view][1] and "no regression" not in got[view][1], (view, got[view][1])
    assert "2 accuracy regressions" in got["api"][1] and "2 regressions" in got["ampci runs"][1], got
    assert json.loads(got["ampci runs --json"][1]) == {"regressions": 2, "runs": [fixed]}
    assert re.search(r'class="num bad"[^>]*>2<', got["runs page"][2]), "the regressions column counts B's 2"
    # the stored verdict is B's own, decided once: a later run's resolution never rewrote it
    with store.transaction() as conn:
        kept = from_stored(verdicts.judgement(conn, run_id=bad))
    assert kept is not None and kept.state == "failure" and kept.exit_code == 1
    assert replace(run_verdict(store, bad), resolved=0, resolved_by=()) == kept
    store.dispose()
