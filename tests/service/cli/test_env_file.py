"""service/cli/env_file.py: the .env a deployment keeps is rewritten name by name, every other line as it was,
and the secrets are written all or nothing."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from service.cli.env_file import TargetError, check_targets, read_env, updated_env, write_secrets


def test_assignments_are_rewritten_in_place_and_missing_ones_appended(tmp_path: Path) -> None:
    old = "# keep me\nA=1\nexport B = two\n#C=commented\nA=again\n\nD=4"
    new = updated_env(old, {"A": "x", "B": "y", "C": "z"})
    assert new == "# keep me\nA=x\nB=y\n#C=commented\n\nD=4\nC=z\n"
    (tmp_path / ".env").write_text(new)
    assert read_env(tmp_path / ".env") == {"A": "x", "B": "y", "C": "z", "D": "4"}
    assert updated_env("", {"A": ""}) == "A=\n"
    (tmp_path / ".env").write_text("Q='https://x'\nR=\"y\"\nS='z\n")
    assert read_env(tmp_path / ".env") == {"Q": "https://x", "R": "y", "S": "'z"}
    for bad in ("a b", "$HOME", "x#y", "q'", 'q"', "line\nbreak"):
        with pytest.raises(TargetError):
            updated_env(old, {"A": bad})


def test_secrets_are_written_all_or_nothing(tmp_path: Path) -> None:
    env = tmp_path / ".env"
    env.write_text("A=1\n")
    env.chmod(0o644)
    targets = check_targets(env, tmp_path / "k.pem")
    assert write_secrets(targets, pem="KEY\n", env_values={"B": "2"}, key_uid=None)
    assert (tmp_path / "k.pem").read_text() == "KEY\n" and stat.S_IMODE((tmp_path / "k.pem").stat().st_mode) == 0o600
    assert env.read_text() == "A=1\nB=2\n" and stat.S_IMODE(env.stat().st_mode) == 0o644
    with pytest.raises(TargetError, match="exists"):  # another App's key is never overwritten
        check_targets(env, tmp_path / "k.pem")
    fresh = check_targets(tmp_path / "new.env", tmp_path / "k2.pem")
    with pytest.raises(TargetError):  # a value no .env line holds: the key is not written either
        write_secrets(fresh, pem="KEY\n", env_values={"B": "has space"}, key_uid=None)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".env", "k.pem"]
    write_secrets(fresh, pem="KEY\n", env_values={"B": "2"}, key_uid=None)
    assert stat.S_IMODE((tmp_path / "new.env").stat().st_mode) == 0o600  # a new .env holds secrets: 600
