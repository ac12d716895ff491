"""Settings parse AMPCI_* variables with one set of tested helpers and fail fast, naming the variable."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.errors import ConfigError
from service.settings import Settings, parse_bool, parse_duration, parse_size, redact_url


@pytest.mark.parametrize(("raw", "want"), [("1", True), ("TRUE", True), ("yes", True), ("off", False), ("0", False)])
def test_parse_bool(raw: str, want: bool) -> None:
    assert parse_bool("X", raw) is want


def test_parse_bool_rejects_garbage() -> None:
    with pytest.raises(ConfigError, match="X: expected a boolean"):
        parse_bool("X", "maybe")


@pytest.mark.parametrize(("raw", "want"), [("90", 90.0), ("250ms", 0.25), ("10m", 600.0), ("2h", 7200.0)])
def test_parse_duration(raw: str, want: float) -> None:
    assert parse_duration("X", raw) == pytest.approx(want)


@pytest.mark.parametrize("raw", ["", "ten", "-5s", "0"])
def test_parse_duration_rejects(raw: str) -> None:
    with pytest.raises(ConfigError):
        parse_duration("X", raw)


def test_parse_size() -> None:
    assert parse_size("X", "4MiB") == 4 * 1024**2
    assert parse_size("X", "2G") == 2 * 1024**3
    with pytest.raises(ConfigError):
        parse_size("X", "lots")


def test_from_env_types_and_errors(tmp_path: Path) -> None:
    s = Settings.from_env({"AMPCI_CONVERT_TIMEOUT": "2m", "AMPCI_MAX_ATTEMPTS": "5",
                           "AMPCI_CACHE_DIR": str(tmp_path), "AMPCI_INSECURE_DEV": "yes",
                           "AMPCI_CONVERT_MEMORY": "1G"})
    assert s.convert_timeout == 120.0 and s.max_attempts == 5 and s.cache_dir == tmp_path
    assert s.insecure_dev is True and s.convert_memory == 1024**3
    assert s.embedded and s.effective_database_url.startswith("sqlite:///")
    with pytest.raises(ConfigError, match="AMPCI_MAX_ATTEMPTS"):
        Settings.from_env({"AMPCI_MAX_ATTEMPTS": "x"})


def test_require_names_variable() -> None:
    with pytest.raises(ConfigError, match="AMPCI_WEBHOOK_SECRET"):
        Settings.from_env({}).require("webhook_secret")


def test_redact_url() -> None:
    assert redact_url("postgresql+psycopg://u:secret@h:5432/db") == "postgresql+psycopg://u:***@h:5432/db"


def test_approvers_are_logins_compared_case_insensitively() -> None:
    """``AMPCI_APPROVERS`` (who approves when ampci cannot ask GitHub) is a comma list of GitHub logins."""
    from service.settings import Settings

    got = Settings.from_env({"AMPCI_APPROVERS": " Alice, bob-2 ,,"})
    assert got.approvers == "Alice,bob-2" and got.approver_set() == frozenset({"alice", "bob-2"})
    assert Settings.from_env({}).approver_set() == frozenset()
    with pytest.raises(ConfigError, match="AMPCI_APPROVERS"):
        Settings.from_env({"AMPCI_APPROVERS": "alice,evil user"})
