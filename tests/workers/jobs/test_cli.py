"""``ampci check`` end to end on a smoke model, and ``ampci zoo list|fetch``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from service.cli.main import main
from workers.result import JobResult


@pytest.fixture(autouse=True)
def _env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AMPCI_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("AMPCI_LATENCY_RUNS", "3")
    monkeypatch.setenv("AMPCI_LATENCY_WARMUP", "1")


def test_check_smoke_model_end_to_end_with_this_checkouts_pass(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["check", "conv_net", "--dtype", "fp16", "--policy", "default", "--target", "cpu",
                 "--revision", "HEAD", "--json"])
    result = JobResult.from_json(capsys.readouterr().out)
    assert code == 0, result.message
    assert result.status == "pass" and result.revision == "HEAD" and result.cell == ("conv_net", "fp16", "default", "cpu")
    assert result.accuracy is not None and result.accuracy.worst.task_metric_name == "top1"
    assert result.latency is not None and len(result.latency.samples_ms) == 3
    assert result.graph is not None and result.graph.nodes_total > 0
    assert result.environment["pass_revision"] == "HEAD"
    code = main(["check", "conv_net", "--dtype", "fp16"])
    text = capsys.readouterr().out
    assert code == 0 and text.startswith("conv_net fp16 policy=default target=cpu: PASS")
    assert "accuracy (emulation, CPUExecutionProvider): ok" in text and "speedup" in text


def test_check_bad_input_is_one_line_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as refused:  # a typed option: argparse's one-line usage error (issue 24)
        main(["check", "conv_net", "--dtype", "fp8"])
    out = capsys.readouterr()
    assert refused.value.code == 2 and out.out == "" and out.err.count("\n") == 1
    assert out.err.startswith("ampci check: error: argument --dtype: unknown dtype 'fp8'; expected one of fp16, bf16")
    assert main(["check", "no_such_model", "--json"]) == 2
    assert json.loads(capsys.readouterr().out)["status"] == "bad_spec"


@pytest.mark.parametrize("argv, where", [
    (["check", "conv_net", "--dtype", "fp8", "--json"], "argument --dtype: unknown dtype 'fp8'"),
    (["check", "--json"], "the following arguments are required: model"),
    (["check", "conv_net", "--jso", "--seed", "-1"], "argument --seed: must be between 0 and"),
    (["check", "conv_net", "--json", "--steps", "nan"], "argument --steps:"),
])
def test_check_json_usage_errors_are_one_json_line(argv: list[str], where: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Under --json an argparse usage error is a JSON object (one stdout line) besides the one stderr line,
    exit 2; without --json (or after ``--``) stdout stays empty."""
    with pytest.raises(SystemExit) as refused:
        main(argv)
    out = capsys.readouterr()
    assert refused.value.code == 2 and out.out.count("\n") == 1 and out.err.count("\n") == 1
    error = json.loads(out.out)
    assert error == {"error": "bad_input", "status": "usage", "exit_code": 2, "message": error["message"]}
    assert error["message"].startswith(where) and out.err == f"ampci check: error: {error['message']}\n"
    plain = [a for a in argv if not a.startswith("--j")]
    with pytest.raises(SystemExit):
        main(plain + ["--", "--json"] if plain[-1] != "check" else plain)
    assert capsys.readouterr().out == ""


def test_check_failed_conversion_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.workers.fakes import fake_pass

    root = fake_pass(tmp_path / "p", "reject")
    assert main(["check", "stateful_rnn", "--pass-root", str(root)]) == 1
    assert "CONVERT_ERROR" in capsys.readouterr().out


def test_zoo_list_and_fetch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["zoo", "list", "--tag", "smoke", "--json"]) == 0
    smoke = json.loads(capsys.readouterr().out)
    assert {e["name"] for e in smoke} and all("smoke" in e["tags"] for e in smoke)
    assert main(["zoo", "list"]) == 0
    assert "silero_vad" in capsys.readouterr().out
    assert main(["zoo", "fetch", "transformer_block", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert Path(row["path"]).is_file() and str(tmp_path / "cache") in row["path"]
    assert main(["zoo", "fetch", "nope"]) == 2
    assert "unknown model 'nope'" in capsys.readouterr().err
