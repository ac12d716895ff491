"""service.github.sanitize: the JSON depth scan, storable text, sane timestamps, limits = columns."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta, timezone

import pytest

from service.db import models as m
from service.github import sanitize as z
from service.github.events import PayloadError, parse_event
from service.settings import Settings


def nested(depth: int, inner: str = "1") -> str:
    return '{"a":' * (depth // 2) + "[" * (depth - depth // 2) + inner + "]" * (depth - depth // 2) + "}" * (depth // 2)


def test_depth_limit_is_exact_for_valid_json():
    z.check_json_depth(nested(64))
    with pytest.raises(z.TooDeepError, match="nested deeper than 64"):
        z.check_json_depth(nested(65))
    assert json.loads(nested(64))  # the scanned documents are real JSON


def test_brackets_and_escaped_quotes_inside_strings_do_not_count():
    text = json.dumps({"s": "[" * 500 + '\\"{{{' + "\\" * 7 + '"' + "{" * 300})
    z.check_json_depth(text, limit=1)
    with pytest.raises(z.TooDeepError):
        z.check_json_depth(json.dumps({"s": '"', "t": [[["x"]]]}), limit=3)


def test_depth_scan_is_linear():
    hostile = '"' + '\\"' * 400_000  # an unterminated string of escaped quotes: quadratic for a naive regex
    # this process's CPU time, which other load on the machine does not inflate (a quadratic scan needs hours)
    t0 = time.process_time()
    z.check_json_depth(hostile)
    z.check_json_depth("[]" * 400_000)
    assert time.process_time() - t0 < 2.0


def test_parse_event_refuses_deep_json_as_a_payload_error():
    settings = Settings(webhook_secret="s", allowed_repos="acme/amp-pass")
    for body in (nested(65).encode(), b'{"ref":' + b"[" * 100_000 + b"}"):
        with pytest.raises(PayloadError, match="nested deeper than 64"):
            parse_event("push", body, settings)


def test_free_text_is_storable_and_bounded():
    assert z.free_text("a\x00b\ud800c", 10) == "ab\ufffdc"
    assert z.free_text("x" * 500, 300) == "x" * 300
    assert z.free_text(None, 3) is None
    assert z.free_text("tab\tnewline\n", 50) == "tab\tnewline\n"  # other control characters are storable text


@pytest.mark.parametrize("bad", ["ma\x00in", "a\x01b", "x\x7f", "\ud800", "b" * 201])
def test_name_text_refuses_what_it_would_have_to_alter(bad: str):
    with pytest.raises(ValueError):
        z.name_text(bad, 200)
    assert z.name_text("feature/ünïcode-ok", 200) == "feature/ünïcode-ok"


def test_sane_time_normalises_to_utc_and_refuses_the_extremes():
    assert z.sane_time(datetime(2026, 1, 1, 12, tzinfo=timezone(timedelta(hours=2)))) == datetime(2026, 1, 1, 10,
                                                                                                   tzinfo=UTC)
    assert z.sane_time(datetime(2026, 1, 1)) == datetime(2026, 1, 1, tzinfo=UTC)
    for bad in (datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=14))),
                datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone(timedelta(hours=-14))),
                datetime(1969, 12, 31, 23, 59, 59, tzinfo=UTC), datetime(2100, 1, 1, tzinfo=UTC),
                datetime(1970, 1, 1, 0, 30, tzinfo=timezone(timedelta(hours=1)))):
        with pytest.raises(ValueError, match="out of range"):
            z.sane_time(bad)


def test_limits_fit_their_columns():
    rev, dlv = m.Revision.__table__.c, m.WebhookDelivery.__table__.c
    assert z.BRANCH_MAX <= rev.branch.type.length
    assert z.AUTHOR_MAX <= rev.author.type.length
    assert z.REPOSITORY_MAX <= dlv.repository.type.length
    assert getattr(rev.message.type, "length", None) is None  # text: MESSAGE_MAX only bounds the payload size
