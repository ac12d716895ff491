"""The console script's exit (issue 25): once a command returned, its heap is frozen out of the garbage
collector, so the interpreter's exit skips a last full collection over the imported layers (0.3-0.6 s after
importing SQLAlchemy); the exit status and output are the command's."""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

import pytest

from service.cli.main import entry


def test_entry_freezes_the_heap_and_keeps_the_exit_status(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("AMPCI_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("AMPCI_DATABASE_URL", raising=False)
    monkeypatch.delenv("AMPCI_BROKER_URL", raising=False)
    monkeypatch.setattr(sys, "argv", ["ampci", "runs", "--json"])
    gc.unfreeze()
    try:
        with pytest.raises(SystemExit) as exited:
            entry()
        frozen = gc.get_freeze_count()
    finally:
        gc.unfreeze()  # (this test process goes on)
    assert exited.value.code == 0
    assert json.loads(capsys.readouterr().out) == []
    assert frozen > 10_000  # the command's modules and objects, not a handful
