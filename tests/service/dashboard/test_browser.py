"""End-to-end: the real service (uvicorn subprocess on loopback) over a database seeded through the real
store code, driven by Debian's headless Chromium through Playwright.  Screenshots of each page are
saved as PNG artifacts (and copied to ``$AMPCI_SCREENSHOTS_DIR`` when set, e.g. ``docs/screenshots``).

CI must provide Chromium (``apt-get install chromium chromium-driver``) and the ``playwright``
package; without them these tests fail with a message saying so (they never download a browser).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.service.dashboard.conftest import TOKEN, seeded_database, served
from tests.service.dashboard.seed import (
    ACC_CELL,
    CELLS,
    CONV_CELL,
    LAT_CELL,
    WIDE_CELLS,
    Seeded,
    WideSeeded,
    seed,
    seed_wide,
)

pytestmark = [pytest.mark.browser, pytest.mark.postgres]

CHROMIUM = os.environ.get("AMPCI_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
STATE_COLOURS = {"reg-accuracy": "rgb(251, 217, 213)", "reg-latency": "rgb(255, 237, 184)",
                 "reg-conversion": "rgb(244, 210, 234)", "pass": "rgb(227, 242, 230)", "flaky": "rgb(236, 236, 236)",
                 "improved": "rgb(220, 233, 251)", "fail": "rgb(255, 244, 204)", "error": "rgb(61, 15, 15)"}


@pytest.fixture(scope="module")
def world() -> Iterator[tuple[Any, Seeded, WideSeeded]]:
    """(store, small scenario, 40x12 scenario) in one fresh database."""

    def both(store: Any) -> tuple[Seeded, WideSeeded]:
        small = seed(store)
        return small, seed_wide(store, parent=small.main_shas[-1])

    with seeded_database(both) as (url, store, (small, wide)):
        yield url, store, small, wide  # type: ignore[misc]


@pytest.fixture(scope="module")
def server(world: Any) -> Iterator[str]:
    """Base URL of the service started as a subprocess on a free loopback port (stopped by pid)."""
    with served(world[0]) as base:
        yield base


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Debian Chromium through Playwright (fails clearly when either is missing)."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"Chromium not found at {CHROMIUM}: install it (apt-get install -y chromium chromium-driver) "
                    "or set AMPCI_CHROMIUM; the dashboard browser tests need a real browser")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("the Python package 'playwright' is not installed (pip install playwright; "
                    "do not run 'playwright install': the tests use the system Chromium)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where screenshots go (a pytest temporary directory)."""
    return tmp_path_factory.mktemp("dashboard-screenshots")


@pytest.fixture
def page(browser: Any, server: str) -> Iterator[Any]:
    """A fresh 1440x900 page that records every request and console error."""
    context = browser.new_context(viewport={"width": 1440, "height": 900}, device_scale_factor=1)
    pg = context.new_page()
    pg.requests, pg.console_errors = [], []  # type: ignore[attr-defined]
    pg.on("request", lambda r: pg.requests.append(r.url))  # type: ignore[attr-defined]
    pg.on("console", lambda m: m.type == "error" and pg.console_errors.append(m.text))  # type: ignore[attr-defined]
    yield pg
    outside = [u for u in pg.requests if not u.startswith(server)]  # type: ignore[attr-defined]
    assert not outside, f"the page fetched from outside the service: {outside}"
    assert not pg.console_errors  # type: ignore[attr-defined]
    context.close()


def screenshot(pg: Any, shots: Path, name: str, full_page: bool = True) -> Path:
    """Save a PNG artifact (and a copy under $AMPCI_SCREENSHOTS_DIR when set)."""
    path = shots / name
    pg.screenshot(path=str(path), full_page=full_page)
    assert path.stat().st_size > 10_000
    if os.environ.get("AMPCI_SCREENSHOTS_DIR"):
        target = Path(os.environ["AMPCI_SCREENSHOTS_DIR"])
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, target / name)
    return path


