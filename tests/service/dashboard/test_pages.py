"""The dashboard's HTML over a database seeded through the real store code (in-process TestClient)."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from typing import Any

import pytest

from tests.service.dashboard.conftest import BROWSER, TOKEN, make_app
from tests.service.dashboard.seed import ACC_CELL, CELLS, CONV_CELL, LAT_CELL, Seeded

pytestmark = pytest.mark.postgres


class Tags(HTMLParser):
    """Collects (tag, attrs) of every start tag."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def tags(html: str) -> list[tuple[str, dict[str, str | None]]]:
    p = Tags()
    p.feed(html)
    return p.tags


def matrix_cells(html: str) -> dict[str, dict[str, Any]]:
    return {a["data-cell"]: a for t, a in tags(html) if t == "td" and a.get("data-cell")}  # type: ignore[misc]


def history_url(cell: tuple[str, str, str, str], **extra: str) -> str:
    q = "&".join(f"{k}={v}" for k, v in zip(("model", "dtype", "policy", "target"), cell, strict=True))
    return "/history?" + q + "".join(f"&{k}={v}" for k, v in extra.items())


def test_runs_page_lists_runs_with_counts(client: Any, seeded_db: tuple[str, Any, Seeded]) -> None:
    _, _, s = seeded_db
    r = client.get("/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    ids = [int(a["data-run-id"]) for t, a in tags(r.text) if t == "tr" and a.get("data-run-id")]
    assert ids == sorted([*s.main_runs, s.feature_run], reverse=True)
    for sha in s.main_shas:
        assert sha[:7] in r.text
    assert "pass: revision 5 of the cast placement work" in r.text and "Grace Hopper" in r.text
    last = re.search(rf'<tr data-run-id="{s.main_runs[-1]}">(.*?)</tr>', r.text, re.DOTALL).group(1)  # type: ignore[union-attr]
    nums = re.findall(r'<td class="num[^"]*"[^>]*>(\d+)', last)
    # cells, pass, regressions, errors, fail, flaky, improved
    assert [int(n) for n in nums[:7]] == [12, 10, 3, 1, 1, 0, 0]


def test_runs_filters(client: Any, seeded_db: tuple[str, Any, Seeded]) -> None:
    _, _, s = seeded_db
    by_branch = client.get("/runs?branch=feature/resize").text
    assert f'data-run-id="{s.feature_run}"' in by_branch and f'data-run-id="{s.main_runs[0]}"' not in by_branch
    by_trigger = client.get("/runs?trigger=push&branch=main").text
    assert f'data-run-id="{s.feature_run}"' not in by_trigger and by_trigger.count("data-run-id=") == len(s.main_runs)
    assert "No runs match the filter" in client.get("/runs?trigger=nightly").text
    bad = client.get("/runs?trigger=cron")
    assert bad.status_code == 400 and "unknown trigger" in bad.text and bad.headers["content-type"].startswith("text/html")


def test_run_page_matrix_marks_regressed_cells(client: Any, seeded_db: tuple[str, Any, Seeded]) -> None:
    _, _, s = seeded_db
    r = client.get(f"/runs/{s.main_runs[-1]}")
    assert r.status_code == 200
    cells = matrix_cells(r.text)
    assert len(cells) == len(CELLS)
    expected = {ACC_CELL: "reg-accuracy", LAT_CELL: "reg-latency", CONV_CELL: "reg-conversion"}
    for cell, state in expected.items():
        a = cells["/".join(cell)]
        assert a["data-state"] == state and f"st-{state}" in a["class"]
        assert s.kinds[cell] in a["title"]  # the tooltip names the finding
        assert "baseline" in a["title"]
        assert f'/regressions/{s.regressions[cell]}' in r.text
    assert all(a["data-state"] == "pass" for c, a in cells.items() if tuple(c.split("/")) not in expected)
    assert "Regressions (3)" in r.text
    # the diff against the baseline (the parent revision) lists exactly the changed cells
    assert f"{s.main_shas[-2][:12]}" in r.text
    diff = r.text.split('id="diff"', 1)[1]
    assert diff.count('<tr class="changed">') == 3 and "pass → <strong>fail_accuracy</strong>" in diff


def test_run_page_of_pull_request_uses_given_baseline(client: Any, seeded_db: tuple[str, Any, Seeded]) -> None:
    _, _, s = seeded_db
    r = client.get(f"/runs/{s.feature_run}")
    assert r.status_code == 200 and "(given)" in r.text and s.main_shas[3][:12] in r.text
    assert {a["data-state"] for a in matrix_cells(r.text).values()} == {"pass"}


def test_history_page_plots_one_point_per_revision(client: Any, seeded_db: tuple[str, Any, Seeded]) -> None:
    _, _, s = seeded_db
    r = client.get(history_url(ACC_CELL))
    assert r.status_code == 200
    figures = re.findall(r'<figure class="chart" id="chart-([a-z_0-9]+)" data-points="(\d+)">(.*?)</figure>', r.text,
                         re.DOTALL)
    assert [f[0] for f in figures] == ["cosine", "latency_p50_ms", "speedup", "casts_inserted", "low_precision_fraction"]
    for _key, n, svg in figures:
        assert int(n) == len(s.main_shas)
        assert "<script" not in svg and "<svg" in svg
        links = re.findall(r'xlink:href="/runs/(\d+)"', svg)
        assert set(map(int, links)) <= set(s.main_runs)
    cosine_svg = figures[0][2]
    overlay = cosine_svg.split('class="plot overlay"', 1)[1]  # pygal draws dots above the lines
    value_series = overlay.split('class="series serie-0', 1)[1].split('class="series serie-1', 1)[0]
    assert value_series.count('class="dot ') == len(s.main_shas)
    markers = overlay.split('class="series serie-1', 1)[1]
    assert markers.count('class="dot ') == 1 and "#b3261e" in markers  # the finding is marked in red ...
    assert "regression: accuracy (open)" in markers  # ... and named in its tooltip
    assert f"run {s.main_runs[-1]}" in cosine_svg and "<title>" in cosine_svg  # native tooltips
    assert figures[1][2].count('class="ci"') == len(s.main_shas)  # latency min–max whiskers
    assert "6 revisions shown on main" in r.text
    assert r.text.count("/regressions/") >= 2  # findings list and data table link to the regression


def test_history_page_limits_branch_and_errors(client: Any, seeded_db: tuple[str, Any, Seeded]) -> None:
    r = client.get(history_url(ACC_CELL, limit="3"))
    assert 'data-points="3"' in r.text and "(newest 3 of 6)" in r.text
    assert "No results of this cell on feature/resize" in client.get(history_url(ACC_CELL, branch="feature/resize")).text
    assert client.get(history_url(("nope", "fp16", "default", "cpu"))).status_code == 404
    assert client.get("/history?model=a%20b&dtype=fp16&policy=default&target=cpu").status_code == 400
    assert client.get("/history").status_code == 400


def test_regression_page_shows_numbers_and_bisection(client: Any, seeded_db: tuple[str, Any, Seeded]) -> None:
    _, _, s = seeded_db
    r = client.get(f"/regressions/{s.regressions[ACC_CELL]}")
    assert r.status_code == 200
    assert "accuracy" in r.text and "fail_accuracy" in r.text and "worst max abs error" in r.text
    assert "the baseline is the parent: this revision is the first bad commit" in r.text
    assert 'name="token"' in r.text and 'value="false_positive"' in r.text
    lat = client.get(f"/regressions/{s.regressions[LAT_CELL]}").text
    assert "latency p50 ms" in lat and "+5" in lat  # +50% on the p50


def test_unknown_ids_are_html_404(client: Any) -> None:
    for path in ("/runs/99999", "/runs/abc", "/regressions/99999", "/regressions/0"):
        r = client.get(path)
        assert r.status_code == 404 and r.headers["content-type"].startswith("text/html"), path


def test_pages_load_nothing_external_and_need_no_script(client: Any, seeded_db: tuple[str, Any, Seeded]) -> None:
    _, _, s = seeded_db
    for path in ("/", f"/runs/{s.main_runs[-1]}", history_url(LAT_CELL), f"/regressions/{s.regressions[LAT_CELL]}"):
        html = client.get(path).text
        assert "<script" not in html, path
        for tag, attrs in tags(html):
            for attr in ("src", "href"):
                value = attrs.get(attr) or ""
                assert not re.match(r"^(https?:)?//", value), (path, tag, value)
    css = client.get("/dashboard.css")
    assert css.status_code == 200 and "url(" not in css.text and "@import" not in css.text


def test_runs_page_query_count_does_not_grow_with_runs(client: Any, seeded_db: tuple[str, Any, Seeded],
                                                       count_queries: Any) -> None:
    _, store, _ = seeded_db
    with count_queries(store.engine) as few:
        client.get("/runs?limit=2")
    with count_queries(store.engine) as many:
        client.get("/runs?limit=50")
    assert len(many) == len(few) <= 6


def test_read_token_required_protects_pages(seeded_db: tuple[str, Any, Seeded]) -> None:
    from fastapi.testclient import TestClient

    url, store, _ = seeded_db
    with TestClient(make_app(store, url, read_token_required=True), raise_server_exceptions=False) as c:
        assert c.get("/").status_code == 401
        assert c.get("/", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
        assert c.get("/dashboard.css").status_code == 200


def test_create_app_mounts_the_dashboard_by_default(seeded_db: tuple[str, Any, Seeded]) -> None:
    """``ampci serve`` builds ``create_app(settings, store=...)``: the dashboard is there without asking."""
    from fastapi.testclient import TestClient

    from service.api.app import create_app
    from service.settings import Settings

    url, store, s = seeded_db
    app = create_app(Settings(database_url=url, webhook_secret="x", api_token=TOKEN), store=store, background=False)
    with TestClient(app) as c:
        r = c.get(f"/runs/{s.main_runs[-1]}", follow_redirects=False, headers=BROWSER)
        assert r.status_code == 200 and 'id="matrix"' in r.text
        # API clients following a commit status link still land on the JSON
        r = c.get(f"/runs/{s.main_runs[-1]}", follow_redirects=False, headers={"Accept": "application/json"})
        assert r.status_code == 307 and r.headers["location"] == f"/api/runs/{s.main_runs[-1]}"
        assert c.get("/api/runs").json()["runs"]  # the JSON API is untouched
        paths = set(c.get("/openapi.json").json()["paths"])
        assert not {"/", "/runs", "/history", "/regressions/{regression_id}/triage"} & paths


def test_pages_render_on_sqlite(sqlite_url: str) -> None:
    """The embedded default (SQLite) serves the same pages from the same code."""
    from fastapi.testclient import TestClient

    from service.db import Store
    from tests.service.dashboard.seed import seed

    store = Store.from_url(sqlite_url)
    store.upgrade()
    s = seed(store)
    try:
        with TestClient(make_app(store, sqlite_url), headers=BROWSER) as c:
            run = c.get(f"/runs/{s.main_runs[-1]}").text
            assert run.count('data-state="reg-') == 3
            hist = c.get(history_url(LAT_CELL)).text
            assert hist.count('data-points="6"') == 5 and hist.count('class="ci"') == 6
            assert c.get(f"/regressions/{s.regressions[LAT_CELL]}").status_code == 200
            assert c.get("/runs?branch=main").text.count("data-run-id=") == len(s.main_runs)
    finally:
        store.dispose()
