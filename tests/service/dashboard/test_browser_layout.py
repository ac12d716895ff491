"""The dashboard's layout at the widths people use (1400 and 1024 px), in Debian's headless Chromium:
long commit subjects stay inside their column (they spilled over Trigger/Status/Cells in the runs table and
over the history "Data" table), the runs table fits at 1400 px with its Duration column whole (it
scrolled sideways and cut Duration), and no page scrolls sideways.  Screenshots of every page at both
widths are saved (and copied to ``$AMPCI_SCREENSHOTS_DIR`` when set: ``docs/screenshots``)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.service.dashboard.conftest import seeded_database, served
from tests.service.dashboard.seed import ACC_CELL, CELLS, make_result, seed, sha, write_all
from tests.service.dashboard.test_browser import CHROMIUM_ARGS, browser, screenshot  # noqa: F401 - fixture

pytestmark = [pytest.mark.browser, pytest.mark.postgres]

WIDTHS = (1400, 1024)
LONG_SUBJECT = ("Keep Resize scales and the Loop-carried accumulators in fp32 when the calibration ranges say they "
                "overflow, and stop re-inserting casts between consecutive MatMul/Add pairs of attention blocks")
LONG_WORD = "amp_pass/passes/insert_casts_between_consecutive_low_precision_nodes_of_the_same_dtype_and_scope.py"


def seed_long_subjects(store: Any) -> Any:
    """The small scenario plus two main revisions whose subjects are a long sentence and one long
    unbreakable word, and a ping delivery naming its repository; returns the small scenario."""
    from service.orchestration.judge import detect_run

    seeded = seed(store)
    rng = random.Random(3)
    parent = seeded.main_shas[-1]
    for i, subject in enumerate((LONG_SUBJECT, f"Move {LONG_WORD} next to the painter")):
        rev = sha(f"long-{i}")
        store.upsert_revision(rev, parents=[parent], branch="main", author="Margaret Hamilton",
                              message=f"{subject}\n\nbody", committed_at=datetime(2026, 11, 21, 9 + i, tzinfo=UTC))
        run = store.create_run(rev, "push", cells=CELLS)
        write_all(store, run, [make_result(cell, rev, 6 + i, rng) for cell in CELLS])
        detect_run(store, run)
        parent = rev
    store.record_delivery("7e3f1c60-aaaa-bbbb-cccc-0123456789ab", "ping", "accepted", reason="ping",
                          repository="acme/amp-pass")
    return seeded


@pytest.fixture(scope="module")
def layout_server() -> Iterator[tuple[str, Any]]:
    """(base URL, seeded) of a service over :func:`seed_long_subjects`."""
    with seeded_database(seed_long_subjects) as (url, _, seeded), served(url) as base:
        yield base, seeded


@pytest.fixture(params=WIDTHS, ids=[f"{w}px" for w in WIDTHS])
def sized(request: pytest.FixtureRequest, browser: Any) -> Iterator[tuple[Any, int]]:  # noqa: F811
    """(page, width): a fresh page of that width, 900 px high, failing on console errors."""
    width = request.param
    context = browser.new_context(viewport={"width": width, "height": 900}, device_scale_factor=1)
    pg = context.new_page()
    errors: list[str] = []
    pg.on("console", lambda m: m.type == "error" and errors.append(m.text))
    yield pg, width
    assert not errors, errors
    context.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("dashboard-layout-screenshots")


#: For each ``td.msg`` of a table: does its text stay inside the cell (no overflow, no overlap with the
#: next cell)?  Returns the offending cells' texts.
SPILLS = """(sel) => [...document.querySelectorAll(sel + ' td.msg')].filter(td => {
    const r = td.getBoundingClientRect(), next = td.nextElementSibling;
    const inner = [...td.querySelectorAll('*'), td].map(e => e.getBoundingClientRect().right);
    const spill = td.scrollWidth > td.clientWidth + 1 || Math.max(...inner) > r.right + 1;
    return spill || (next && next.getBoundingClientRect().left < r.right - 1);
}).map(td => td.innerText.slice(0, 60))"""


def _no_sideways_page_scroll(pg: Any) -> None:
    assert pg.evaluate("document.documentElement.scrollWidth <= window.innerWidth"), \
        pg.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")


def test_runs_table_keeps_long_subjects_in_their_column(sized: tuple[Any, int], layout_server: Any,
                                                        shots: Path) -> None:
    pg, width = sized
    base, _ = layout_server
    pg.goto(base + "/")
    text = pg.inner_text("#runs")
    assert "Keep Resize scales" in text and "amp_pass/passes/insert_casts" in text
    assert pg.evaluate(SPILLS, "#runs") == []
    _no_sideways_page_scroll(pg)
    subject = pg.locator("#runs td.msg .subject", has_text="Keep Resize scales").first
    assert subject.get_attribute("title", timeout=2000).startswith(LONG_SUBJECT[:60])  # the whole subject on hover
    # the whole table fits at both widths: no sideways scrolling, the last column whole
    wrap = pg.locator("#runs").locator("xpath=..")
    assert wrap.evaluate("e => e.scrollWidth <= e.clientWidth"), wrap.evaluate("e => [e.scrollWidth, e.clientWidth]")
    duration = pg.locator("#runs thead th", has_text="Duration").bounding_box()
    assert duration is not None and duration["x"] + duration["width"] <= width
    screenshot(pg, shots, f"runs-{width}.png")


def test_history_data_table_keeps_long_subjects_in_their_column(sized: tuple[Any, int], layout_server: Any,
                                                                shots: Path) -> None:
    pg, width = sized
    base, _ = layout_server
    pg.goto(f"{base}/history?model={ACC_CELL[0]}&dtype={ACC_CELL[1]}&policy={ACC_CELL[2]}&target={ACC_CELL[3]}")
    assert "Keep Resize scales" in pg.inner_text("#history-table")
    assert pg.evaluate(SPILLS, "#history-table") == []
    _no_sideways_page_scroll(pg)
    wrap = pg.locator("#history-table").locator("xpath=..")
    assert wrap.evaluate("e => e.scrollWidth <= e.clientWidth"), wrap.evaluate("e => [e.scrollWidth, e.clientWidth]")
    screenshot(pg, shots, f"history-{width}.png")


def test_other_pages_at_both_widths(sized: tuple[Any, int], layout_server: Any, shots: Path) -> None:
    pg, width = sized
    base, seeded = layout_server
    pg.goto(f"{base}/runs/{seeded.main_runs[-1]}")
    _no_sideways_page_scroll(pg)
    screenshot(pg, shots, f"run-{width}.png", full_page=False)
    pg.goto(f"{base}/regressions/{seeded.regressions[ACC_CELL]}")
    _no_sideways_page_scroll(pg)
    screenshot(pg, shots, f"regression-{width}.png")
    pg.goto(f"{base}/regressions?state=all")
    _no_sideways_page_scroll(pg)
    screenshot(pg, shots, f"regressions-{width}.png")
    pg.goto(f"{base}/deliveries")
    assert "acme/amp-pass" in pg.inner_text("#deliveries")
    assert pg.evaluate(SPILLS, "#deliveries") == []
    _no_sideways_page_scroll(pg)
    screenshot(pg, shots, f"deliveries-{width}.png")