def test_runs_page_lists_seeded_runs(page: Any, server: str, world: Any, shots: Path) -> None:
    _, _, small, wide = world
    page.goto(server + "/")
    rows = page.locator("tr[data-run-id]")
    ids = [int(rows.nth(i).get_attribute("data-run-id")) for i in range(rows.count())]
    assert ids == sorted([*small.main_runs, small.feature_run, *wide.runs], reverse=True)
    text = page.inner_text("#runs")
    assert small.main_shas[-1][:7] in text and "pass: revision 5 of the cast placement work" in text
    page.select_option("select[name=branch]", "feature/resize")
    page.click("form.filters button")
    assert page.locator("tr[data-run-id]").count() == 1 and "branch=feature" in page.url
    page.goto(server + "/")
    screenshot(page, shots, "runs.png")


def test_run_page_shows_regression_in_right_cell_and_colour(page: Any, server: str, world: Any, shots: Path) -> None:
    _, _, small, _ = world
    page.goto(f"{server}/runs/{small.main_runs[-1]}")
    assert page.locator("td.cell[data-cell]").count() == len(CELLS)
    for cell, state, word in ((ACC_CELL, "reg-accuracy", "acc"), (LAT_CELL, "reg-latency", "slow"),
                              (CONV_CELL, "reg-conversion", "conv"), (("mlp_small", "fp16", "default", "cpu"), "pass", "pass")):
        td = page.locator(f'td.cell[data-cell="{"/".join(cell)}"]')
        assert td.get_attribute("data-state") == state
        assert word in td.inner_text()  # told by a word (and an icon), not by colour alone
        assert td.evaluate("e => getComputedStyle(e).backgroundColor") == STATE_COLOURS[state]
    # the regression is listed above the matrix and its link opens the regression page
    page.click(f'#regressions a[href="/regressions/{small.regressions[ACC_CELL]}"]')
    assert page.url.endswith(f"/regressions/{small.regressions[ACC_CELL]}")
    assert "accuracy" in page.inner_text("h1")


def test_wide_matrix_fits_and_keeps_its_layout(page: Any, server: str, world: Any, shots: Path) -> None:
    _, _, _, wide = world
    page.goto(f"{server}/runs/{wide.runs[-1]}")
    cells = page.locator("td.cell[data-cell]")
    assert cells.count() == len(WIDE_CELLS) == 480
    assert page.locator("table.matrix tbody tr").count() == 40
    assert page.locator("table.matrix th.colh").count() == 12
    for cell, state in wide.states.items():
        td = page.locator(f'td.cell[data-cell="{"/".join(cell)}"]')
        assert td.get_attribute("data-state") == state, cell
        assert td.evaluate("e => getComputedStyle(e).backgroundColor") == STATE_COLOURS[state]
    # no layout break: the page itself never scrolls sideways, every cell has the same box
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    sizes = page.evaluate("""[...document.querySelectorAll('td.cell')].map(e => {
        const r = e.getBoundingClientRect(); return [r.width, r.height]; })""")
    widths, heights = [w for w, _ in sizes], [h for _, h in sizes]
    assert max(widths) - min(widths) <= 1.5 and max(heights) - min(heights) <= 1.5, (min(sizes), max(sizes))
    # text against background keeps at least 4.5:1 contrast in every state shown
    ratios = page.evaluate("""(() => {
        const lum = c => { const [r, g, b] = c.match(/\\d+/g).slice(0, 3).map(v => { v /= 255;
            return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); }); return 0.2126*r + 0.7152*g + 0.0722*b; };
        const out = {};
        for (const e of document.querySelectorAll('td.cell')) {
            const s = getComputedStyle(e), a = lum(s.color), b = lum(s.backgroundColor);
            out[e.dataset.state] = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
        }
        return out; })()""")
    assert ratios and min(ratios.values()) >= 4.5, ratios
    screenshot(page, shots, "run.png", full_page=False)
    page.evaluate("document.getElementById('matrix-h').scrollIntoView()")
    screenshot(page, shots, "run-matrix.png", full_page=False)


