"""The run page says how the pass under test was sandboxed (issue 31), read from each stored result."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.service.dashboard.conftest import BROWSER, make_app
from tests.service.dashboard.seed import make_result, sha

CELLS = [("yolo_user", "fp16", "default", "cpu"), ("yolo_user", "bf16", "default", "cpu")]


@pytest.mark.parametrize(("modes", "shown", "warns"), [
    (["full", "full"], "full in 2 of 2 cells", False),
    (["full", "best-effort"], "best-effort in 1 of 2 cells", True),
])
def test_run_page_shows_the_pass_sandbox(tmp_path: Path, modes: list[str], shown: str, warns: bool) -> None:
    from fastapi.testclient import TestClient

    from service.db import Store

    url = f"sqlite:///{tmp_path / 'ampci.db'}"
    store = Store.from_url(url)
    store.upgrade()
    try:
        s = sha("sandbox-row")
        store.upsert_revision(s, parents=[], branch="main", message="m")
        run = store.create_run(s, "push", cells=CELLS)
        for i, (cell, mode) in enumerate(zip(CELLS, modes, strict=True)):
            r = make_result(cell, s, i, random.Random(i))
            r.environment = {**r.environment, "sandbox": mode}
            store.write_result(run, r)
        store.finish_run(run)
        assert store.sandbox_modes(run) == modes
        with TestClient(make_app(store, url), raise_server_exceptions=False, headers=BROWSER) as c:
            page = c.get(f"/runs/{run}").text
        row = page.split('id="sandbox"', 1)[1].split("</dd>", 1)[0]
        assert shown in row and ('class="warn"' in row) is warns
    finally:
        store.dispose()
