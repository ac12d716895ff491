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
from tests.api.helpers import API_TOKEN, SECRET, encode, push_payload, sha, webhook_headers

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
