"""The pass's system-call filter (issue 40): a hostile pass revision tries the kernel's shared state and a host
socket by path, and gets ``EPERM`` for each; an honest conversion still converts.

Driven through :func:`workers.revision.convert.convert_in_subprocess` (warm and cold), in the full sandbox and in
best-effort mode (the filter is installed in both).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.workers.fakes import fake_pass
from workers.revision.convert import convert_in_subprocess
from workers.sandbox import policy as sb
from workers.sandbox import zygotes
from workers.zoo.synthetic import synthetic_model_path

needs_full = pytest.mark.skipif(sb.full_sandbox_error(sb.SandboxPolicy()) is not None,
                                reason=f"no full sandbox here: {sb.full_sandbox_error(sb.SandboxPolicy())}")
x86_64 = pytest.mark.skipif(os.uname().machine != "x86_64", reason="the filter's numbers are x86_64's")

#: What the hostile pass tries: each a system call by number through ctypes (x86_64), or a unix path socket.
_MAIN = '''
import ctypes, errno, json, os, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return "ok" if r >= 0 else errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
buf = ctypes.create_string_buffer(512)
found = {{
    "add_key": call(248, ctypes.addressof(ctypes.create_string_buffer(b"user")),
                    ctypes.addressof(ctypes.create_string_buffer(b"ampci-channel")),
                    ctypes.addressof(ctypes.create_string_buffer(b"x")), 1, -4),  # the user keyring
    "keyctl": call(250, 0, -4),  # KEYCTL_GET_KEYRING_ID of the user keyring
    "io_uring_setup": call(425, 8, ctypes.addressof(buf)),
    "bpf": call(321, 0, ctypes.addressof(buf), 72),
    "unshare": call(272, 0x10000000),  # CLONE_NEWUSER
    "clone_newuser": call(56, 0x10000000 | 17, 0, 0, 0, 0),
    "clone3": call(435, ctypes.addressof(buf), 88),
    "mount": call(165, 0, 0, 0, 0, 0),
    "x32_getpid": call(0x40000000 | 39),
    "socketpair_dgram": call(53, 1, 2, 0, ctypes.addressof(buf)),
}}
try:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect({path!r})
    s.sendall(b"reached")
    found["unix_connect"] = "ok"
except OSError as exc:
    found["unix_connect"] = errno.errorcode.get(exc.errno, str(exc.errno))
a, b = socket.socketpair()  # multiprocessing's duplex pipe: still allowed
a.sendall(b"x")
found["socketpair_stream"] = "ok" if b.recv(1) == b"x" else "broken"
pid = os.fork()  # plain fork (clone without namespace flags): allowed
if pid == 0:
    os._exit(7)
found["fork"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
print("amp_pass: error: SECCOMP " + json.dumps(found), file=sys.stderr)
sys.exit(2)
'''


@pytest.fixture
def host_socket() -> Iterator[tuple[str, list[bytes]]]:
    """A unix socket a host process listens on, in a world-writable directory outside /tmp, /run and /var/run
    (the sandbox hides those): every connection's bytes are recorded."""
    top = Path(tempfile.mkdtemp(prefix="ampci-sock-", dir="/var/tmp"))
    top.chmod(0o777)
    path = str(top / "host.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    os.chmod(path, 0o777)
    srv.listen(8)
    got: list[bytes] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                got.append(conn.recv(64) or b"connected")

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield path, got
    srv.shutdown(socket.SHUT_RDWR)
    srv.close()
    t.join(5)
    shutil.rmtree(top, ignore_errors=True)


def _run(tmp_path: Path, path: str, mode: str, warm: bool) -> tuple[dict[str, object], object]:
    root = tmp_path / "pass"
    (root / "amp_pass").mkdir(parents=True)
    (root / "amp_pass" / "__init__.py").write_text('"""A hostile pass."""\n')
    (root / "amp_pass" / "__main__.py").write_text(textwrap.dedent(_MAIN.format(path=path)))
    src, _ = synthetic_model_path("conv_net", 0, tmp_path / "cache")
    if warm:
        zygotes.start_forkserver()
    try:
        out = convert_in_subprocess(src, tmp_path / "out.onnx", tmp_path / "report.json", "fp16", "default", "cpu",
                                    root, timeout_s=120, memory_bytes=2 * 2**30, warm=warm,
                                    sandbox=sb.SandboxPolicy(mode=mode))
    finally:
        zygotes.shutdown()
        zygotes.stop_forkserver()
    assert out.status == "convert_error" and "SECCOMP " in out.message, out
    return json.loads(out.message.split("SECCOMP ", 1)[1].splitlines()[0]), out


def _assert_filtered(found: dict[str, object], got: list[bytes]) -> None:
    for name in ("add_key", "keyctl", "io_uring_setup", "bpf", "unshare", "clone_newuser", "mount", "x32_getpid",
                 "socketpair_dgram", "unix_connect"):
        assert found[name] == "EPERM", (name, found)
    assert found["clone3"] == "ENOSYS", found
    assert got == []  # the host's socket never saw the pass
    # what honest code needs still works
    assert found["socketpair_stream"] == "ok" and found["fork"] == 7, found


@x86_64
@needs_full
@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
def test_the_pass_gets_eperm_for_keyrings_io_uring_bpf_namespaces_and_host_sockets(
        tmp_path: Path, host_socket: tuple[str, list[bytes]], warm: bool) -> None:
    path, got = host_socket
    found, out = _run(tmp_path, path, "require", warm)
    assert out.sandbox == "full"  # type: ignore[attr-defined]
    _assert_filtered(found, got)


@x86_64
def test_best_effort_installs_the_filter_too(tmp_path: Path, host_socket: tuple[str, list[bytes]]) -> None:
    path, got = host_socket
    found, out = _run(tmp_path, path, "best-effort", False)
    assert out.sandbox == "best-effort"  # type: ignore[attr-defined]
    _assert_filtered(found, got)


@x86_64
@needs_full
def test_an_honest_pass_converts_under_the_filter(tmp_path: Path) -> None:
    src, _ = synthetic_model_path("conv_net", 0, tmp_path / "cache")
    root = fake_pass(tmp_path / "pass", "perturb")
    out = convert_in_subprocess(src, tmp_path / "out.onnx", tmp_path / "report.json", "fp16", "default", "cpu",
                                root, timeout_s=120, memory_bytes=2 * 2**30, warm=False,
                                sandbox=sb.SandboxPolicy(mode="require"))
    assert out.status == "ok", out.message


SECCOMP = sb.loader()._seccomp
HEADERS = {"x86_64": ["/usr/include/x86_64-linux-gnu/asm/unistd_64.h", "/usr/include/asm/unistd_64.h"],
           "aarch64": ["/usr/include/asm-generic/unistd.h"]}


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_each_architecture_has_a_number_for_every_denied_name_and_no_other(arch: str) -> None:
    table = SECCOMP.NUMBERS[arch]
    want = (set(SECCOMP.DENIED_NAMES) - set(SECCOMP.ABSENT[arch])) | set(SECCOMP.SPECIAL_NAMES)
    assert set(table) == want, set(table) ^ want
    assert len(set(table.values())) == len(table)  # no two names share a number


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_the_numbers_are_the_kernel_headers(arch: str) -> None:
    """Against this machine's kernel headers (x86_64's unistd_64.h; the generic table aarch64 uses)."""
    import re

    path = next((p for p in HEADERS[arch] if Path(p).is_file()), None)
    if path is None:
        pytest.skip(f"no kernel header for {arch} here ({', '.join(HEADERS[arch])})")
    nums = {m[1]: int(m[2]) for m in re.finditer(r"#define __NR_(\w+)\s+(\d+)\b", Path(path).read_text())}
    for name, nr in SECCOMP.NUMBERS[arch].items():
        assert nums.get(name) == nr, (arch, name, nr, nums.get(name))
    for name in SECCOMP.ABSENT[arch]:
        assert name not in nums, (arch, name)


def _run_bpf(prog: list[tuple[int, int, int, int]], data: dict[str, int]) -> int:
    """A classic-BPF interpreter for the few opcodes the filter uses, over a struct seccomp_data."""
    offsets = {0: data["nr"], 4: data["arch"], 16: data.get("arg0", 0), 24: data.get("arg1", 0)}
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = prog[pc]
        if code == 0x20:
            acc = offsets[k]
        elif code == 0x54:
            acc &= k
        elif code == 0x06:
            return k
        else:
            taken = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[code]
            pc += jt if taken else jf
        pc += 1


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_the_program_denies_by_each_architectures_numbers(arch: str) -> None:
    prog, table, audit = SECCOMP.program(arch), SECCOMP.NUMBERS[arch], SECCOMP.AUDIT_ARCH[arch]
    eperm, allow = SECCOMP.RET_ERRNO | SECCOMP.EPERM, SECCOMP.RET_ALLOW
    for name in SECCOMP.DENIED_NAMES:
        if name in table:
            assert _run_bpf(prog, {"nr": table[name], "arch": audit}) == eperm, name
    assert _run_bpf(prog, {"nr": table["clone3"], "arch": audit}) == SECCOMP.RET_ERRNO | SECCOMP.ENOSYS
    assert _run_bpf(prog, {"nr": table["clone"], "arch": audit, "arg0": 0x10000000 | 17}) == eperm
    assert _run_bpf(prog, {"nr": table["clone"], "arch": audit, "arg0": 17}) == allow
    assert _run_bpf(prog, {"nr": table["socketpair"], "arch": audit, "arg1": 2}) == eperm  # SOCK_DGRAM
    assert _run_bpf(prog, {"nr": table["socketpair"], "arch": audit, "arg1": 1 | 0x80000}) == allow
    other = SECCOMP.AUDIT_ARCH["aarch64" if arch == "x86_64" else "x86_64"]
    assert _run_bpf(prog, {"nr": table["clone"], "arch": other}) == SECCOMP.RET_KILL_PROCESS
    read = {"x86_64": 0, "aarch64": 63}[arch]
    assert _run_bpf(prog, {"nr": read, "arch": audit}) == allow
    assert _run_bpf(prog, {"nr": 0x40000000 | 39, "arch": audit}) == (eperm if arch == "x86_64" else allow)


#: System calls the sandbox's trusted side makes (supervisor and pass process before the filter): the compose
#: stack's container profile must allow each.  Keyrings stay refused there on purpose (the session keyring join
#: is skipped where refused: the container then has no keyring at all).
SANDBOX_NEEDS = ("unshare", "mount", "umount2", "setgroups", "setresuid", "setresgid", "prctl", "seccomp",
                 "pidfd_open", "sendfile", "fchown", "fchownat", "kill", "setsid", "clone", "wait4", "openat",
                 "mkdirat", "unlinkat", "getdents64", "prlimit64", "pipe2", "dup3", "poll", "readlinkat", "statfs")


def test_the_compose_profile_allows_what_the_sandbox_needs() -> None:
    profile = json.loads((Path(__file__).resolve().parents[3] / "deploy" / "seccomp-worker.json").read_text())
    allowed = {n for rule in profile["syscalls"] if rule["action"] == "SCMP_ACT_ALLOW" for n in rule["names"]}
    assert [n for n in SANDBOX_NEEDS if n not in allowed] == []
    assert profile["defaultAction"] == "SCMP_ACT_ERRNO" and not {"add_key", "keyctl", "request_key"} & allowed
