"""Property-based fuzzing over the served OpenAPI schema: no request, however malformed, gets a 500.

A small schema-to-strategy translator (hypothesis) generates, for every operation, parameters
that follow the schema or deliberately break it (wrong types, huge numbers, NUL bytes, unicode,
missing required ones, unknown extras), JSON bodies that follow the schema or are arbitrary JSON or
bytes, and valid, invalid or missing bearer tokens and webhook signatures.  Every answer must be a
JSON body with a status below 500.
"""

from __future__ import annotations

import json
import string
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.github.signature import sign
from tests.service.api.helpers import (
    API_TOKEN,
    SECRET,
    drain,
    encode,
    pr_payload,
    push_payload,
    sha,
    webhook_headers,
)

pytestmark = [pytest.mark.postgres, pytest.mark.redis]

NASTY_TEXT = st.sampled_from(["", " ", "\x00", "0", "-1", "1e309", "NaN", "null", "true", "[]", "{}", "../../etc",
                              "%00", "ä\u202e", "x" * 5000, "9" * 40, "9" * 30, "' OR 1=1 --", "<script>"])
ANY_TEXT = st.one_of(NASTY_TEXT, st.text(max_size=60))
JSON_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                         st.floats(allow_nan=False, allow_infinity=False), ANY_TEXT)
ANY_JSON = st.recursive(JSON_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=5)), max_leaves=12)


