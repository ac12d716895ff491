"""The trusted bytecode cache of the pass (issue 42, "sandbox at zygote speed"): the worker compiles a revision's
``amp_pass`` once (never running it), content-keyed and checked-hash, and each session's pass imports it read-only.

Checked here: what is compiled and how it is keyed (symlinks never followed); that a session really imports it
(a trusted ``.pyc`` whose code differs from its source, hash-matched, is what runs); that stale bytecode (a hash of
other source) is never used; that the pass can neither write it nor reach the cache directory; that the real
pass converts to the same bytes with and without it.
"""

from __future__ import annotations

import importlib.util
import json
import marshal
import os
import shutil
import sys
from pathlib import Path

import pytest

from tests.workers.fakes import fake_pass
from workers.revision.convert import convert_in_subprocess
from workers.sandbox import bytecode, zygotes
from workers.sandbox import policy as sb
from workers.zoo.synthetic import synthetic_model_path

ROOT = Path(__file__).resolve().parents[3]
needs_full = pytest.mark.skipif(sb.full_sandbox_error(sb.SandboxPolicy()) is not None,
                                reason=f"no full sandbox here: {sb.full_sandbox_error(sb.SandboxPolicy())}")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="best-effort uses the cache only as root")

#: A pass that reports which ``VALUE`` its ``amp_pass`` holds, and what writing its bytecode did.
PROBE = '''
import shutil
import sys
import amp_pass
tried = {}
for where in ("/tmp/.ampci/pyc/0/amp_pass/__init__.%s.pyc" % sys.implementation.cache_tag,
              getattr(amp_pass, "__cached__", "") or ""):
    try:
        with open(where, "r+b") as fh:
            fh.write(b"x")
        tried[where] = "written"
    except OSError as exc:
        tried[where] = type(exc).__name__
    try:
        os.unlink(where)
        tried[where + " unlink"] = "unlinked"
    except OSError as exc:
        tried[where + " unlink"] = type(exc).__name__
shutil.copyfile(a.src, a.dst)
report(value=amp_pass.VALUE, tried=tried)
'''


def _probe_pass(root: Path, value: str = "source") -> Path:
    fake_pass(root, "burn")
    (root / "amp_pass" / "__init__.py").write_text(f'"""A probe."""\nVALUE = "{value}"\n')
    main = (root / "amp_pass" / "__main__.py").read_text()
    (root / "amp_pass" / "__main__.py").write_text(main.split("import shutil")[0] + PROBE)
    return root


def _convert(tmp: Path, root: Path, policy: sb.SandboxPolicy, warm: bool) -> tuple[str, dict]:
    tmp.mkdir(parents=True, exist_ok=True)
    src, _ = synthetic_model_path("conv_net", 0, tmp / "zoo")
    if warm:
        zygotes.start_forkserver()
    try:
        out = convert_in_subprocess(src, tmp / "o.onnx", tmp / "r.json", "fp16", "default", "cpu", root,
                                    timeout_s=120, memory_bytes=2 * 2**30, warm=warm, sandbox=policy)
    finally:
        zygotes.shutdown()
        zygotes.stop_forkserver()
    assert out.status == "ok", out
    return out.status, json.loads((tmp / "r.json").read_text())


def _forge(pyc: Path, code_source: str, hashed_source: bytes) -> None:
    """Overwrite ``pyc`` (as the trusted side could) with ``code_source``'s code under ``hashed_source``'s hash."""
    code = compile(code_source, "x", "exec")
    pyc.chmod(0o644)
    pyc.write_bytes(importlib.util.MAGIC_NUMBER + (0b11).to_bytes(4, "little")
                    + importlib.util.source_hash(hashed_source) + marshal.dumps(code))


