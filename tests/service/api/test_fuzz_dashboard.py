"""Property-based fuzzing of every dashboard route: no path or query parameter, however malformed, gets
a 5xx, and errors are the dashboard's HTML page (or, for a JSON client of /runs/{id}, a redirect).

Values mix Unicode digits ('²', '٣', '１'), huge, negative and float-looking numbers, empty strings,
control characters and NUL, over-long text, and real ids and cell names of the seeded database, so
that both the guards and the queries behind them are reached.  Bounded: 2,000 requests (about 40 s).
"""

from __future__ import annotations

import string
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.service.api.helpers import API_TOKEN, encode, push_payload, sha, webhook_headers

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

NUMBERS = st.sampled_from(["0", "1", "2", "-1", "+1", "1_0", " 1", "1 ", "1.0", "1e3", "0x10", "00000000001",
                           "9" * 18, "9" * 19, "9" * 400, str(2**31 - 1), str(2**31), str(2**63), "-" + "9" * 30,
                           "\u00b2", "\u00b3", "\u0663", "\uff11", "\u0967", "\u00bd", "\u2163", "1\u0663"])
CONTROL = st.text(alphabet=st.characters(codec="utf-8", categories=["Cc", "Cf", "Zs", "Nd", "No", "Nl"]),
                  max_size=8)
NASTY = st.sampled_from(["", " ", "\x00", "%00", "\x7f", "\u202e", "../..", "a" * 5000, "<script>", "' OR 1=1",
                         "NaN", "null", "main\x00", "feature/x", "cpu", "fp16", "default", "all", "changed"])
VALUE = st.one_of(NUMBERS, NASTY, CONTROL, st.text(max_size=30), st.integers(-(2**80), 2**80).map(str))


@st.composite
def dashboard_requests(draw: st.DrawFn, ids: dict[str, list[str]]) -> dict[str, Any]:
    def pick(kind: str) -> str:
        return draw(st.one_of(st.sampled_from(ids[kind]), VALUE)) if ids[kind] else draw(VALUE)

    route = draw(st.sampled_from(["/", "/runs", "/runs/{id}", "/history", "/regressions/{id}",
                                  "/regressions/{id}/triage", "/dashboard.css"]))
    method, query, content = "GET", {}, None
    names = {"/": ["branch", "trigger", "limit"], "/runs": ["branch", "trigger", "limit"], "/runs/{id}": ["diff"],
             "/history": ["model", "dtype", "policy", "target", "branch", "limit"], "/regressions/{id}": ["done"],
             "/regressions/{id}/triage": [], "/dashboard.css": []}[route]
    for name in names:
        if draw(st.integers(0, 3)):
            query[name] = pick(name) if name in ids else draw(VALUE)
    if draw(st.booleans()):
        query[draw(st.text(string.ascii_lowercase, min_size=1, max_size=6))] = draw(VALUE)
    url = route.replace("{id}", quote(pick("run" if route.startswith("/runs") else "regression"), safe="") or "%20")
    if route.endswith("/triage"):
        method = "POST"
        fields = {"token": draw(st.sampled_from([API_TOKEN, "", "nope", "\x00"])),
                  "action": draw(st.sampled_from(["ack", "false_positive", "", "delete", "\u00b2"])),
                  "by": draw(VALUE), "note": draw(VALUE)}
        content = "&".join(f"{k}={quote(v, safe='')}" for k, v in fields.items()).encode()
        if draw(st.integers(0, 5)) == 0:
            content = draw(st.binary(max_size=300))
    accept = draw(st.sampled_from(["text/html", "application/json", "*/*", ""]))
    return {"method": method, "url": url, "params": query, "content": content,
            "headers": {"Accept": accept, "Content-Type": "application/x-www-form-urlencoded"}}


@pytest.fixture
def fuzz_client(make_client: Any, store: Any) -> tuple[Any, dict[str, list[str]]]:
    client = make_client()  # the dashboard router is mounted by default
    for i in range(2):
        body = encode(push_payload(sha(f"dash-{i}"), before=sha(f"dash-parent-{i}")))
        assert client.post("/webhooks/github", content=body, headers=webhook_headers(body, "push")).status_code == 202
    runs = [str(r.id) for r in store.list_runs(limit=10)]
    jobs = [j for r in runs for j in store.jobs(int(r))]
    ids = {"run": runs, "regression": [str(r.id) for r in store.regressions(limit=10)],
           "model": sorted({j.model for j in jobs}), "dtype": sorted({j.dtype for j in jobs}),
           "policy": sorted({j.policy for j in jobs}), "target": sorted({j.target for j in jobs}),
           "branch": ["main"], "trigger": ["push", "nightly"], "limit": ["1", "2", "200", "1000"]}
    return client, ids


def test_no_dashboard_request_gets_a_server_error(fuzz_client: tuple[Any, dict[str, list[str]]]) -> None:
    client, ids = fuzz_client
    codes: dict[str, set[int]] = {}

    @settings(max_examples=2000, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                     HealthCheck.data_too_large, HealthCheck.filter_too_much])
    @given(dashboard_requests(ids))
    def check(req: dict[str, Any]) -> None:
        resp = client.request(req["method"], req["url"], params=req["params"], content=req["content"],
                              headers=req["headers"], follow_redirects=False)
        assert resp.status_code < 500, (req, resp.status_code, resp.text[:300])
        unrouted = "%2F" in req["url"].upper()  # an id holding '/' matches no route: the app's JSON 404
        if resp.status_code >= 400 and not unrouted:  # else the dashboard's own error page
            assert resp.headers.get("content-type", "").startswith("text/html"), (req, resp.status_code, resp.text[:200])
        codes.setdefault(req["url"].split("/")[1] or "/", set()).add(resp.status_code)

    check()
    seen = set().union(*codes.values())
    assert {200, 400, 404} <= seen, codes  # handlers, guards and lookups were all reached
