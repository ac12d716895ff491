"""Shell completion (issue 43): ``ampci completion bash|zsh`` prints argcomplete's shell code, and a TAB
(argcomplete's protocol: ``_ARGCOMPLETE``, ``COMP_LINE``, ``COMP_POINT``, the answer in
``_ARGCOMPLETE_STDOUT_FILENAME``) completes commands, options, and model names from the zoo and the store,
in a fresh interpreter that imports none of the model stack."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from service.cli.completion import MODEL_ARGS
from service.cli.completion_cmd import SHELLS
from service.cli.main import build_parser, main
from tests.service.cli.test_cli_imports import FORBIDDEN
from tests.service.factories import chain, make_result, migrated_store, run_with

ROOT = Path(__file__).resolve().parents[3]
STORED = ("stored_only_model", "fp16", "default", "cpu")


def _tab(line: str, tmp_path: Path, db_url: str = "") -> tuple[list[str], set[str]]:
    """The candidates ``ampci`` answers for a TAB at the end of ``line``, and the forbidden modules the
    answering interpreter imported."""
    answer = tmp_path / "answer"
    env = {**os.environ, "_ARGCOMPLETE": "1", "COMP_LINE": line, "COMP_POINT": str(len(line)),
           "COMP_TYPE": "9", "_ARGCOMPLETE_STDOUT_FILENAME": str(answer), "AMPCI_DATA_DIR": str(tmp_path),
           "AMPCI_DATABASE_URL": db_url}
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", "from service.cli.main import entry; entry()"],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    imported = {ln.rsplit("|", 1)[1].strip() for ln in proc.stderr.splitlines() if ln.startswith("import time:")}
    heavy = {m for m in imported if m.split(".")[0] in FORBIDDEN}
    return answer.read_text().split("\v"), heavy


@pytest.mark.parametrize(("line", "want"), [
    ("ampci reg", "regressions"), ("ampci history conv", "conv_net"), ("ampci results --mo", "--model"),
    ("ampci results --model silero", "silero_vad"), ("ampci zoo export ppocr_v4", "ppocr_v4_rec"),
    ("ampci completion z", "zsh"),
])
def test_a_tab_completes_commands_options_and_zoo_models(line: str, want: str, tmp_path: Path) -> None:
    got, heavy = _tab(line, tmp_path)
    assert [c.strip() for c in got] == [want], got
    assert not heavy, heavy  # a TAB imports no onnx, numpy or onnxruntime


def test_stored_model_names_complete_too(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    store = migrated_store(url)
    run_with(store, chain(store, 1)[0], [make_result(STORED)])
    store.dispose()
    got, heavy = _tab("ampci history stored_o", tmp_path, url)
    assert [c.strip() for c in got] == ["stored_only_model"] and not heavy
    got, _ = _tab("ampci history stored_o", tmp_path)  # no database named: the zoo's names only
    assert got == [""]


def test_every_model_argument_has_the_completer() -> None:
    """Each of MODEL_ARGS names an argument the parser has (a renamed one would silently lose completion)."""
    import argparse

    found = set()

    def walk(parser: argparse.ArgumentParser, words: tuple[str, ...]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, (*words, name))
            elif (words, action.dest) in MODEL_ARGS:
                found.add((words, action.dest))

    walk(build_parser(), ())
    assert found == MODEL_ARGS


@pytest.mark.parametrize("shell", SHELLS)
def test_completion_prints_the_shell_code(shell: str) -> None:
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["completion", shell]) == 0
    code = out.getvalue()
    assert "_ARGCOMPLETE" in code and "ampci" in code
    if shell == "bash":
        assert "complete " in code and "-F _python_argcomplete ampci" in code
    else:
        assert "#compdef ampci" in code and "compdef _python_argcomplete ampci" in code
