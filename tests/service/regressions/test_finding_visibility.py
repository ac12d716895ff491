"""Every finding kind is visible everywhere: for each kind of the rules (``KINDS``) and each category
(``CATEGORIES``), and each timing kind (``TIMING_KINDS``) in each confirmation state
(``CONFIRMATION_STATES``) — all read from :mod:`service.regressions.rules`, the one source of truth — a
stored finding renders on the run page, the regression page, the history page, the CLI tables and the commit
status description.  A kind or category added to the rules without a rendering fails here (the browser
counterpart is ``tests/service/dashboard/test_browser.py::test_every_finding_kind_is_visible_in_the_browser``)."""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from typing import Any

import pytest
from rich.console import Console

from service.cli.tables import regressions_table
from service.dashboard import plots, routes, views
from service.github.reporter import status_text
from service.regressions.rules import CATEGORIES, CONFIRMATION_STATES, KINDS, RULES, TIMING_KINDS
from service.regressions.verdict import LATER_STATES
from tests.conftest import fresh_pg_database
from tests.service.dashboard.conftest import BROWSER, make_app
from tests.service.dashboard.seed_kinds import CASES, CELL, Finding, seed_every_finding

CSS = routes.CSS  # the stylesheet served, with the kinds' styles

pytestmark = pytest.mark.postgres


def test_kinds_and_categories_come_from_the_rules() -> None:
    assert set(KINDS) == set(RULES)  # every kind has a rule and every rule a kind
    assert "regression" in CATEGORIES and len(set(CATEGORIES)) == len(CATEGORIES)
    assert set(TIMING_KINDS) <= set(KINDS)
    assert len(CASES) == len(KINDS) * len(CATEGORIES) + len(TIMING_KINDS) * len(CONFIRMATION_STATES)


@pytest.mark.parametrize("state", CONFIRMATION_STATES)
def test_every_confirmation_state_has_a_dashboard_state_with_a_style(state: str) -> None:
    shown = views.STATES[state]
    assert shown.icon and shown.label and (f".st-{shown.css} " in CSS or f".st-{shown.css}," in CSS)


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_has_a_dashboard_state_with_a_style(kind: str) -> None:
    state = views.STATES[views.KIND_STATES[kind]]
    assert state.icon and state.short and state.label
    assert f".st-{state.css} " in CSS or f".st-{state.css}," in CSS, f"no style for .st-{state.css}"


@pytest.mark.parametrize("category", [c for c in CATEGORIES if c != "regression"])
def test_every_category_has_a_dashboard_state_and_a_chart_marker(category: str) -> None:
    state = views.STATES[views.CATEGORY_STATES[category]]
    assert f".st-{state.css} " in CSS or f".st-{state.css}," in CSS
    assert category in {name for name, _, _ in plots.MARKERS}, f"history charts do not mark {category} findings"


@pytest.fixture(scope="module")
def world() -> Iterator[tuple[str, Any, dict[tuple[str, str, str], Finding], Any]]:
    """(url, store, seeded findings, TestClient) over a fresh PostgreSQL database."""
    from fastapi.testclient import TestClient

    from service.db import Store

    for url in fresh_pg_database():
        store = Store.from_url(url)
        store.upgrade()
        try:
            seeded = seed_every_finding(store)
            with TestClient(make_app(store, url), raise_server_exceptions=False, headers=BROWSER) as client:
                yield url, store, seeded, client
        finally:
            store.dispose()


def _item(html: str, detail: str) -> str:
    """The ``<li>`` of the finding whose detail is ``detail``."""
    for li in re.findall(r"<li\b.*?</li>", html, flags=re.S):
        if detail in li:
            return li
    raise AssertionError(f"finding {detail!r} not on the page")


def _css_of(kind: str, category: str, state: str) -> str:
    if state in CONFIRMATION_STATES:
        name = state
    else:
        name = views.KIND_STATES[kind] if category == "regression" else views.CATEGORY_STATES[category]
    return views.STATES[name].css


