"""CLI queries end to end on both databases, checked against golden files (``AMPCI_UPDATE_GOLDEN=1`` rewrites)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from service.cli.main import main
from service.db import Store
from service.regressions.render import plot
from tests.service.factories import chain, make_result, migrated_store, run_with

GOLDEN = Path(__file__).resolve().parents[2] / "golden"
A, B, C = ("tiny_mlp", "fp16", "default", "cpu"), ("tiny_mlp", "bf16", "default", "cpu"), ("conv", "fp16", "default", "cpu")


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / f"{name}.txt"
    if os.environ.get("AMPCI_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert path.exists(), f"missing golden file {path}; run with AMPCI_UPDATE_GOLDEN=1"
    assert text == path.read_text()


def seed(store: Store) -> list[str]:
    shas = chain(store, 3)
    run_with(store, shas[0], [make_result(A), make_result(B, max_abs=4e-3), make_result(C, latency_ms=5.0)])
    run_with(store, shas[1], [make_result(A, status="fail_accuracy", max_abs=0.4),
                              make_result(B, max_abs=4e-3, latency_ms=4.0, seed=1),
                              make_result(C, status="convert_error")])
    run_with(store, shas[2], [make_result(A, max_abs=1.2e-3, seed=2), make_result(B, max_abs=4e-3, latency_ms=4.0, seed=3),
                              make_result(C, status="convert_error")])
    return shas


@pytest.fixture
def cli(db_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):  # type: ignore[no-untyped-def]
    store = migrated_store(db_url)
    shas = seed(store)
    store.dispose()
    monkeypatch.setenv("AMPCI_DATABASE_URL", db_url)
    monkeypatch.setenv("COLUMNS", "170")

    def run(*argv: str) -> tuple[int, str, str]:
        code = main(list(argv))
        out = capsys.readouterr()
        return code, out.out, out.err

    run.shas = shas  # type: ignore[attr-defined]
    return run


def test_golden_tables(cli) -> None:  # type: ignore[no-untyped-def]
    s = cli.shas
    for name, argv in [("runs", ["runs"]), ("run", ["run", "2"]), ("results", ["results", "--revision", s[1][:8]]),
                       ("regressions", ["regressions"]), ("compare", ["compare", s[0][:8], s[1][:8]]),
                       ("history", ["history", "tiny_mlp", "--dtype", "fp16", "--metric", "max_abs"])]:
        code, out, err = cli(*argv)
        assert (code, err) == (0, ""), argv
        check_golden(f"cli_{name}", out)


def test_regressions_gate(cli) -> None:  # type: ignore[no-untyped-def]
    s = cli.shas
    code, out, _ = cli("regressions", "--revision", s[1][:8], "--open", "--json")
    assert code == 1
    assert sorted((r["kind"], r["category"]) for r in json.loads(out)) == [("conversion", "regression"),
                                                                          ("latency", "regression")]
    code, out, _ = cli("regressions", "--revision", s[2][:8], "--json")
    assert code == 0 and [(r["kind"], r["category"]) for r in json.loads(out)] == [("accuracy", "improvement")]
    assert cli("regressions", "--run", "1")[0] == 0
    assert cli("regressions", "--run", "2")[0] == 1
    assert cli("regressions")[0] == 0  # no revision or run given: a listing, not a gate


def test_ack_and_false_positive(cli) -> None:  # type: ignore[no-untyped-def]
    s = cli.shas
    regs = json.loads(cli("regressions", "--open", "--category", "regression", "--json")[1])
    assert [(r["kind"], r["revision_sha"]) for r in regs] == [("latency", s[1]), ("conversion", s[1])]
    code, out, _ = cli("ack", str(regs[1]["id"]), "--false-positive", "--by", "carol", "--note", "runner died")
    assert code == 0 and out.strip() == f"regression {regs[1]['id']} (conversion conv/fp16/default/cpu): false_positive"
    assert cli("regressions", "--revision", s[1][:8])[0] == 1  # the latency regression is still open
    detail = json.loads(cli("ack", str(regs[0]["id"]), "--by", "dave", "--json")[1])
    assert (detail["state"], detail["state_by"]) == ("acknowledged", "dave") and detail["state_at"]
    assert cli("regressions", "--revision", s[1][:8])[0] == 0  # nothing open any more


BAD_INPUT = [
    (["run", "99"], "no run with id 99"),
    (["ack", "99"], "no regression with id 99"),
    (["compare", "ffff", "0000"], "unknown revision ffff"),
    (["compare", "0000000", "0000"], "ambiguous"),
    (["results", "--revision", "xyz"], "not a revision"),
    (["results", "--run", "77"], "no run with id 77"),
    (["history", "nope", "--dtype", "fp16"], "unknown model 'nope'"),
    (["history", "tiny_mlp", "--dtype", "fp16", "--metric", "speed"], "unknown metric 'speed'"),
]


def test_bad_input_is_one_line_exit_2(cli) -> None:  # type: ignore[no-untyped-def]
    for argv, message in BAD_INPUT:
        code, out, err = cli(*argv)
        assert code == 2 and out == "", argv
        assert err.count("\n") == 1 and message in err and err.startswith("ampci: error: "), argv


def test_unreachable_database_no_traceback_no_password(tmp_path: Path) -> None:
    env = {**os.environ, "AMPCI_DATABASE_URL": "postgresql+psycopg://u:pw-secret@127.0.0.1:1/x",
           "AMPCI_DATA_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "service.cli.main", "regressions", "--open"], env=env,
                          capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parents[3])
    assert proc.returncode == 3 and proc.stdout == ""
    assert proc.stderr.startswith("ampci: error: database unavailable at postgresql+psycopg://u:***@127.0.0.1:1/x")
    assert "pw-secret" not in proc.stderr and "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1


def test_plot_golden() -> None:
    values = [1.0, 1.1, 0.9, 1.0, None, 2.0, 2.1, 1.9, float("inf"), 2.0]
    text = plot(values, height=5, label="latency_p50_ms") + "\n" + plot([3.0] * 4, height=3) + "\n" + plot([]) + "\n"
    text += plot(list(range(200)), height=4, width=20) + "\n"
    check_golden("plot", text)


@pytest.mark.parametrize("argv", [["runs", "--limit", "-5"], ["results", "--limit", "0"],
                                  ["regressions", "--limit", "x"], ["serve", "--port", "99999"],
                                  ["regressions", "--since", "yesterday"]])
def test_out_of_range_arguments_are_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """A non-positive --limit (once accepted: SQL LIMIT -5 meant no limit) or a bad port: argparse's
    usage error, exit 2, no traceback."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith(f"ampci {argv[0]}: error: argument {argv[1]}")