def test_history_page_draws_one_point_per_revision(page: Any, server: str, world: Any, shots: Path) -> None:
    _, _, small, _ = world
    page.goto(f"{server}/history?model={ACC_CELL[0]}&dtype={ACC_CELL[1]}&policy={ACC_CELL[2]}&target={ACC_CELL[3]}")
    for key in ("cosine", "latency_p50_ms", "speedup", "casts_inserted", "low_precision_fraction"):
        dots = page.locator(f"#chart-{key} .plot.overlay .serie-0 circle.dot")
        assert dots.count() == len(small.main_shas), key
        assert page.locator(f"#chart-{key} svg").bounding_box()["height"] > 150
    marker = page.locator("#chart-cosine .plot.overlay .serie-1 circle.dot")
    assert marker.count() == 1  # the regression at the last revision is marked
    screenshot(page, shots, "history.png")
    # clicking a point opens that revision's run (the last point lies under its regression marker,
    # which links to the same run; click the one before it)
    page.locator("#chart-cosine .plot.overlay .serie-0 circle.dot").nth(len(small.main_shas) - 2).click(timeout=5000)
    page.wait_for_url(f"**/runs/{small.main_runs[-2]}")


def test_acknowledge_needs_the_token(page: Any, server: str, world: Any, shots: Path) -> None:
    _, store, small, _ = world
    rid = small.regressions[ACC_CELL]
    page.goto(f"{server}/regressions/{rid}")
    screenshot(page, shots, "regression.png")
    with page.expect_navigation() as nav:
        page.click("#ack")  # no token typed
    assert nav.value.status == 401 and "Refused" in page.inner_text("h1")
    page.console_errors.remove("Failed to load resource: the server responded with a status of 401 (Unauthorized)")
    assert store.get_regression(rid).state == "open"
    page.goto(f"{server}/regressions/{rid}")
    page.fill("input[name=token]", TOKEN)
    page.fill("input[name=by]", "Grace")
    page.click("#ack")
    page.wait_for_url(f"**/regressions/{rid}?done=ack")
    assert "Marked acknowledged" in page.inner_text("#done")
    assert "acknowledged" in page.inner_text("#reg-state")
    got = store.get_regression(rid)
    assert (got.state, got.state_by) == ("acknowledged", "Grace")


@pytest.fixture(scope="module")
def kinds_world() -> Iterator[tuple[str, Any]]:
    """(base URL, seeded findings): one finding of every kind and category (tests.service.dashboard.seed_kinds) in a
    database of its own, served by a second service subprocess."""
    from tests.service.dashboard.seed_kinds import seed_every_finding

    with seeded_database(seed_every_finding) as (url, _, seeded), served(url) as base:
        yield base, seeded


def test_every_finding_kind_is_visible_in_the_browser(browser: Any, kinds_world: Any, shots: Path) -> None:
    """Each kind x category of the rules (and each timing kind in each confirmation state): its run page and regression page load without error and show the
    finding, visible, in its state's colour, told by a word and an icon too; the history page lists them all."""
    from service.dashboard import views

    base, seeded = kinds_world
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("console", lambda m: m.type == "error" and errors.append(m.text))
    try:
        for (kind, category, fstate), f in seeded.items():
            state = views.finding_state(f)  # type: ignore[arg-type]
            resp = pg.goto(f"{base}/runs/{f.run_id}")
            assert resp is not None and resp.status == 200, (kind, category)
            li = pg.locator("ul.findings li", has_text=f.detail)
            assert li.count() == 1 and li.is_visible(), (kind, category)
            assert kind in li.inner_text() and state.icon in li.inner_text()
            colour = li.evaluate("e => getComputedStyle(e).backgroundColor")
            assert colour not in ("rgba(0, 0, 0, 0)", "transparent"), (kind, category, "no state colour")
            assert pg.locator("#verdict").is_visible()
            resp = pg.goto(f"{base}/regressions/{f.regression_id}")
            assert resp is not None and resp.status == 200, (kind, category)
            assert category in pg.inner_text("#reg-state") and kind in pg.inner_text("h1")
            assert fstate.replace("_", " ") in pg.inner_text("#reg-state")  # the state in words
            assert pg.locator("#reg-state").evaluate("e => getComputedStyle(e).backgroundColor") == colour
        from tests.service.dashboard.seed_kinds import CELL

        pg.goto(f"{base}/history?model={CELL[0]}&dtype={CELL[1]}&policy={CELL[2]}&target={CELL[3]}&limit=200")
        for f in seeded.values():
            assert pg.locator("ul.findings li", has_text=f.detail).is_visible()
        screenshot(pg, shots, "history-every-kind.png")
        assert not errors, errors
    finally:
        context.close()
