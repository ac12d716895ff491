"""The pass holds none of the worker's keyrings (issue 40): before the drop its process joins a fresh session
keyring, so a key in the worker's session keyring is not the pass's (``/proc/keys`` lists only the keys a process
may view: possessed ones, for a key readable by its possessor alone).  The filter then denies every keyring call
(``test_seccomp.py``)."""

from __future__ import annotations

import ctypes
import os
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from workers.revision.convert import convert_in_subprocess
from workers.sandbox import policy as sb
from workers.zoo.synthetic import synthetic_model_path

SECCOMP = sb.loader()._seccomp
needs_full = pytest.mark.skipif(sb.full_sandbox_error(sb.SandboxPolicy()) is not None,
                                reason=f"no full sandbox here: {sb.full_sandbox_error(sb.SandboxPolicy())}")
KEY_SPEC_SESSION_KEYRING, KEYCTL_REVOKE = -3, 3


@pytest.fixture
def worker_key() -> Iterator[str]:
    """A key (possessor: all; others: nothing) in this process's session keyring, which the zygotes inherit."""
    if SECCOMP.machine() not in SECCOMP.NUMBERS:
        pytest.skip("no system-call table for this architecture")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    name = f"ampci-worker-key-{uuid.uuid4().hex[:8]}"
    key = libc.syscall(ctypes.c_long(SECCOMP.number("add_key")), b"user", name.encode(), b"secret",
                       ctypes.c_long(6), ctypes.c_long(KEY_SPEC_SESSION_KEYRING))
    if key < 0:
        pytest.skip(f"no keyrings here: {os.strerror(ctypes.get_errno())}")
    assert name in Path("/proc/keys").read_text()  # this process possesses it
    yield name
    libc.syscall(ctypes.c_long(SECCOMP.number("keyctl")), ctypes.c_long(KEYCTL_REVOKE), ctypes.c_long(key))


@pytest.mark.skipif(os.geteuid() != 0, reason="a non-root worker's pass keeps its uid: it may view its own keys")
@pytest.mark.parametrize("mode", [pytest.param("require", marks=needs_full), "best-effort"])
def test_the_pass_does_not_possess_the_workers_session_keyring(tmp_path: Path, worker_key: str, mode: str) -> None:
    root = tmp_path / "pass"
    (root / "amp_pass").mkdir(parents=True)
    (root / "amp_pass" / "__init__.py").write_text('"""Looks for keys."""\n')
    (root / "amp_pass" / "__main__.py").write_text(textwrap.dedent(f'''
        import sys
        keys = open("/proc/keys").read()
        print("amp_pass: error: KEYS " + ("seen" if {worker_key!r} in keys else "none"), file=sys.stderr)
        sys.exit(2)
    '''))
    src, _ = synthetic_model_path("conv_net", 0, tmp_path / "models")
    out = convert_in_subprocess(src, tmp_path / "out.onnx", tmp_path / "report.json", "fp16", "default", "cpu",
                                root, timeout_s=60, memory_bytes=2 * 2**30, warm=False,
                                sandbox=sb.SandboxPolicy(mode=mode))
    assert out.status == "convert_error" and "KEYS none" in out.message, out