def _resolve(schema: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        node: Any = root
        for part in schema["$ref"].lstrip("#/").split("/"):
            node = node[part]
        schema = node
    return schema


def conforming(schema: dict[str, Any], root: dict[str, Any], depth: int = 0) -> st.SearchStrategy[Any]:
    """Values that follow ``schema`` (as far as this small translator understands it)."""
    schema = _resolve(schema, root)
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "const" in schema:
        return st.just(schema["const"])
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return st.one_of([conforming(s, root, depth + 1) for s in schema[key]])
    kind = schema.get("type")
    if kind == "integer":
        return st.integers(min_value=schema.get("minimum", -(2**40)), max_value=schema.get("maximum", 2**40))
    if kind == "number":
        return st.floats(allow_nan=False, allow_infinity=False)
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    if kind == "string":
        if schema.get("format") == "date-time":
            return st.datetimes().map(lambda d: d.isoformat() + "Z")
        if "pattern" in schema:
            return st.from_regex(schema["pattern"], fullmatch=True).filter(lambda s: len(s) <= 300)
        return st.text(string.printable, min_size=schema.get("minLength", 0), max_size=schema.get("maxLength", 40))
    if kind == "array":
        return st.lists(conforming(schema.get("items", {}), root, depth + 1), max_size=3)
    if kind == "object" or "properties" in schema:
        if depth > 3:
            return st.just({})
        props = schema.get("properties", {})
        required = set(schema.get("required", []))
        return st.fixed_dictionaries(
            {k: conforming(v, root, depth + 1) for k, v in props.items() if k in required},
            optional={k: conforming(v, root, depth + 1) for k, v in props.items() if k not in required})
    return ANY_JSON


def value(schema: dict[str, Any], root: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Mostly conforming, sometimes hostile."""
    return st.one_of(conforming(schema, root), conforming(schema, root), ANY_TEXT, JSON_SCALARS)


def _as_param(v: Any) -> str:
    return json.dumps(v) if isinstance(v, dict | list) else str(v).lower() if isinstance(v, bool) else str(v)


@st.composite
def requests(draw: st.DrawFn, root: dict[str, Any]) -> dict[str, Any]:
    ops = [(path, method, op) for path, item in sorted(root["paths"].items())
           for method, op in sorted(item.items())]
    path, method, op = draw(st.sampled_from(ops))
    url, query, headers = path, {}, {}
    for p in op.get("parameters", []):
        if p["in"] == "header" or (not p.get("required") and draw(st.booleans())):
            continue
        if p["in"] == "query" and p.get("required") and draw(st.integers(0, 9)) == 0:
            continue  # leave a required parameter out
        v = _as_param(draw(value(p.get("schema", {}), root)))
        if p["in"] == "path":
            url = url.replace("{" + p["name"] + "}", quote(v, safe="") or "%20")
        else:
            query[p["name"]] = v
    if draw(st.booleans()):
        query[draw(st.text(string.ascii_lowercase, min_size=1, max_size=8))] = draw(ANY_TEXT)
    content: bytes | None = None
    body_schema = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
    if body_schema is not None or draw(st.integers(0, 5)) == 0:
        how = draw(st.sampled_from(["schema", "json", "bytes", "none"] if body_schema else ["json", "bytes"]))
        if how == "schema":
            content = json.dumps(draw(conforming(body_schema, root))).encode()
        elif how == "json":
            content = json.dumps(draw(ANY_JSON)).encode()
        elif how == "bytes":
            content = draw(st.binary(max_size=200))
        if content is not None:
            headers["Content-Type"] = draw(st.sampled_from(["application/json", "text/plain", "application/x-www-form-urlencoded"]))
    auth = draw(st.sampled_from(["none", "good", "bad", "garbage"]))
    if auth != "none":
        headers["Authorization"] = {"good": f"Bearer {API_TOKEN}", "bad": "Bearer nope",
                                    "garbage": "".join(c for c in draw(ANY_TEXT) if " " <= c <= "~")[:100]}[auth]
    if path == "/webhooks/github":
        if draw(st.booleans()):
            content = encode(draw(st.sampled_from([push_payload(sha("fz")), push_payload("0" * 39 + "z")])))
        content = content or b""
        event = draw(st.sampled_from(["push", "pull_request", "ping", "issues", "", "PUSH", "x" * 80]))
        delivery = draw(st.sampled_from(["", "fz-1", "fz-" + "a" * 120, "caf\u00c3\u00a9", None]))
        headers.update(webhook_headers(content, event or "push", delivery=delivery or None, secret=SECRET))
        headers["X-GitHub-Delivery"] = headers["X-GitHub-Delivery"].encode("latin-1")  # raw bytes on the wire
        if not event:
            del headers["X-GitHub-Event"]
        sig = draw(st.sampled_from(["good", "bad", "missing"]))
        if sig == "bad":
            headers["X-Hub-Signature-256"] = sign("wrong", content)
        elif sig == "missing":
            del headers["X-Hub-Signature-256"]
    return {"method": method.upper(), "url": url, "params": query, "content": content, "headers": headers}


@pytest.fixture
def fuzz_client(make_client, store):
    client = make_client()
    # Some real rows, so that valid ids and revisions reach the store's queries too.
    body = encode(push_payload(sha("seed"), before=sha("seed-parent")))
    assert client.post("/webhooks/github", content=body, headers=webhook_headers(body, "push")).status_code == 202
    return client


def test_no_request_gets_a_server_error(fuzz_client):
    root = fuzz_client.get("/openapi.json").json()
    seen: dict[str, set[int]] = {}

    @settings(max_examples=350, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                     HealthCheck.filter_too_much, HealthCheck.data_too_large])
    @given(requests(root))
    def check(req: dict[str, Any]) -> None:
        resp = fuzz_client.request(req["method"], req["url"], params=req["params"], content=req["content"],
                                   headers=req["headers"], follow_redirects=False)
        assert resp.status_code < 500, (req, resp.status_code, resp.text[:300])
        assert resp.headers.get("content-type", "").startswith("application/json"), (req, resp.text[:200])
        assert isinstance(resp.json(), dict)
        seen.setdefault(req["method"] + " " + req["url"].split("?")[0], set()).add(resp.status_code)

    check()
    codes = set().union(*seen.values())
    assert any(200 <= c < 300 for c in codes) and {401, 422} <= codes, seen  # it reached handlers, not just guards


# -- signed webhook bodies ----------------------------------------------------------------------------
RAW = "@@raw-json@@"  # a placeholder replaced by raw JSON text after serialisation
EXTREME_TIMES = ["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00", "1969-12-31T23:59:59Z",
                 "2100-01-01T00:00:00Z", "2026-13-45T99:00:00Z", "1970-01-01T00:00:00+01:00", "0", "-1"]
HOSTILE_TEXT = st.one_of(
    st.sampled_from(["\x00", "ma\x00in", "refs/heads/ma\x00in", "\x01\x02\x1f\x7f", "\ud800", "caf\udfff",
                     "refs/heads/\ud83d", "x" * 201, "y" * 5000, "refs/heads/" + "b" * 300, "f" * 256, "", " ",
                     "refs/heads/main", "main", "refs/tags/v1", "\u202e", "0" * 40, "G" * 40, "acme/amp-pass",
                     "a" * 199 + "/b", *EXTREME_TIMES]),
    st.text(max_size=30),
    st.text(st.characters(min_codepoint=0, max_codepoint=0x1f), max_size=8))
HOSTILE_NUMBER = st.one_of(st.integers(-(2**80), 2**80), st.sampled_from([0, -1, 2**31, 2**31 - 1, 2**63]),
                           st.floats())  # NaN and infinities serialise as NaN / Infinity
RAW_JSON = st.sampled_from(["[" * 70 + "]" * 70, '{"a":' * 65 + "1" + "}" * 65, "[" * 3000 + "]" * 3000,
                            "9" * 5000, "-0", "1e999", "-1e999", "[" * 500])  # the last one is malformed
WRONG_TYPE = st.one_of(st.none(), st.booleans(), st.lists(st.integers(), max_size=2),
                       st.dictionaries(st.text(max_size=3), st.integers(), max_size=2), HOSTILE_NUMBER, HOSTILE_TEXT,
                       st.just(RAW))


def _leaf_paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(node, dict):
        return [prefix] + [p for k, v in node.items() for p in _leaf_paths(v, (*prefix, k))] if prefix else \
            [p for k, v in node.items() for p in _leaf_paths(v, (k,))]
    if isinstance(node, list):
        return [prefix] + [p for i, v in enumerate(node) for p in _leaf_paths(v, (*prefix, i))]
    return [prefix]


def _get(node: Any, path: tuple[Any, ...]) -> Any:
    try:
        for key in path:
            node = node[key]
    except (KeyError, IndexError, TypeError):
        return None
    return node


def _set(node: Any, path: tuple[Any, ...], value: Any, delete: bool) -> None:
    for key in path[:-1]:
        node = node[key]
    if delete and isinstance(node, dict):
        node.pop(path[-1], None)
    else:
        node[path[-1]] = value


@st.composite
def signed_deliveries(draw: st.DrawFn) -> dict[str, Any]:
    """A push, pull_request or ping payload with one to four fields replaced by hostile values (or
    deleted), serialised in varying ways, signed over the exact bytes sent."""
    n = draw(st.integers(0, 10**6))
    event = draw(st.sampled_from(["push", "push", "pull_request", "pull_request", "ping"]))
    base: Any = {"push": lambda: push_payload(sha(f"fzw-{n}"), commits=[sha(f"fzw-{n}-a"), sha(f"fzw-{n}")]),
                 "pull_request": lambda: pr_payload(sha(f"fzw-{n}"), sha(f"fzw-base-{n}")),
                 "ping": lambda: {"zen": "Keep it logically awesome.", "hook_id": 1,
                                  "repository": {"full_name": "acme/amp-pass"}}}[event]()
    paths = _leaf_paths(base)
    raw = draw(RAW_JSON)
    for _ in range(draw(st.integers(0, 4))):
        path = draw(st.sampled_from(paths))
        if path[-1] in ("timestamp", "updated_at") and draw(st.booleans()):
            hostile: Any = draw(st.sampled_from(EXTREME_TIMES))
        elif isinstance(_get(base, path), str) and draw(st.integers(0, 2)):
            hostile = draw(HOSTILE_TEXT)  # a string field: mostly hostile strings
        else:
            hostile = draw(WRONG_TYPE)
        try:
            _set(base, path, hostile, delete=draw(st.integers(0, 5)) == 0)
        except (KeyError, IndexError, TypeError):
            pass  # an earlier replacement removed the parent
    if draw(st.integers(0, 9)) == 0:
        base = draw(WRONG_TYPE)  # not an object at all
    text = json.dumps(base, ensure_ascii=draw(st.booleans()), indent=draw(st.sampled_from([None, 1, "\t"])))
    text = text.replace(json.dumps(RAW), raw)
    body = text.encode("utf-8", "surrogatepass")  # a lone surrogate unescaped: not UTF-8 on the wire
    sent_as = draw(st.sampled_from([event, event, event, "pull_request" if event == "push" else "push"]))
    return {"event": sent_as, "body": body}


def _check_only_valid_rows(client: Any, store: Any, queued: set[str]) -> dict[str, int]:
    """After the intake ran: nothing pending or failed, every delivery answered ``queued`` became a
    run (nothing accepted can fail later for its content), every rejection has a reason, every run
    comes from one accepted delivery, every stored revision reads back with storable values."""
    import sqlalchemy as sa

    from service.db import models as m

    assert drain(client) >= 0 and store.count_pending_deliveries() == 0
    deliveries = store.list_deliveries(limit=100_000)
    states = {s: sum(d.status == s for d in deliveries) for s in {d.status for d in deliveries}}
    assert set(states) <= {"accepted", "rejected"}, states  # "failed" would be a bug of ours
    assert all(d.reason for d in deliveries if d.status == "rejected")
    late = [(d.delivery_id, d.status, d.reason) for d in deliveries if d.delivery_id in queued and d.run_id is None]
    assert not late, late[:5]
    runs = store.list_runs(limit=100_000)
    # every run comes from an accepted delivery (replayed bodies share their first copy's run)
    assert {r.id for r in runs} == {d.run_id for d in deliveries if d.run_id is not None}
    with store.transaction() as conn:
        shas = list(conn.execute(sa.select(m.Revision.sha)).scalars())
    for s in shas:  # every row reads back (no timestamp the driver cannot return)
        rev = store.get_revision(s)
        assert len(rev.branch or "") <= 200 and "\x00" not in (rev.message or "") + (rev.author or "")
        assert rev.committed_at is None or 1970 <= rev.committed_at.year < 2100
    for page in ("/", "/runs"):
        assert client.get(page, headers={"Accept": "text/html"}).status_code == 200
    return states


def test_no_signed_webhook_body_gets_a_server_error_or_leaves_a_bad_row(make_client, store):
    """Signed with the real secret (so every body reaches parsing and the database): deep nesting,
    NUL and control characters, lone surrogates, huge/negative/NaN numbers, extreme timestamps,
    over-long strings and wrong types in every field.  No 5xx; afterwards only valid rows."""
    import uuid

    client = make_client()
    body = encode(push_payload(sha("fz-seed")))
    assert client.post("/webhooks/github", content=body,
                       headers=webhook_headers(body, "push", delivery="fz-seed")).status_code == 202
    seen: dict[int, int] = {}
    queued: set[str] = {"fz-seed"}

    @settings(max_examples=1500, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                     HealthCheck.data_too_large, HealthCheck.large_base_example])
    @given(signed_deliveries())
    def check(d: dict[str, Any]) -> None:
        delivery = f"fzw-{uuid.uuid4().hex[:16]}"
        headers = webhook_headers(d["body"], d["event"], delivery=delivery, secret=SECRET)
        resp = fuzz_post(client, d["body"], headers)
        assert resp.status_code < 500, (d["event"], d["body"][:300], resp.status_code, resp.text[:300])
        assert isinstance(resp.json(), dict)
        if resp.json().get("status") == "queued":
            queued.add(delivery)
        seen[resp.status_code] = seen.get(resp.status_code, 0) + 1

    check()
    assert {200, 202, 400} <= set(seen), seen  # it reached every outcome, not just one guard
    states = _check_only_valid_rows(client, store, queued)
    assert states.get("accepted", 0) > 50 and states.get("rejected", 0) > 50, states


def fuzz_post(client: Any, body: bytes, headers: dict[str, str]) -> Any:
    """POST one delivery."""
    return client.post("/webhooks/github", content=body, headers=headers)
