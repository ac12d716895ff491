"""AMPCI_THRESHOLDS_FILE reaches the store's regression detection; a bad file fails fast."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from service.db.store import Store, thresholds_from_settings
from service.errors import ConfigError
from service.settings import Settings


def test_thresholds_file_overrides_defaults(tmp_path: Path) -> None:
    f = tmp_path / "thr.json"
    f.write_text(json.dumps({"latency_ratio": 1.5, "flaky_allowlist": ["m/*"]}))
    settings = Settings.from_env({"AMPCI_THRESHOLDS_FILE": str(f), "AMPCI_DATA_DIR": str(tmp_path)})
    store = Store.from_settings(settings)
    try:
        assert store.thresholds is not None
        assert store.thresholds.latency_ratio == 1.5
        assert store.thresholds.allowlisted(("m", "fp16", "default", "cpu"))
    finally:
        store.dispose()


def test_no_thresholds_file_means_builtin() -> None:
    assert thresholds_from_settings(Settings.from_env({})) is None


def test_bad_thresholds_file_names_the_problem(tmp_path: Path) -> None:
    f = tmp_path / "thr.json"
    f.write_text(json.dumps({"no_such_knob": 1}))
    with pytest.raises(ConfigError, match="no_such_knob"):
        thresholds_from_settings(Settings.from_env({"AMPCI_THRESHOLDS_FILE": str(f)}))
    with pytest.raises(ConfigError, match="cannot read thresholds file"):
        thresholds_from_settings(Settings.from_env({"AMPCI_THRESHOLDS_FILE": str(tmp_path / "missing.json")}))
