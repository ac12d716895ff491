"""Every command that prints a listing fits the terminal and never breaks a word (issue 43): at 60, 80,
120 and 200 columns no line is wider, and every model name, cell (``dtype/policy/target``) and status is
printed whole wherever it appears (a word cut to fit a bounded message ends in ``…``; ``--json`` has it all).

The commands are enumerated from :data:`service.cli.main.COMMANDS`: each one either has an invocation here
(``sweep``: its printing function on stored runs, :func:`sweep_output` -- an embedded sweep is slow) or is
named in :data:`NO_LISTING` with the reason, so a new command is classified by whoever adds it."""

from __future__ import annotations

import argparse
import io
import re
from contextlib import redirect_stderr, redirect_stdout
from datetime import UTC, datetime

import pytest

from service.cli.fit import CUT_NOTE, wrap_words
from service.cli.main import COMMANDS, main
from service.cli.sweep_cmd import _emit, compared_cells
from service.db import pins
from service.db.store import Store
from service.orchestration.scheduler import StartedRun
from tests.service.factories import chain, make_result, migrated_store, run_with

LONG_MODEL = "mini_resnet_block_with_a_long_name"
WIDE = (LONG_MODEL, "bf16", "conservative", "cuda-a100")
MID = ("transformer_block", "fp16", "default", "cpu")
MESSAGE = ("NotImplementedError: the pass has no rule for op type ScatterND with reduction='max' at opset 18 "
           "(node /blocks.3/ScatterND_1) while converting the graph of the third residual block; ") * 3
#: Words that must never be printed broken.
TOKENS = (LONG_MODEL, "transformer_block", "bf16/conservative/cuda-a100", "fp16/default/cpu", "convert_error",
          "fail_accuracy", "conversion", "regression", "improvement", "complete")

#: Words of column headers that start a token (``conv s``: the conversion seconds of ``compare``).
HEADER_WORDS = {"conv"}

#: Commands without a listing of stored rows (they print one line or their own progress), with why.
NO_LISTING = {
    "convert": "one report line per conversion",
    "worker": "a long-running process", "beat": "a long-running process", "serve": "a long-running process",
    "db": "one line", "ack": "one line", "bisect": "progress lines (emit wraps them)",
    "check": "one job's report (workers)", "reconcile": "one summary (emit wraps it)",
    "github": "create-app prints a URL and next steps (lines, no table)",
    "completion": "prints the shell code argcomplete makes (tests/service/cli/test_completion.py)",
}


def listings(shas: list[str]) -> dict[str, list[list[str]]]:
    """The invocations of every listing command (command -> argvs)."""
    return {
        "runs": [["runs"], ["runs", "--wide"]],
        "run": [["run", "2"]],
        "results": [["results"], ["results", "--model", LONG_MODEL]],
        "regressions": [["regressions"], ["regressions", "--wide"]],
        "compare": [["compare", shas[0][:8], shas[1][:8]], ["compare", shas[1][:8], shas[2][:8]]],
        "history": [["history", LONG_MODEL, "--dtype", "bf16"], ["history", "transformer_block", "--dtype", "fp16"]],
        "deliveries": [["deliveries"]],
        "baseline": [["baseline", "show"]],
        "zoo": [["zoo", "list"]],
    }


@pytest.fixture(scope="module")
def store_url(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[str]]:
    url = f"sqlite:///{tmp_path_factory.mktemp('fits') / 'store.sqlite3'}"
    store = migrated_store(url)
    shas = chain(store, 3)
    run_with(store, shas[0], [make_result(MID), make_result(WIDE)])
    bad = make_result(WIDE, status="convert_error")
    bad.message = MESSAGE
    run_with(store, shas[1], [make_result(MID, status="fail_accuracy", max_abs=0.4), bad])
    run_with(store, shas[2], [make_result(MID, max_abs=0.5, latency_ms=4.0, seed=2),
                              make_result(WIDE, latency_ms=9.0, seed=3)])
    store.record_delivery("d-" + "7" * 36, "pull_request", "rejected", reason=MESSAGE)
    with store.transaction() as conn:
        pins.pin(conn, branch="main", sha=shas[0], now=datetime.now(UTC),
                 note="the last release before the " + LONG_MODEL + " rework, " * 4)
    store.dispose()
    return url, shas


