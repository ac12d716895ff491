"""A passed sandbox canary is remembered under the cache directory (issue 42) and runs again whenever anything
its answer depends on changes: the interpreter's import roots, the pass's import set, the sandbox policy, the
sandbox's code, its age -- and a failure is never remembered."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from workers.revision import canary, canary_cache
from workers.sandbox import policy as sb

needs_full = pytest.mark.skipif(sb.full_sandbox_error(sb.SandboxPolicy()) is not None,
                                reason=f"no full sandbox here: {sb.full_sandbox_error(sb.SandboxPolicy())}")
POLICY = sb.SandboxPolicy(mode="best-effort")


@pytest.fixture()
def runs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[sb.SandboxPolicy, list[str]]]:
    """The canary conversions actually run (each returns ``ok`` unless its modules name ``broken``)."""
    ran: list[tuple[sb.SandboxPolicy, list[str]]] = []

    def fake(policy: sb.SandboxPolicy, modules: list[str] | None = None, timeout_s: float = 0) -> canary.CanaryResult:
        ran.append((policy, list(modules or [])))
        ok = "broken" not in (modules or [])
        result = canary.CanaryResult(ok, "" if ok else "the pass sandbox cannot import broken", time.time(), 0.5,
                                     policy.mode)
        canary.remember(result)
        return result

    monkeypatch.setattr(canary, "run_canary", fake)
    yield ran
    canary.forget()


def test_a_passed_canary_stands_until_its_key_changes(tmp_path: Path, runs: list,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    first = canary_cache.cached_canary(POLICY, ["numpy", "onnx"], tmp_path)
    again = canary_cache.cached_canary(POLICY, ["onnx", "numpy"], tmp_path)  # (the same set)
    assert len(runs) == 1 and first.ok and again == first and canary.last() == first
    stored = list((tmp_path / "canary").iterdir())
    assert len(stored) == 1 and stored[0].stat().st_mode & 0o777 == 0o600

    canary_cache.cached_canary(POLICY, ["numpy", "onnx", "onnx_ir"], tmp_path)  # the pass imports more
    assert len(runs) == 2
    canary_cache.cached_canary(sb.SandboxPolicy(mode="best-effort", max_procs=8), ["numpy", "onnx"], tmp_path)
    assert len(runs) == 3  # another sandbox policy

    root = tmp_path / "site"  # a package installed or removed: its import root's mtime moves
    root.mkdir()
    monkeypatch.setattr(sys, "path", [*sys.path, str(root)])
    canary_cache.cached_canary(POLICY, ["numpy", "onnx"], tmp_path)
    assert len(runs) == 4
    canary_cache.cached_canary(POLICY, ["numpy", "onnx"], tmp_path)
    assert len(runs) == 4
    (root / "new_package").mkdir()
    os.utime(root, ns=(1, 1))
    canary_cache.cached_canary(POLICY, ["numpy", "onnx"], tmp_path)
    assert len(runs) == 5


def test_the_sandboxs_own_code_is_in_the_key(tmp_path: Path, runs: list, monkeypatch: pytest.MonkeyPatch) -> None:
    canary_cache.cached_canary(POLICY, ["numpy"], tmp_path)
    code = tmp_path / "code"
    copies = []
    for path in canary_cache._CODE:
        copy = code / path.parent.name / path.name
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_bytes(path.read_bytes())
        copies.append(copy)
    assert {"_sandbox.py", "_seccomp.py", "_mounts.py", "_zygote.py", "convert.py"} <= {c.name for c in copies}
    monkeypatch.setattr(canary_cache, "_CODE", tuple(copies))
    canary_cache.cached_canary(POLICY, ["numpy"], tmp_path)
    assert len(runs) == 1  # the same code
    seccomp = code / "sandbox" / "_seccomp.py"
    seccomp.write_bytes(seccomp.read_bytes() + b"\n# changed\n")
    canary_cache.cached_canary(POLICY, ["numpy"], tmp_path)
    assert len(runs) == 2


def test_a_failure_is_never_remembered_and_an_old_pass_runs_again(tmp_path: Path, runs: list) -> None:
    assert not canary_cache.cached_canary(POLICY, ["broken"], tmp_path).ok
    assert not canary_cache.cached_canary(POLICY, ["broken"], tmp_path).ok
    assert len(runs) == 2
    canary_cache.cached_canary(POLICY, ["numpy"], tmp_path)
    canary_cache.cached_canary(POLICY, ["numpy"], tmp_path, max_age_s=3600)
    assert len(runs) == 3
    canary_cache.cached_canary(POLICY, ["numpy"], tmp_path, max_age_s=0)
    assert len(runs) == 4


def test_a_forged_or_foreign_entry_is_not_taken(tmp_path: Path, runs: list) -> None:
    canary_cache.cached_canary(POLICY, ["numpy"], tmp_path)
    (entry,) = (tmp_path / "canary").iterdir()
    data = json.loads(entry.read_text())
    data["key"]["modules"] = ["other"]  # a file whose name does not match what it holds
    entry.write_text(json.dumps(data))
    canary_cache.cached_canary(POLICY, ["numpy"], tmp_path)
    assert len(runs) == 2


@needs_full
def test_the_real_canary_is_remembered_and_the_second_check_converts_nothing(tmp_path: Path) -> None:
    from workers.sandbox import zygotes
    try:
        first = canary_cache.cached_canary(sb.SandboxPolicy(mode="require"), ["numpy"], tmp_path)
        assert first.ok and first.sandbox == "full", first
        before = time.perf_counter()
        second = canary_cache.cached_canary(sb.SandboxPolicy(mode="require"), ["numpy"], tmp_path)
        assert second == first and time.perf_counter() - before < first.seconds
    finally:
        canary.forget()
        zygotes.shutdown()


def test_the_pass_import_set_is_remembered_by_its_files_stat(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "pass" / "amp_pass"
    pkg.mkdir(parents=True)
    (pkg / "x.py").write_text("import json\n")
    parsed: list[Path | None] = []
    real = canary.pass_imports

    def counting(root: Path | None = None) -> list[str]:
        parsed.append(root)
        return real(root)

    monkeypatch.setattr(canary, "pass_imports", counting)
    cache = tmp_path / "cache"
    assert canary_cache.pass_imports_cached(cache, tmp_path / "pass") == ["json"]
    assert canary_cache.pass_imports_cached(cache, tmp_path / "pass") == ["json"]
    assert len(parsed) == 1  # the second from the cache: no ast
    (pkg / "x.py").write_text("import json\nimport math\n")  # an edit: another size and mtime
    assert canary_cache.pass_imports_cached(cache, tmp_path / "pass") == ["json", "math"]
    (pkg / "y.py").write_text("import re\n")  # a new module
    assert canary_cache.pass_imports_cached(cache, tmp_path / "pass") == ["json", "math", "re"]
    assert len(parsed) == 3
    assert canary_cache.pass_imports_cached(cache) == real()  # this checkout's, as the canary reads it


def test_a_commands_first_canary_is_keyed_as_its_next(tmp_path: Path, runs: list) -> None:
    """The data directory of a first run does not exist when the canary starts (the command makes it meanwhile):
    it is made first, so the canary's sandbox hides it as the jobs' will, and the next command's key is the same
    (else every fresh data directory paid the canary twice)."""
    from service.cli.sandbox_check import check_canary
    from service.settings import Settings

    settings = Settings(data_dir=tmp_path / "data", cache_dir=tmp_path / "cache", sandbox="best-effort")
    check_canary(settings, ["numpy"], cached=True)
    assert (tmp_path / "data").is_dir()
    check_canary(settings, ["numpy"], cached=True)
    assert len(runs) == 1
