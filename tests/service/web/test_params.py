"""Strict integer parameters (service/web/params.py) and their use on every route: the JSON API
answers 422 with a JSON error, the dashboard 404 (ids in paths) or 400 (limits) with its HTML page;
nothing that Python's ``int()`` would stumble on or quietly accept reaches a handler."""

from __future__ import annotations

from typing import Any

import pytest

from service.errors import NotFoundError, UserError
from service.web.params import MAX_DIGITS, path_id, query_int, strict_int
from tests.service.api.helpers import API_TOKEN

# '²' passes str.isdigit() but int() raises; '٣' and '１' are digits int() accepts; the rest int() accepts.
NOT_ASCII_DIGITS = ["\u00b2", "\u00b3", "\u0663", "\uff11", "1_0", " 1", "1 ", "+1", "-1", "1.0", "0x1", "",
                    "1\x00", "\n1", "9" * (MAX_DIGITS + 1)]


@pytest.mark.parametrize("raw", NOT_ASCII_DIGITS)
def test_strict_int_refuses_everything_but_bounded_ascii_digits(raw: str) -> None:
    assert strict_int(raw, 0, 10**30) is None


def test_strict_int_bounds_and_values() -> None:
    assert strict_int("0") == 0 and strict_int("007") == 7 and strict_int("9" * MAX_DIGITS, 0, 10**MAX_DIGITS) == 10**MAX_DIGITS - 1
    assert strict_int("0", 1, 5) is None and strict_int("6", 1, 5) is None and strict_int("5", 1, 5) == 5
    assert strict_int(None) is None  # type: ignore[arg-type]


def test_path_id_and_query_int_raise_the_service_errors() -> None:
    assert path_id("12", "run") == 12
    for raw in ("0", "\u00b2", "2147483648"):
        with pytest.raises(NotFoundError, match="no run"):
            path_id(raw, "run")
    assert query_int("", "limit", 1, 10, 7) == 7 and query_int("10", "limit", 1, 10, 7) == 10
    for raw in ("11", "0", "\u00b2", "-1", " 3"):
        with pytest.raises(UserError, match="limit: give a whole number from 1 to 10"):
            query_int(raw, "limit", 1, 10, 7)


@pytest.fixture
def client(make_client: Any) -> Any:
    return make_client()


DASHBOARD_404 = ["/runs/%C2%B2", "/runs/%D9%A3", "/runs/+1", "/runs/1_0", "/runs/" + "9" * 30,
                 "/regressions/%C2%B3", "/regressions/%EF%BC%91", "/regressions/-1"]
DASHBOARD_400 = ["/runs?limit=%C2%B2", "/?limit=%D9%A3", "/runs?limit=1_0", "/runs?limit=-5", "/runs?limit=" + "9" * 40,
                 "/history?model=m&dtype=fp16&policy=default&target=cpu&limit=%C2%B2",
                 "/history?model=m&dtype=fp16&policy=default&target=cpu&limit=%20%205"]


def test_dashboard_malformed_ids_are_html_404(client: Any) -> None:
    html = {"Accept": "text/html"}
    for path in DASHBOARD_404:
        r = client.get(path, headers=html)
        assert r.status_code == 404 and r.headers["content-type"].startswith("text/html"), (path, r.status_code)
        r = client.get(path)  # a JSON client (the redirect to /api/runs/{id}) gets no redirect either
        assert r.status_code == 404, (path, r.status_code)
    r = client.post("/regressions/%C2%B2/triage", content=b"action=ack&token=" + API_TOKEN.encode(),
                    headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert r.status_code == 404 and r.headers["content-type"].startswith("text/html")


def test_dashboard_malformed_limits_are_html_400(client: Any) -> None:
    for path in DASHBOARD_400:
        r = client.get(path, headers={"Accept": "text/html"})
        assert r.status_code == 400 and "limit: give a whole number" in r.text, (path, r.status_code, r.text[:200])
    assert client.get("/runs?limit=", headers={"Accept": "text/html"}).status_code == 200  # empty: the default
    assert client.get("/runs?limit=7", headers={"Accept": "text/html"}).status_code == 200


API_422 = ["/api/runs/%C2%B2", "/api/runs/+1", "/api/runs/1_0", "/api/runs/%201", "/api/results/1.0",
           "/api/regressions/%D9%A3", "/api/runs?limit=%C2%B2", "/api/runs?limit=+5", "/api/runs?limit=1_0",
           "/api/results?run_id=%201", "/api/history?model=m&dtype=fp16&limit=%EF%BC%91",
           "/api/runs/" + "9" * 30]


def test_api_integers_are_ascii_digits_only(client: Any) -> None:
    for path in API_422:
        r = client.get(path)
        assert r.status_code == 422 and r.json()["error"] == "invalid_request", (path, r.status_code, r.text[:200])
    for path in ("/api/regressions/%C2%B2/ack", "/api/regressions/+3/false-positive"):
        r = client.post(path, headers={"Authorization": f"Bearer {API_TOKEN}"})
        assert r.status_code == 422, (path, r.status_code)
    assert client.get("/api/runs?limit=5").status_code == 200
    assert client.get("/api/runs/7").status_code == 404