def sweep_output(url: str) -> list[tuple[list[str], str]]:
    """What ``ampci sweep`` prints after each stored run (its own printing function, ``_emit``, on the run's
    results and open regressions against the run before): (a label, the text) per run."""
    store = Store.from_url(url)
    out = []
    try:
        for run in store.list_runs():
            results = store.results(run_id=run.id)
            regs = [r for r in store.regressions(run_id=run.id, category="regression") if r.state == "open"]
            comparison = compared_cells(store, run.id, len(results), run.baseline_sha, len(regs))
            started = StartedRun(run.id, run.revision_sha, run.baseline_sha, len(results), created=True)
            text = io.StringIO()
            with redirect_stdout(text):
                _emit(argparse.Namespace(json=False), {}, (run, results, regs, started, comparison))
            out.append((["sweep", f"(run {run.id})"], text.getvalue()))
    finally:
        store.dispose()
    return out


#: Commands whose printed output is made by calling their printing function (command -> url -> outputs).
RENDERED = {"sweep": sweep_output}


def test_every_command_is_classified(store_url: tuple[str, list[str]]) -> None:
    listed = set(listings(store_url[1])) | set(RENDERED)
    assert listed.isdisjoint(NO_LISTING) and listed | set(NO_LISTING) == set(COMMANDS)
    assert len(listed) == len(listings(store_url[1])) + len(RENDERED)


def test_the_sweep_output_shows_its_findings(store_url: tuple[str, list[str]], monkeypatch: pytest.MonkeyPatch) -> None:
    """The stored runs give the sweep's table something to fit: a long message and a regression table."""
    monkeypatch.setenv("COLUMNS", "80")
    texts = [text for _, text in sweep_output(store_url[0])]
    assert len(texts) == 3 and any("regression(s) against baseline" in t and "fail_accuracy" in t for t in texts)
    assert any("convert_error: NotImplementedError:" in " ".join(t.split()) for t in texts)  # below the table


def _no_fragment(token: str, out: str) -> None:
    """No word of ``out`` is the start of ``token`` broken off inside a word (``transformer_bl``,
    ``fp16/default/c``): a word cut to fit a bounded message ends in ``…`` and is allowed, and so is a
    piece that ends where the token has a ``/`` (the wide tables' separate dtype/policy/target columns)."""
    for word in re.split(r"[\s│┃]+", out):
        word = word.strip(",;:()'\"·")
        if word.endswith("…") or word in HEADER_WORDS or not 3 <= len(word) < len(token) \
                or not token.startswith(word):
            continue
        assert token[len(word)] == "/", (token, word)


@pytest.mark.parametrize("width", [60, 80, 120, 200])
def test_listings_fit_and_break_no_word(store_url: tuple[str, list[str]], width: int, tmp_path: object,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    url, shas = store_url
    monkeypatch.setenv("AMPCI_DATABASE_URL", url)
    monkeypatch.setenv("AMPCI_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("AMPCI_BROKER_URL", raising=False)
    monkeypatch.setenv("COLUMNS", str(width))
    printed = []
    for command, argvs in listings(shas).items():
        for argv in argvs:
            out, err = io.StringIO(), io.StringIO()
            with redirect_stdout(out), redirect_stderr(err):
                code = main(argv)
            assert code in (0, 1) and out.getvalue(), (argv, err.getvalue())
            printed.append((command, argv, out.getvalue()))
    printed.extend((command, argv, text) for command, render in RENDERED.items() for argv, text in render(url))
    for command, argv, text in printed:
        limit = max(width, 200) if "--wide" in argv else width  # --wide: at least 200 columns
        wider = [line for line in text.splitlines() if len(line) > limit]
        assert not wider, (argv, limit, wider)
        for token in TOKENS:
            _no_fragment(token, text)
        if command in ("run", "results", "compare", "regressions", "sweep") or LONG_MODEL in argv:
            assert LONG_MODEL in text, argv
        if command == "regressions":
            assert "bf16/conservative/cuda-a100" in text and "fp16/default/cpu" in text


def test_bounded_text_is_cut_at_words_and_marked() -> None:
    lines, cut = wrap_words(MESSAGE, 30, 4)
    assert cut and len(lines) == 4 and lines[-1].endswith(" …") and all(len(ln) <= 30 for ln in lines)
    words = set(MESSAGE.split())
    assert all(w in words for ln in lines for w in ln.removesuffix(" …").split())  # whole words only
    lines, cut = wrap_words("short words only", 30, 4)
    assert (lines, cut) == (["short words only"], False)
    lines, cut = wrap_words("x" * 40, 30, 4)
    assert cut and lines == ["x" * 29 + "…"]


def test_a_cut_message_points_to_json(store_url: tuple[str, list[str]], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AMPCI_DATABASE_URL", store_url[0])
    monkeypatch.setenv("COLUMNS", "80")
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["deliveries"]) == 0
    assert CUT_NOTE in out.getvalue() and "…" in out.getvalue()
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["deliveries", "--json"]) == 0
    assert MESSAGE in out.getvalue()