def _fails(category: str, state: str) -> bool:
    """Whether such a finding fails the gate: an open regression, or one a later run resolved or suspects
    resolved (the run's verdict counts it as what it was: :data:`LATER_STATES`); a suspected or dismissed one
    never does."""
    return category == "regression" and (state == "open" or state in LATER_STATES)


def _phrase(kind: str, category: str, state: str) -> str:
    """How the verdict (headline, status description) names the one finding of a run."""
    if _fails(category, state):
        return f"1 {kind} regression"
    return f"1 {state if state in CONFIRMATION_STATES else category} ({kind})"


@pytest.mark.parametrize(("kind", "category", "state"), CASES)
def test_run_page_lists_the_finding(world: Any, kind: str, category: str, state: str) -> None:
    _, _, seeded, client = world
    f = seeded[(kind, category, state)]
    r = client.get(f"/runs/{f.run_id}")
    assert r.status_code == 200, r.text[:300]
    li = _item(r.text, f.detail)
    assert f"st-{_css_of(kind, category, state)}" in li and kind in li and f"/regressions/{f.regression_id}" in li
    if state in CONFIRMATION_STATES:
        assert state in li
    verdict = re.search(r'id="verdict"[^>]*>(.*?)</p>', r.text, flags=re.S)
    assert verdict is not None and _phrase(kind, category, state) in verdict.group(1)
    assert ("gate fails" in verdict.group(1)) == _fails(category, state)


@pytest.mark.parametrize(("kind", "category", "state"), CASES)
def test_regression_page_shows_the_finding(world: Any, kind: str, category: str, state: str) -> None:
    _, _, seeded, client = world
    f = seeded[(kind, category, state)]
    r = client.get(f"/regressions/{f.regression_id}")
    assert r.status_code == 200, r.text[:300]
    badge = re.search(r'<p class="badge ([^"]*)" id="reg-state">(.*?)</p>', r.text, flags=re.S)
    assert badge is not None and f"st-{_css_of(kind, category, state)}" in badge.group(1)
    assert category in badge.group(2) and state.replace("_", " ") in badge.group(2)  # the state's words
    assert kind in r.text and f.detail in r.text


@pytest.mark.parametrize(("kind", "category", "state"), CASES)
def test_regressions_page_lists_the_finding(world: Any, kind: str, category: str, state: str) -> None:
    """Every kind (the registry's), category and state renders on the regressions page, filtered by its
    kind and state, with its badge and links to its finding, run and cell history."""
    _, _, seeded, client = world
    f = seeded[(kind, category, state)]
    r = client.get(f"/regressions?state={state}&kind={kind}&category={category}")
    assert r.status_code == 200, r.text[:300]
    rows = re.findall(r"<tr data-finding-id=.*?</tr>", r.text, flags=re.S)
    (row,) = [x for x in rows if f'data-finding-id="{f.regression_id}"' in x]
    assert all(f'data-kind="{kind}"' in x and f'data-state="{state}"' in x for x in rows)
    assert f"st-{_css_of(kind, category, state)}" in row and f.detail in row
    assert f'href="/regressions/{f.regression_id}"' in row and f'href="/runs/{f.run_id}"' in row
    assert "/history?model=tiny_mlp&amp;dtype=fp16&amp;policy=default&amp;target=cpu" in row
    assert f"{kind}_metric 1 → 1.5 (×1.5)" in row  # the magnitude


def test_history_page_lists_every_finding(world: Any) -> None:
    _, _, seeded, client = world
    r = client.get(f"/history?model={CELL[0]}&dtype={CELL[1]}&policy={CELL[2]}&target={CELL[3]}&limit=200")
    assert r.status_code == 200, r.text[:300]
    for (kind, category, state), f in seeded.items():
        li = _item(r.text, f.detail)
        assert f"st-{_css_of(kind, category, state)}" in li and f"{category}: {kind}" in li


