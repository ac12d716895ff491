"""The acknowledge / false-positive form: it needs the API token, and without it nothing changes."""

from __future__ import annotations

from typing import Any

import pytest

from tests.service.dashboard.conftest import TOKEN, make_app
from tests.service.dashboard.seed import ACC_CELL, CONV_CELL, LAT_CELL, Seeded

pytestmark = pytest.mark.postgres


def post(client: Any, rid: int, **form: str) -> Any:
    return client.post(f"/regressions/{rid}/triage", data=form, follow_redirects=False)


def test_refused_without_or_with_wrong_token(client: Any, seeded_db: tuple[str, Any, Seeded]) -> None:
    _, store, s = seeded_db
    rid = s.regressions[ACC_CELL]
    for form in ({"action": "ack"}, {"action": "ack", "token": ""}, {"action": "ack", "token": TOKEN + "x"},
                 {"action": "false_positive", "token": "Bearer " + TOKEN}):
        r = post(client, rid, **form)
        assert r.status_code == 401 and "Refused" in r.text
        assert r.headers["content-type"].startswith("text/html")
    assert store.get_regression(rid).state == "open"
    # the JSON API's bearer header is not a substitute for the form's token field
    r = client.post(f"/regressions/{rid}/triage", data={"action": "ack"}, headers={"Authorization": f"Bearer {TOKEN}"},
                    follow_redirects=False)
    assert r.status_code == 401 and store.get_regression(rid).state == "open"


def test_acknowledge_with_token(client: Any, seeded_db: tuple[str, Any, Seeded]) -> None:
    _, store, s = seeded_db
    rid = s.regressions[LAT_CELL]
    r = post(client, rid, action="ack", token=TOKEN, by="Ada", note="known: new GEMM kernel")
    assert r.status_code == 303 and r.headers["location"] == f"/regressions/{rid}?done=ack"
    got = store.get_regression(rid)
    assert (got.state, got.state_by, got.state_note) == ("acknowledged", "Ada", "known: new GEMM kernel")
    page = client.get(r.headers["location"]).text
    assert "Marked acknowledged" in page and "acknowledged by Ada" in page
    # an acknowledged regression is still shown as a regression in its run
    run = client.get(f"/runs/{got.run_id}").text
    assert f'data-cell="{"/".join(LAT_CELL)}" data-state="reg-latency"' in run


def test_false_positive_with_token_clears_the_cell(client: Any, seeded_db: tuple[str, Any, Seeded]) -> None:
    _, store, s = seeded_db
    rid = s.regressions[CONV_CELL]
    r = post(client, rid, action="false_positive", token=TOKEN)
    assert r.status_code == 303 and store.get_regression(rid).state == "false_positive"
    run = client.get(f"/runs/{s.main_runs[-1]}").text
    # the conversion error itself remains visible, no longer as a regression
    assert f'data-cell="{"/".join(CONV_CELL)}" data-state="error"' in run


def test_bad_requests(client: Any, seeded_db: tuple[str, Any, Seeded]) -> None:
    _, store, s = seeded_db
    rid = s.regressions[ACC_CELL]
    assert post(client, rid, action="delete", token=TOKEN).status_code == 400
    assert post(client, 99999, action="ack", token=TOKEN).status_code == 404
    assert post(client, 0, action="ack", token=TOKEN).status_code == 404
    big = client.post(f"/regressions/{rid}/triage", content=b"token=" + b"x" * 20000,
                      headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert big.status_code == 413
    assert store.get_regression(rid).state == "open"


def test_disabled_without_configured_token(seeded_db: tuple[str, Any, Seeded]) -> None:
    from fastapi.testclient import TestClient

    url, store, s = seeded_db
    rid = s.regressions[ACC_CELL]
    with TestClient(make_app(store, url, api_token=""), raise_server_exceptions=False) as c:
        assert "Triage is disabled" in c.get(f"/regressions/{rid}").text
        assert post(c, rid, action="ack", token="anything").status_code == 403
    assert store.get_regression(rid).state == "open"
    with TestClient(make_app(store, url, api_token="", insecure_dev=True), raise_server_exceptions=False) as c:
        assert post(c, rid, action="ack").status_code == 303  # development mode, as the JSON API
    assert store.get_regression(rid).state == "acknowledged"
