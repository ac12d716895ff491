"""The run page shows the pass's stderr tail of each failed cell (issue 43), as text."""

from __future__ import annotations

import pytest

from tests.service.factories import chain, make_result, migrated_store, run_with

A = ("conv_net", "fp16", "default", "cpu")
B = ("conv_net", "bf16", "default", "cpu")


@pytest.mark.postgres
def test_the_run_page_shows_the_stderr_tail(pg_url: str) -> None:
    """The run page lists each failed cell's stderr tail (escaped text) under its status and message."""
    from fastapi.testclient import TestClient

    from tests.service.dashboard.conftest import BROWSER, make_app

    store = migrated_store(pg_url)
    (sha,) = chain(store, 1)
    bad = make_result(A, status="convert_error")
    bad.stderr_tail = "Traceback (most recent call last):\n<script>x</script>\nRuntimeError: walk: no producer"
    run_id = run_with(store, sha, [bad, make_result(B)], detect=False)
    try:
        with TestClient(make_app(store, pg_url), headers=BROWSER) as client:
            html = client.get(f"/runs/{run_id}").text
    finally:
        store.dispose()
    assert 'id="stderr-h"' in html and "conv_net fp16/default/cpu · convert_error: convert_error: boom" in html
    assert "RuntimeError: walk: no producer" in html and "&lt;script&gt;x&lt;/script&gt;" in html
    assert "<script>x" not in html