def _record(text: str, table: Any) -> dict[str, str]:
    """The one record of the record layout: its heading's tokens (``id N · cell · kind · category · state``)
    and its indented ``detail:`` lines, as column name -> text with wrapped lines joined."""
    lines = text.splitlines()[1:]  # under the title
    head = " ".join(ln for ln in lines if not ln.startswith(" "))
    body = " ".join(ln.strip() for ln in lines if ln.startswith(" "))
    parts = head.split(" · ")
    assert parts[0].startswith("id ") and body.startswith("detail: "), text
    return {"cell": parts[1], "kind": parts[2], "category": parts[3], "state": parts[4],
            "detail": body.removeprefix("detail: ")}


def _columns(table: Any, width: int) -> dict[str, str]:
    """The one data row of a rendered table, as column name -> its text with folded lines joined."""
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(table)
    if "┃" not in out.getvalue():  # too narrow for a table: one record (service/cli/fit.py)
        return _record(out.getvalue(), table)
    lines = [ln for ln in out.getvalue().splitlines() if "│" in ln or "┃" in ln]
    head = [ln for ln in lines if "┃" in ln]
    body = [ln for ln in lines if "│" in ln]
    names = ["".join(parts).strip() for parts in zip(*(ln.split("┃")[1:-1] for ln in head), strict=True)]
    cells = ["".join(p.strip() for p in parts) for parts in zip(*(ln.split("│")[1:-1] for ln in body), strict=True)]
    return dict(zip(names, cells, strict=True))


@pytest.mark.parametrize("width", [80, 200])
@pytest.mark.parametrize(("kind", "category", "state"), CASES)
def test_cli_regressions_table_shows_the_finding(world: Any, kind: str, category: str, state: str,
                                                 width: int) -> None:
    _, store, seeded, _ = world
    f = seeded[(kind, category, state)]
    (reg,) = store.regressions(run_id=f.run_id)
    row = _columns(regressions_table([reg], width), width)
    assert (row["kind"], row["category"], row["state"]) == (kind, category, state)
    assert row["detail"].replace(" ", "") == f.detail.replace(" ", "")


@pytest.mark.parametrize(("kind", "category", "state"), CASES)
def test_cli_regressions_run_gate(world: Any, kind: str, category: str, state: str,
                                  monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from service.cli.main import main

    url, _, seeded, _ = world
    f = seeded[(kind, category, state)]
    monkeypatch.setenv("AMPCI_DATABASE_URL", url)
    monkeypatch.setenv("COLUMNS", "200")
    code = main(["regressions", "--run", str(f.run_id)])
    out = capsys.readouterr().out
    assert kind in out and category in out and state in out and f.detail in out
    assert _phrase(kind, category, state) in out
    assert code == (1 if _fails(category, state) else 0)


@pytest.mark.parametrize(("kind", "category", "state"), CASES)
def test_commit_status_description_names_the_finding(world: Any, kind: str, category: str, state: str) -> None:
    _, store, seeded, _ = world
    f = seeded[(kind, category, state)]
    commit_state, description = status_text(store, f.run_id, store.run_summary(f.run_id))
    assert len(description) <= 140 and description.startswith(_phrase(kind, category, state))
    assert commit_state == ("failure" if _fails(category, state) else "success")


@pytest.mark.parametrize("kind", TIMING_KINDS)
def test_matrix_cell_of_a_timing_finding_under_confirmation(world: Any, kind: str) -> None:
    """A dismissed timing finding leaves the cell's own state (pass); a suspected one shows as suspected."""
    _, store, seeded, _ = world
    for state, shown in (("suspected", "suspected"), ("dismissed", "pass"), ("open", views.KIND_STATES[kind])):
        f = seeded[(kind, "regression", state)]
        (result,) = store.results(run_id=f.run_id)
        assert views.cell_state(result, None, store.regressions(run_id=f.run_id)).css == shown, state