def test_compiled_once_content_keyed_and_never_through_a_symlink(tmp_path: Path) -> None:
    root = _probe_pass(tmp_path / "pass")
    secret = tmp_path / "secret.py"
    secret.write_text('TOKEN = "ghs_secret_0123456789"\n')
    (root / "amp_pass" / "leak.py").symlink_to(secret)
    (root / "amp_pass" / "broken.py").write_text("def (:\n")
    cache = tmp_path / "cache" / "bytecode"
    first = bytecode.bytecode_for(root, cache)
    assert first is not None and Path(first).parent == cache
    files = sorted(p.relative_to(first).as_posix() for p in Path(first).rglob("*.pyc"))
    tag = sys.implementation.cache_tag
    assert files == [f"amp_pass/__init__.{tag}.pyc", f"amp_pass/__main__.{tag}.pyc"], files
    assert not any(b"ghs_secret" in p.read_bytes() for p in Path(first).rglob("*") if p.is_file())
    pyc = (Path(first) / f"amp_pass/__init__.{tag}.pyc").read_bytes()
    assert pyc[4:8] == (0b11).to_bytes(4, "little")  # hash-based, checked
    assert pyc[8:16] == importlib.util.source_hash((root / "amp_pass" / "__init__.py").read_bytes())
    assert bytecode.bytecode_for(root, cache) == first  # the same tree: the same directory
    copy = _probe_pass(tmp_path / "copy")  # the same content elsewhere: shared
    (copy / "amp_pass" / "broken.py").write_text("def (:\n")
    (copy / "amp_pass" / "leak.py").symlink_to(secret)
    assert bytecode.bytecode_for(copy, cache) == first
    (root / "amp_pass" / "__init__.py").write_text('VALUE = "changed"\n')
    assert bytecode.bytecode_for(root, cache) not in (None, first)
    assert [p.name for p in cache.iterdir() if p.name.startswith(".tmp-")] == []


def test_the_least_recently_used_trees_are_evicted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bytecode, "MAX_KEEP", 2)
    cache = tmp_path / "bytecode"
    got = []
    for i in range(3):
        root = _probe_pass(tmp_path / f"p{i}", value=f"v{i}")
        got.append(bytecode.bytecode_for(root, cache))
        os.utime(got[-1], (1000 + i, 1000 + i))
    assert sorted(p.name for p in cache.iterdir()) == sorted(Path(g).name for g in got[1:])


def _session(tmp_path: Path, mode: str, warm: bool) -> None:
    root = _probe_pass(tmp_path / "pass")
    cache = tmp_path / "cache"
    policy = sb.SandboxPolicy(mode=mode, hide=(str(cache),), bytecode_dir=str(cache / "bytecode"))
    directory = bytecode.bytecode_for(root, policy.bytecode_dir)
    assert directory is not None
    tag = sys.implementation.cache_tag
    pyc = Path(directory) / f"amp_pass/__init__.{tag}.pyc"
    source = (root / "amp_pass" / "__init__.py").read_bytes()
    # the bytecode is what runs: a trusted .pyc of other code under the source's own hash is imported
    _forge(pyc, 'VALUE = "bytecode"\n', source)
    before = pyc.read_bytes()
    _, got = _convert(tmp_path / "a", root, policy, warm)
    assert got["value"] == "bytecode", got
    assert all(v in ("OSError", "PermissionError", "FileNotFoundError", "IsADirectoryError")
               for v in got["tried"].values()), got["tried"]
    assert pyc.read_bytes() == before  # the pass could not write it
    # stale bytecode (compiled from other source) is never used: the importer compiles the source
    _forge(pyc, 'VALUE = "stale"\n', b'VALUE = "stale"\n')
    _, got = _convert(tmp_path / "b", root, policy, warm)
    assert got["value"] == "source", got
    # without a cache: from source, as before
    _, got = _convert(tmp_path / "c", root, sb.SandboxPolicy(mode=mode, hide=(str(cache),)), warm)
    assert got["value"] == "source", got


@needs_full
@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
def test_full_sandbox_imports_the_bytecode_read_only(tmp_path: Path, warm: bool) -> None:
    _session(tmp_path, "require", warm)


@needs_root
def test_best_effort_root_imports_a_read_only_copy(tmp_path: Path) -> None:
    _session(tmp_path, "best-effort", True)


def test_best_effort_non_root_gets_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    policy = sb.SandboxPolicy(mode="best-effort", bytecode_dir="/nonexistent/bytecode")
    assert sb.spec_for(policy, [ROOT], False)["bytecode"] == []
    assert sb.spec_for(policy, [ROOT], True)["bytecode"] != []


@needs_full
def test_the_real_pass_converts_to_the_same_bytes(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    got = {}
    for name, directory in (("with", str(cache / "bytecode")), ("without", "")):
        policy = sb.SandboxPolicy(mode="require", hide=(str(cache),), bytecode_dir=directory)
        _convert(tmp_path / name, ROOT, policy, True)
        report = json.loads((tmp_path / name / "r.json").read_text())
        report.pop("seconds", None)
        got[name] = ((tmp_path / name / "o.onnx").read_bytes(), report)
    assert got["with"] == got["without"]
    assert any(cache.joinpath("bytecode").iterdir())
    shutil.rmtree(cache)
