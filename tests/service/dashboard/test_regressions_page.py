"""``/regressions``: the open findings across runs (issue 43), linked from every page's navigation, with
filters, and the JSON twin at ``/api/regressions``."""

from __future__ import annotations

import re
from typing import Any

import pytest

from service.db.queries import REG_STATES
from tests.service.dashboard.conftest import TOKEN
from tests.service.dashboard.seed import Seeded

pytestmark = pytest.mark.postgres


def _ids(html: str) -> list[int]:
    return [int(x) for x in re.findall(r'<tr data-finding-id="(\d+)"', html)]


def test_open_findings_across_runs_newest_first(client: Any, seeded_db: tuple[str, Any, Seeded]) -> None:
    _, store, s = seeded_db
    r = client.get("/regressions")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    want = [f.id for f in store.regressions(state="open")]
    assert want and _ids(r.text) == want
    for cell, reg_id in s.regressions.items():
        if reg_id in want:
            assert f'href="/regressions/{reg_id}"' in r.text and cell[0] in r.text
    everything = client.get("/regressions?state=all").text
    assert _ids(everything) == [f.id for f in store.regressions()]


def test_every_page_links_to_it(client: Any, seeded_db: tuple[str, Any, Seeded]) -> None:
    _, _, s = seeded_db
    for page in ("/", "/deliveries", f"/runs/{s.main_runs[-1]}", "/regressions"):
        assert '<a href="/regressions">Regressions</a>' in client.get(page).text, page


def test_filters(client: Any, seeded_db: tuple[str, Any, Seeded]) -> None:
    _, store, _ = seeded_db
    every = store.regressions()
    for state in REG_STATES:
        assert _ids(client.get(f"/regressions?state={state}").text) == [f.id for f in every if f.state == state]
    for kind in {f.kind for f in every}:
        html = client.get(f"/regressions?state=all&kind={kind}").text
        assert _ids(html) == [f.id for f in every if f.kind == kind]
    model = every[0].model
    assert _ids(client.get(f"/regressions?state=all&model={model}").text) == [f.id for f in every if f.model == model]
    assert "No findings in state open of kind drift." in client.get("/regressions?kind=drift&model=nope").text


@pytest.mark.parametrize(("query", "words"), [("state=bogus", "unknown finding state"),
                                              ("kind=bogus", "unknown finding kind"),
                                              ("category=bogus", "unknown category"),
                                              ("model=a%20b", "model:"), ("limit=0", "limit")])
def test_bad_filters_are_a_400_page(client: Any, query: str, words: str) -> None:
    r = client.get(f"/regressions?{query}")
    assert r.status_code == 400 and words in r.text and r.headers["content-type"].startswith("text/html")


def test_json_twin(client: Any, seeded_db: tuple[str, Any, Seeded]) -> None:
    _, store, _ = seeded_db
    r = client.get("/api/regressions?state=open", headers={"Authorization": f"Bearer {TOKEN}",
                                                           "Accept": "application/json"})
    assert r.status_code == 200
    assert [f["id"] for f in r.json()["regressions"]] == [f.id for f in store.regressions(state="open")]
