"""Every run state is visible everywhere: for each state of :data:`service.vocabulary.RUN_STATES` — the one
source of truth — the API filters by it, the CLI accepts it, the dashboard's runs list and run page show
it in words with a style of its own.  A state added without those fails here.  Also the store's rules of
the ``awaiting_approval`` state (issue 31): created without jobs, started once, never finished by itself."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import pytest

from service.api.routes_read import RunState
from service.cli.main import build_parser
from service.db.records import RunSpec
from service.errors import UserError
from service.github.approval import AWAITING_DESCRIPTION
from service.vocabulary import AWAITING_APPROVAL, NEW_RUN_STATES, RUN_STATES
from tests.conftest import fresh_pg_database
from tests.service.dashboard.conftest import BROWSER, TOKEN, make_app

pytestmark = pytest.mark.postgres

CSS = (Path(__file__).resolve().parents[3] / "service" / "dashboard" / "static" / "dashboard.css").read_text()
CELLS = (("mlp_small", "fp16", "default", "cpu"), ("mlp_small", "bf16", "default", "cpu"))


def _sha(i: int) -> str:
    return f"{i + 1:040x}"


@pytest.fixture(scope="module")
def world() -> Iterator[tuple[Any, dict[str, int], Any]]:
    """(store, run id by state, TestClient): one run in each state of RUN_STATES."""
    from fastapi.testclient import TestClient

    from service.db import Store

    for url in fresh_pg_database():
        store = Store.from_url(url)
        store.upgrade()
        try:
            runs: dict[str, int] = {}
            for i, state in enumerate(RUN_STATES):
                new = store.create_runs([RunSpec(_sha(i), "pull_request", None, "smoke", CELLS, None,
                                                 {"github": {"repo": "acme/amp-pass", "pr": 7}}, "broker",
                                                 state if state in NEW_RUN_STATES else "queued")])[0]
                if state not in NEW_RUN_STATES:
                    store.set_run_status(new.run_id, state)
                runs[state] = new.run_id
            with TestClient(make_app(store, url), raise_server_exceptions=False, headers=BROWSER) as client:
                yield store, runs, client
        finally:
            store.dispose()


def test_the_api_and_the_cli_take_their_states_from_the_store() -> None:
    assert get_args(RunState) == RUN_STATES
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    status = next(a for a in sub.choices["runs"]._actions if a.dest == "status")
    for state in RUN_STATES:
        assert status.type(state) == state
    with pytest.raises(Exception, match="awaiting_aproval"):
        status.type("awaiting_aproval")


@pytest.mark.parametrize("state", RUN_STATES)
def test_every_run_state_is_filtered_shown_and_styled(world: Any, state: str) -> None:
    store, runs, client = world
    assert store.get_run(runs[state]).status == state
    api = client.get(f"/api/runs?status={state}", headers={"Authorization": f"Bearer {TOKEN}"})
    assert api.status_code == 200, api.text
    assert [r["id"] for r in api.json()["runs"]] == [runs[state]]
    words = state.replace("_", " ")
    listed = client.get("/runs").text
    row = re.search(rf'<tr data-run-id="{runs[state]}">.*?</tr>', listed, flags=re.S)
    assert row and f'<span class="rstatus rs-{state}">{words}</span>' in row.group(0)
    page = client.get(f"/runs/{runs[state]}").text
    assert f'<span class="rstatus rs-{state}">{words}</span>' in page
    assert f".rs-{state} " in CSS or f".rs-{state}," in CSS, f"no style for .rs-{state}"


def test_a_run_awaiting_approval_says_what_it_waits_for(world: Any) -> None:
    store, runs, client = world
    page = client.get(f"/runs/{runs[AWAITING_APPROVAL]}").text
    assert f"awaiting approval: {AWAITING_DESCRIPTION}" in page
    assert "gate passes" not in page  # no job ran: there is no verdict to show


def test_awaiting_runs_have_no_jobs_start_once_and_never_finish_by_themselves(world: Any) -> None:
    store, _, _ = world
    new = store.create_runs([RunSpec(_sha(99), "pull_request", None, "smoke", CELLS, "awaiting-key", {}, "broker",
                                     AWAITING_APPROVAL)])[0]
    assert (new.created, new.jobs, new.status) == (True, (), AWAITING_APPROVAL)
    again = store.create_runs([RunSpec(_sha(99), "pull_request", None, "smoke", CELLS, "awaiting-key", {},
                                       "broker")])[0]
    assert (again.run_id, again.created, again.status) == (new.run_id, False, AWAITING_APPROVAL)
    assert store.finish_run(new.run_id).status == AWAITING_APPROVAL and store.jobs(new.run_id) == []
    started = store.approve_run(new.run_id, CELLS, {"approved": True})
    assert started is not None and started.status == "queued" and len(started.jobs) == 2
    assert store.approve_run(new.run_id, CELLS, {"approved": "twice"}) is None
    run = store.get_run(new.run_id)
    assert (run.status, run.meta, len(store.jobs(new.run_id))) == ("queued", {"approved": True}, 2)
    with pytest.raises(UserError, match="cannot be created"):
        store.create_runs([RunSpec(_sha(98), "push", status="running")])


def test_the_newest_pull_request_run_is_found_by_repository_and_number(world: Any) -> None:
    store, runs, _ = world
    newest = max(runs.values())
    assert store.newest_pull_request_run(repo="ACME/amp-pass", pr=7).id >= newest
    assert store.newest_pull_request_run(repo="acme/amp-pass", pr=7, head_sha=_sha(0)).id == runs[RUN_STATES[0]]
    assert store.newest_pull_request_run(repo="acme/amp-pass", pr=8) is None
    assert store.newest_pull_request_run(repo="other/amp-pass", pr=7) is None


def test_approval_queries_work_on_both_databases(db_url: str) -> None:
    from service.db import Store

    store = Store.from_url(db_url)
    store.upgrade()
    try:
        meta = {"github": {"repo": "Acme/Amp-Pass", "pr": 12}}
        first, second = store.create_runs([
            RunSpec(_sha(1), "pull_request", None, "smoke", CELLS, "k1", meta, "local", AWAITING_APPROVAL),
            RunSpec(_sha(2), "pull_request", None, "smoke", CELLS, "k2", meta, "local", AWAITING_APPROVAL)])
        store.create_runs([RunSpec(_sha(3), "push", None, "smoke", CELLS, "k3", meta, "local")])  # not a PR run
        assert store.newest_pull_request_run(repo="acme/amp-pass", pr=12).id == second.run_id
        assert store.newest_pull_request_run(repo="acme/amp-pass", pr=12, head_sha=_sha(1)).id == first.run_id
        assert store.newest_pull_request_run(repo="acme/amp-pass", pr=1) is None
        assert store.approve_run(second.run_id, CELLS, meta) is not None
        assert store.approve_run(second.run_id, CELLS, meta) is None
        assert [j.status for j in store.jobs(second.run_id)] == ["queued", "queued"]
    finally:
        store.dispose()
