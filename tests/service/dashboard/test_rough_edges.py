"""Dashboard rough edges a new user hits (issue 18): the history of a run started from the CLI (no
branch), the branch filter, a history without policy/target, cosine ticks that separate, a latency
axis that does not start below 0, and an unmeasured latency shown as "–"."""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from service.dashboard import views
from tests.service.dashboard.conftest import BROWSER, make_app
from tests.service.dashboard.seed import make_result, sha
from workers.result import JobResult, LatencyStats

A = ("yolo_user", "fp16", "default", "cpu")
B = ("yolo_user", "fp16", "conservative", "cpu")
COSINES = (0.9999990, 0.9999996, 0.9999999)  # "0.999999", "1" and "1" at 6 significant digits


@dataclass
class World:
    client: Any
    main_shas: list[str]
    cli_run: int
    cli_sha: str


def _result(cell: tuple[str, str, str, str], revision: str, step: int, cosine: float,
            latency_ms: float | None) -> JobResult:
    r = make_result(cell, revision, step, random.Random(step))
    assert r.accuracy is not None and r.accuracy.worst is not None and r.latency is not None
    r.accuracy.worst.cosine = cosine
    if latency_ms is None:  # the job could not time the converted model: no samples, zeros in the struct
        r.latency = LatencyStats(provider="CPUExecutionProvider", error="no kernels for this dtype")
    else:
        r.latency.samples_ms = [latency_ms * (1 + 0.01 * i) for i in range(5)]
        r.latency.p50_ms = r.latency.min_ms = latency_ms
        r.latency.speedup = 1.2
    return r


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """Two ``push`` runs on main for cell A (latencies 0.01 and 1.0 ms), then a ``manual`` run started from
    the CLI on a revision without a branch, for cells A and B (A's latency unmeasured there)."""
    from fastapi.testclient import TestClient

    from service.db import Store
    from service.orchestration.judge import detect_run

    url = f"sqlite:///{tmp_path_factory.mktemp('rough') / 'ampci.db'}"
    store = Store.from_url(url)
    store.upgrade()
    shas = [sha(f"rough-main-{i}") for i in range(2)]
    for i, s in enumerate(shas):
        store.upsert_revision(s, parents=shas[i - 1:i], branch="main", message=f"main {i}")
        run = store.create_run(s, "push", cells=[A])
        store.write_result(run, _result(A, s, i, COSINES[i], (0.01, 1.0)[i]))
        store.finish_run(run)
        detect_run(store, run)
    cli_sha = sha("rough-worktree")
    cli_run = store.create_run(cli_sha, "manual", cells=[A, B])  # the revision is stored bare: no branch
    store.write_result(cli_run, _result(A, cli_sha, 2, COSINES[2], None))
    store.write_result(cli_run, _result(B, cli_sha, 2, COSINES[2], 2.0))
    store.finish_run(cli_run)
    detect_run(store, cli_run)
    try:
        with TestClient(make_app(store, url), raise_server_exceptions=False, headers=BROWSER) as c:
            yield World(c, shas, cli_run, cli_sha)
    finally:
        store.dispose()


def _q(cell: tuple[str, str, str, str], **extra: str) -> str:
    q = dict(zip(("model", "dtype", "policy", "target"), cell, strict=True), **extra)
    return "/history?" + "&".join(f"{k}={v}" for k, v in q.items())


def _points(html: str) -> int:
    return int(re.search(r'id="history-count">(\d+) revision', html).group(1))  # type: ignore[union-attr]


def _selected_branch(html: str) -> list[str]:
    select = html.split('<select name="branch">', 1)[1].split("</select>", 1)[0]
    return re.findall(r'<option value="([^"]*)" selected>', select)


def test_matrix_cell_of_a_cli_run_opens_a_history_with_its_results(world: World) -> None:
    page = world.client.get(f"/runs/{world.cli_run}").text
    hrefs = re.findall(r'<a href="(/history\?[^"]+)">', page)
    assert hrefs and all("branch=all" in h for h in hrefs)  # the run's revision has no branch
    hist = world.client.get(hrefs[0].replace("&amp;", "&"))
    assert hist.status_code == 200 and "No results of this cell" not in hist.text and _points(hist.text) >= 1
    # no branch asked for: main has nothing of cell B, so every branch is shown, and said so
    b = world.client.get(_q(B)).text
    assert _points(b) == 1 and "main has no result of this cell" in b and _selected_branch(b) == ["all"]


def test_branch_filter_all_and_the_drop_down_says_what_is_shown(world: World) -> None:
    on_main = world.client.get(_q(A)).text  # the default: main
    assert _points(on_main) == 2 and _selected_branch(on_main) == ["main"]
    every = world.client.get(_q(A, branch="all")).text
    assert _points(every) == 3 and _selected_branch(every) == ["all"]
    assert _points(world.client.get(_q(A, branch="")).text) == 3
    other = world.client.get(_q(A, branch="release/1.0")).text  # a branch no revision is on
    assert "No results of this cell on release/1.0" in other and _selected_branch(other) == ["release/1.0"]
    runs = world.client.get("/runs?branch=all").text
    assert runs.count("data-run-id=") == 3 and _selected_branch(runs) == ["all"]


def test_history_without_policy_or_target_lists_the_cells(world: World) -> None:
    r = world.client.get("/history?model=yolo_user&dtype=fp16")
    assert r.status_code == 200
    links = re.findall(r'href="(/history\?[^"]+)"', r.text)
    assert len(links) == 2 and any("policy=conservative" in x for x in links) and any("policy=default" in x
                                                                                       for x in links)
    one = world.client.get("/history?model=yolo_user&dtype=fp16&policy=conservative")  # one cell: its history
    assert one.status_code == 200 and 'id="chart-cosine"' in one.text
    assert world.client.get("/history?model=nope&dtype=fp16").status_code == 404


def _y_labels(html: str, chart: str) -> list[str]:
    svg = html.split(f'id="chart-{chart}"', 1)[1].split("</figure>", 1)[0]
    axis = svg.split('class="axis y', 1)[1].split('class="axis x', 1)[0]
    return re.findall(r"<text[^>]*>([^<]*)</text>", axis)


def test_cosine_ticks_separate_and_latency_axis_starts_at_zero(world: World) -> None:
    html = world.client.get(_q(A, branch="all")).text
    ticks = _y_labels(html, "cosine")
    assert len(set(ticks)) == len(ticks) >= 2 and "1" not in ticks, ticks
    latency = [float(t) for t in _y_labels(html, "latency_p50_ms")]
    assert latency and min(latency) >= 0, latency


def test_unmeasured_latency_is_a_dash(world: World) -> None:
    html = world.client.get(_q(A, branch="all")).text
    table = html.split('id="history-table"', 1)[1]
    row = next(r for r in table.split("<tr>") if world.cli_sha[:7] in r)
    nums = re.findall(r'<td class="num">([^<]*)</td>', row)
    assert nums[1:3] == ["–", "–"], nums  # p50 ms and the min–max range
    measured = _result(A, "x" * 40, 0, 0.9999, 1.0)
    unmeasured = _result(A, "y" * 40, 1, 0.9999, None)
    rows = {name: (base, new) for name, base, new, _ in views.result_numbers(measured, unmeasured)}
    assert rows["latency p50 ms"][1] == "–" and rows["speed-up"][1] == "–" and rows["latency min ms"][1] == "–"
    assert rows["latency p50 ms"][0] == "1"