UNKNOWN_FILTERS = [
    (["runs", "--status", "bogus"], "unknown run status 'bogus'", "complete"),
    (["runs", "--trigger", "cron"], "unknown trigger 'cron'", "pull_request"),
    (["results", "--status", "nope"], "unknown result status 'nope'", "convert_error"),
    (["results", "--dtype", "fp8"], "unknown dtype 'fp8'", "bf16"),
    (["results", "--target", "tpu"], "unknown target 'tpu'", "cuda"),
    (["results", "--policy", "agressive"], "did you mean 'aggressive'", "conservative"),
    (["history", "tiny_mlp", "--dtype", "fp8"], "unknown dtype 'fp8'", "fp16"),
    (["history", "tiny_mlp", "--dtype", "fp16", "--target", "gpu"], "unknown target 'gpu'", "cpu"),
    (["history", "tiny_mlp", "--dtype", "fp16", "--policy", "fast"], "unknown policy 'fast'", "default"),
    (["regressions", "--category", "bug"], "invalid choice: 'bug'", "improvement"),
]


@pytest.mark.parametrize(("argv", "message", "choice"), UNKNOWN_FILTERS)
def test_unknown_filter_values_are_one_line_errors_listing_the_choices(
        cli, argv: list[str], message: str, choice: str) -> None:  # type: ignore[no-untyped-def]
    """A filter no row can match (once: an empty table and exit 0) is refused before any query."""
    with pytest.raises(SystemExit) as info:
        cli(*argv)
    assert info.value.code == 2


@pytest.mark.parametrize(("argv", "message", "choice"), UNKNOWN_FILTERS)
def test_unknown_filter_message(argv: list[str], message: str, choice: str,
                                capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(argv)
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured.err
    assert captured.err.startswith(f"ampci {argv[0]}: error: argument ") and message in captured.err
    assert choice in captured.err  # the choices are listed


def test_known_filter_values_still_filter(cli) -> None:  # type: ignore[no-untyped-def]
    rows = json.loads(cli("results", "--status", "convert_error", "--target", "cpu", "--policy", "default",
                          "--json")[1])
    assert {(r["model"], r["status"]) for r in rows} == {("conv", "convert_error")} and len(rows) == 2
    assert json.loads(cli("runs", "--status", "complete", "--trigger", "push", "--json")[1])
    assert json.loads(cli("results", "--target", "cuda-a100", "--json")[1]) == []  # a queue name is a target


NARROW_COMMANDS = [
    (["runs"], ("00000002c0ff", "complete", "2026-11-01")),
    (["run", "2"], ("tiny_mlp fp16/default/cpu", "done", "complete")),
    (["results"], ("tiny_mlp", "fail_accuracy", "convert_error", "0.9999", "2.005", "0.898")),
    (["regressions"], ("conversion", "improvement", "resolved", "regression")),
    (["history", "tiny_mlp", "--dtype", "fp16"], ("fail_accuracy", "0.9999", "default")),
    (["compare", "00000000", "00000001"], ("convert_error", "fail_accuracy", "+99.5%", "0.9999")),
]


@pytest.mark.parametrize(("argv", "whole"), NARROW_COMMANDS)
def test_tables_are_readable_at_80_columns(cli, monkeypatch: pytest.MonkeyPatch, argv: list[str],
                                           whole: tuple[str, ...]) -> None:  # type: ignore[no-untyped-def]
    """At 80 columns nothing is cut to ``mini…``/``0.9…``: low-value columns go, text folds, numbers
    stay whole, and no line runs past the width."""
    monkeypatch.setenv("COLUMNS", "80")
    code, out, err = cli(*argv)
    assert (code, err) == (0, "")
    assert "…" not in out
    assert max(len(line) for line in out.splitlines()) <= 80  # tables (or records) fit
    for text in whole:
        assert text in out, (argv, text)
    if argv[0] == "regressions":  # the detail is there in full, folded over lines (a table's last column)
        detail = " ".join(line.split("│")[-2].strip() for line in out.splitlines() if line.count("│") > 2) \
            if "│" in out else out
        assert "converted at baseline (pass), now convert_error" in " ".join(detail.split())


def test_run_shows_full_messages_and_wide_shows_every_column(cli, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("COLUMNS", "80")
    out = cli("run", "2")[1]
    assert "conv fp16/default/cpu convert_error: convert_error: boom" in out
    wide = cli("results", "--wide")[1]
    assert "low-prec" in wide and "casts" in wide and "revision" in wide
    assert "low-prec" not in cli("results")[1]
