"""The API validates filter values like the CLI: ``GET /api/results?dtype=fp8`` is a 400 listing the
choices (it used to answer ``200 []``), and so are an unknown status, target or policy name."""

from __future__ import annotations

from typing import Any

import pytest

from service.cli.main import main


@pytest.mark.postgres
@pytest.mark.parametrize(("query", "message"), [
    ("dtype=fp8", "dtype: unknown dtype 'fp8'; expected one of fp16, bf16"),
    ("status=passs", "status: unknown status 'passs' (did you mean 'pass'?); expected one of pass, fail_accuracy"),
    ("target=gpu", "target: unknown target 'gpu' (did you mean 'cpu'?); expected one of "),
    ("policy=agressive", "policy: unknown policy 'agressive' (did you mean 'aggressive'?); expected one of "),
])
def test_unknown_filter_values_are_a_400_listing_the_choices(make_client: Any, query: str, message: str):
    client = make_client()
    for path in ("/api/results", "/api/history?model=conv_net&dtype=fp16&"):
        if path.startswith("/api/history") and query.startswith(("dtype", "status")):
            continue
        sep = "" if path.endswith("&") else "?"
        resp = client.get(f"{path}{sep}{query}")
        assert resp.status_code == 400, (path, resp.text)
        body = resp.json()
        assert body["error"] == "bad_request" and body["message"].startswith(message), body
    resp = client.get("/api/history?model=conv_net&dtype=fp8")
    assert resp.status_code == 400 and "expected one of fp16, bf16" in resp.json()["message"]


@pytest.mark.postgres
@pytest.mark.parametrize("query", ["dtype=bf16", "status=fail_accuracy", "target=cuda-a100", "target=cpu",
                                   "policy=auto", "policy=policies/mine.toml", ""])
def test_known_filter_values_are_answered(make_client: Any, query: str):
    resp = make_client().get(f"/api/results?{query}")
    assert resp.status_code == 200 and resp.json() == {"results": []}, resp.text


def test_the_cli_refuses_the_same_value(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as exit_info:
        main(["results", "--dtype", "fp8"])
    assert exit_info.value.code == 2
    assert "unknown dtype 'fp8'; expected one of fp16, bf16" in capsys.readouterr().err
