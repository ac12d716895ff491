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


def test_every_string_of_the_report_and_encoded_passwords_are_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    import base64

    from workers.result import GraphFacts

    monkeypatch.setenv("AMPCI_DATABASE_URL", "postgresql+psycopg://ampci:pw-db-4711xyz@db/ampci")
    pem = "-----BEGIN RSA PRIVATE KEY-----\nMIIEsecretbody\n-----END RSA PRIVATE KEY-----"
    b64 = base64.b64encode(b"pw-db-4711xyz").decode()
    r = JobResult(model="m", dtype="fp16", policy="default", target="cpu", status="pass",
                  graph=GraphFacts(kept_fp32=[{"node": pem, "op_type": "X", "graph": "main",
                                               "reason": f"hex {b'pw-db-4711xyz'.hex()} b64 {b64}"}]))
    text = redact_result(r).to_json()
    assert "MIIEsecretbody" not in text and b64 not in text and b"pw-db-4711xyz".hex() not in text, text
    assert "[redacted]" in text


def test_complete_job_stores_the_result_redacted(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the path that stores (Store.begin_job, then complete_job), not redact_result alone."""
    from service.orchestration.jobs import complete_job
    from tests.service.factories import chain, migrated_store
    from workers.result import GraphFacts

    monkeypatch.setenv("AMPCI_API_TOKEN", "plain-api-value-4711")
    store = migrated_store(db_url)
    try:
        sha = chain(store, 1)[0]
        r = JobResult(model="m", dtype="fp16", policy="default", target="cpu", status="convert_error",
                      message="pass failed: plain-api-value-4711",
                      graph=GraphFacts(kept_fp32=[{"node": "n", "op_type": "X", "graph": "main",
                                                   "reason": "token plain-api-value-4711"}]))
        run_id = store.create_run(sha, "push", cells=[r.cell])
        job = store.add_jobs(run_id, [r.cell])[0]
        start = store.begin_job(job.id, "w1")
        complete_job(store, start.run, start.job, r)
        rows = store.results(run_id=run_id)
        assert len(rows) == 1
        assert "4711" not in repr(rows[0]) and "[redacted]" in repr(rows[0]), rows[0]
        import sqlalchemy as sa

        with store.engine.connect() as conn:  # the stored document too (the job's data, not only its columns)
            stored = conn.execute(sa.text("SELECT data FROM results WHERE run_id = :r"), {"r": run_id}).scalar_one()
        assert "4711" not in str(stored) and "[redacted]" in str(stored), stored
    finally:
        store.dispose()
