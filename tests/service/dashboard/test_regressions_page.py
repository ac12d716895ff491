"""``/regressions``: the open findings across runs (issue 43), linked from every page's navigation, with
filters, and the JSON twin at ``/api/regressions``."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from service.db.result_queries import REG_STATES
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


@pytest.fixture
def spread(seeded_db: tuple[str, Any, Seeded]) -> Iterator[None]:
    """The seed's findings (stored in one transaction: one time) found 12 h, 36 h, 60 h, ... ago, oldest
    first by id (the page's order is unchanged); their stored times are put back after the test."""
    import sqlalchemy as sa

    from service.db.findings import t_reg

    _, store, _ = seeded_db
    with store.transaction() as conn:
        before = dict(conn.execute(sa.select(t_reg.c.id, t_reg.c.created_at)).all())
        now = datetime.now(UTC)
        for n, reg_id in enumerate(sorted(before, reverse=True)):
            conn.execute(sa.update(t_reg).where(t_reg.c.id == reg_id).values(created_at=now - timedelta(days=n, hours=12)))
    yield
    with store.transaction() as conn:
        for reg_id, at in before.items():
            conn.execute(sa.update(t_reg).where(t_reg.c.id == reg_id).values(created_at=at))


@pytest.mark.usefixtures("spread")
def test_since_filter_reads_dates_and_days_like_the_cli(client: Any, seeded_db: tuple[str, Any, Seeded]) -> None:
    """``since`` keeps the findings found at or after it: an ISO date/datetime (UTC) or ``Nd``/``Nh`` ago,
    the forms ``ampci regressions --since`` takes (service/since.py reads both)."""
    _, store, _ = seeded_db
    every = store.regressions()
    times = sorted({f.created_at for f in every})
    assert len(times) >= 3
    cut = times[len(times) // 2]
    html = client.get(f"/regressions?state=all&since={cut.isoformat().replace('+', '%2B')}").text
    kept = [f.id for f in every if f.created_at >= cut]
    assert _ids(html) == kept and 0 < len(kept) < len(every)
    assert f'name="since" value="{cut.isoformat()}"' in html  # the form keeps the filter
    for value, found in (("1d", 1), ("2d", 2), ("48h", 2), ("1h", 0)):  # 12 h from every boundary
        want = [f.id for f in every][:found]
        assert _ids(client.get(f"/regressions?state=all&since={value}").text) == want, value
    assert _ids(client.get("/regressions?state=all&since=2099-12-31").text) == []
    assert _ids(client.get("/regressions?state=all&since=").text) == [f.id for f in every]  # empty: no filter


@pytest.mark.parametrize("value", ["yesterday", "7w", "36501d", "2026-13-01", "%00", "٣d"])
def test_a_bad_since_is_a_400_page_with_one_line(client: Any, value: str) -> None:
    r = client.get(f"/regressions?since={value}")
    assert r.status_code == 400 and r.headers["content-type"].startswith("text/html")
    message = re.findall(r"since: expected [^<]*", r.text)
    assert len(message) == 1 and "7d/12h" in message[0] and "\n" not in message[0]
