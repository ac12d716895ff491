"""A job's stored message never carries the service's own credentials (issue 31), whatever shape they have."""

from __future__ import annotations

import pytest

from service.orchestration.jobs import redact_result
from service.settings import CREDENTIALS
from workers.result import JobResult


@pytest.mark.parametrize("name", [n for n in CREDENTIALS if not n.endswith("_FILE")])
def test_every_credential_setting_is_redacted_from_a_stored_message(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    value = "plain-looking-value-4711"  # no credential shape: only knowing the value catches it
    monkeypatch.setenv(name, value)
    r = JobResult(model="m", dtype="fp16", policy="default", target="cpu", status="convert_error",
                  message=f"pass failed (exit 1): found {value} in the environment")
    assert value not in redact_result(r).message and "[redacted]" in r.message


def test_passwords_of_the_database_and_broker_urls_are_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AMPCI_DATABASE_URL", "postgresql+psycopg://ampci:pw-db-4711@db/ampci")
    monkeypatch.setenv("AMPCI_BROKER_URL", "redis://:pw-redis-4711@redis:6379/0")
    r = JobResult(model="m", dtype="fp16", policy="default", target="cpu", status="convert_error",
                  message="saw pw-db-4711 and pw-redis-4711")
    assert "4711" not in redact_result(r).message


def test_a_private_key_quoted_line_by_line_is_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    body = "MIIEowIBAAKCAQEAx1y2z3" + "A" * 40
    monkeypatch.setenv("AMPCI_GITHUB_PRIVATE_KEY", f"-----BEGIN RSA PRIVATE KEY-----\n{body}\n-----END RSA PRIVATE KEY-----")
    r = JobResult(model="m", dtype="fp16", policy="default", target="cpu", status="convert_error",
                  message=f"line: {body}")
    assert body not in redact_result(r).message
