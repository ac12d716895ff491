"""The environment fingerprint says where latency compares: the machine and runtime, never the pass revision."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.db.extract import env_fingerprint
from workers.measure.environment import FINGERPRINT_KEYS, fingerprint, fingerprint_of


def test_fingerprint_ignores_the_pass_revision_and_worktree(tmp_path: Path) -> None:
    a = fingerprint("CPUExecutionProvider", tmp_path / "wt-a", "a" * 40)
    b = fingerprint("CPUExecutionProvider", tmp_path / "wt-b", "b" * 40)
    assert a["pass_revision"] != b["pass_revision"] and a["pass_root"] != b["pass_root"]
    assert a["fingerprint"] == b["fingerprint"]
    assert env_fingerprint(a) == env_fingerprint(b) == a["fingerprint"]  # what the store indexes
    assert "pass_revision" not in FINGERPRINT_KEYS and "pass_root" not in FINGERPRINT_KEYS


@pytest.mark.parametrize("key", FINGERPRINT_KEYS)
def test_every_machine_or_runtime_key_changes_the_fingerprint(key: str, tmp_path: Path) -> None:
    env = fingerprint("CPUExecutionProvider", tmp_path, "a" * 40)
    changed = dict(env, **{key: env[key] + "-other"})
    assert fingerprint_of(changed) != env["fingerprint"]


def test_thread_settings_are_part_of_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    plain = fingerprint("CPUExecutionProvider", tmp_path, "a" * 40)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    pinned = fingerprint("CPUExecutionProvider", tmp_path, "a" * 40)
    assert "OMP_NUM_THREADS=1" in pinned["threads"] and pinned["fingerprint"] != plain["fingerprint"]


def test_the_timed_sessions_thread_count_is_in_the_fingerprint(tmp_path: Path) -> None:
    one = fingerprint("CPUExecutionProvider", tmp_path, "a" * 40, 1)
    default = fingerprint("CPUExecutionProvider", tmp_path, "a" * 40, 0)
    assert one["threads"].startswith("intra=1") and default["threads"].startswith("intra=default")
    assert one["fingerprint"] != default["fingerprint"]
