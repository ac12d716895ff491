"""How docker-compose.yml confines the services (issue 31), read from the files: no Docker needed.

The workers, which run the pass under test, use this project's seccomp profile (``deploy/seccomp-worker.json``):
an allowlist that lets a worker without capabilities make the pass sandbox (user, mount, network and PID
namespaces; ``mount``) and keeps refusing what Docker's default profile refuses.  The credentials reach the api
alone.  ``tests/deploy/test_compose_stack.py`` checks the same in running containers.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "deploy" / "seccomp-worker.json"
WORKERS = ("worker-cpu", "worker-cuda")
CREDENTIALS = {"AMPCI_WEBHOOK_SECRET", "AMPCI_GITHUB_TOKEN", "AMPCI_API_TOKEN"}

CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC = 0x20000, 0x02000000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWTIME = 0x10000000, 0x20000000, 0x40000000, 0x80
#: What the sandbox unshares (workers/sandbox/_sandbox.py), and the namespaces it never needs.
SANDBOX_NS = (CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWNET, CLONE_NEWPID)
OTHER_NS = (CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWTIME)

#: Refused by Docker's default profile to a container without extra capabilities, and refused here too.
DOCKER_REFUSES = {
    "acct", "add_key", "bpf", "clock_adjtime", "clock_settime", "create_module", "delete_module", "finit_module",
    "get_kernel_syms", "get_mempolicy", "init_module", "ioperm", "iopl", "kcmp", "kexec_file_load", "kexec_load",
    "keyctl", "lookup_dcookie", "mbind", "move_pages", "nfsservctl", "open_by_handle_at", "perf_event_open",
    "pivot_root", "query_module", "quotactl", "quotactl_fd", "reboot", "request_key", "set_mempolicy", "setns",
    "settimeofday", "swapoff", "swapon", "sysfs", "_sysctl", "uselib", "userfaultfd", "ustat", "syslog",
    "fsopen", "fsconfig", "fsmount", "fspick", "open_tree", "move_mount", "mount_setattr", "name_to_handle_at",
    "fanotify_init", "sethostname", "setdomainname", "vhangup", "migrate_pages", "set_mempolicy_home_node",
}
#: Refused here although Docker's default allows them: no worker needs them.
ALSO_REFUSED = {"ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "process_madvise",
                "process_mrelease", "chroot", "io_uring_setup", "io_uring_enter", "io_uring_register",
                "modify_ldt", "adjtimex", "fanotify_mark", "memfd_secret"}
#: x86-64 system calls that no kernel implements any more (refused like any unknown one).
UNIMPLEMENTED = {"afs_syscall", "tuxcall", "security", "vserver", "getpmsg", "putpmsg", "epoll_ctl_old",
                 "epoll_wait_old"}


@pytest.fixture(scope="module")
def profile() -> dict[str, Any]:
    return dict(json.loads(PROFILE.read_text()))


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return dict(yaml.safe_load((ROOT / "docker-compose.yml").read_text()))


def _rules(profile: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [r for r in profile["syscalls"] if name in r["names"]]


def _allowed(profile: dict[str, Any], name: str, arg0: int | None = None) -> bool:
    """Whether ``name`` (with first argument ``arg0``) passes the profile: an ALLOW rule whose conditions hold."""
    for rule in _rules(profile, name):
        if rule["action"] != "SCMP_ACT_ALLOW":
            continue
        ok = True
        for cond in rule.get("args") or []:
            assert cond["index"] == 0 and arg0 is not None, rule
            if cond["op"] == "SCMP_CMP_MASKED_EQ":
                ok = ok and (arg0 & cond["value"]) == cond["valueTwo"]
            elif cond["op"] == "SCMP_CMP_EQ":
                ok = ok and arg0 == cond["value"]
            else:
                pytest.fail(f"unexpected comparison in {rule}")
        if ok:
            return True
    return False


def test_profile_is_an_allowlist_for_64_bit_calls_only(profile: dict[str, Any]) -> None:
    assert profile["defaultAction"] == "SCMP_ACT_ERRNO" and profile["defaultErrnoRet"] == 1  # EPERM
    assert [a["architecture"] for a in profile["archMap"]] == ["SCMP_ARCH_X86_64", "SCMP_ARCH_AARCH64"]
    assert all(a["subArchitectures"] == [] for a in profile["archMap"])  # no i386/x32/arm32 entry points
    for rule in profile["syscalls"]:
        assert rule["action"] in {"SCMP_ACT_ALLOW", "SCMP_ACT_ERRNO"} and rule["comment"], rule
        assert not rule.get("includes") and not rule.get("excludes"), rule  # the same on every host
    names = [n for r in profile["syscalls"] for n in r["names"] if n != "personality"]
    assert len(names) == len(set(names)), "a system call in two rules"


def test_dangerous_calls_stay_refused(profile: dict[str, Any]) -> None:
    refused = DOCKER_REFUSES | ALSO_REFUSED | UNIMPLEMENTED
    assert not [n for n in refused if _rules(profile, n)], "listed (hence maybe allowed) although refused"


def test_the_sandbox_may_unshare_its_namespaces_and_no_other(profile: dict[str, Any]) -> None:
    assert _allowed(profile, "unshare", CLONE_NEWUSER)
    assert _allowed(profile, "unshare", CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID)
    assert _allowed(profile, "unshare", 0x400 | 0x200)  # CLONE_FILES | CLONE_FS: no namespace at all
    for flag in OTHER_NS:
        assert not _allowed(profile, "unshare", flag), hex(flag)
        assert not _allowed(profile, "unshare", flag | CLONE_NEWNS), hex(flag)
    assert _allowed(profile, "mount") and _allowed(profile, "umount2")


def test_clone_makes_processes_and_threads_but_no_namespace(profile: dict[str, Any]) -> None:
    assert _allowed(profile, "clone", 0x01200011)  # fork(): SIGCHLD | CLONE_CHILD_SETTID | CLONE_CHILD_CLEARTID
    assert _allowed(profile, "clone", 0x003D0F00)  # pthread_create's flags
    for flag in SANDBOX_NS + OTHER_NS[:3]:  # CLONE_NEWTIME (0x80) is part of clone's exit signal byte
        assert not _allowed(profile, "clone", 0x01200011 | flag), hex(flag)
    (clone3,) = _rules(profile, "clone3")  # its flags are out of seccomp's reach: ENOSYS, so libc uses clone
    assert clone3["action"] == "SCMP_ACT_ERRNO" and clone3["errnoRet"] == 38


def test_personality_only_linux_or_a_query(profile: dict[str, Any]) -> None:
    for value in (0x0, 0x8, 0xFFFFFFFF):
        assert _allowed(profile, "personality", value), hex(value)
    for value in (0x0040000, 0x0400000, 0x0100000, 0x0200000):  # no ASLR, READ_IMPLIES_EXEC, page zero, compat
        assert not _allowed(profile, "personality", value), hex(value)


def test_every_x86_64_call_of_this_machine_is_decided() -> None:
    """A system call of the kernel headers is either in the profile or known to be refused: none by oversight."""
    header = Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h")
    if not header.exists():
        pytest.skip(f"no {header} here")
    table = set(re.findall(r"^#define __NR_(\w+) \d+", header.read_text(), re.M))
    listed = {n for r in json.loads(PROFILE.read_text())["syscalls"] for n in r["names"]}
    undecided = sorted(table - listed - DOCKER_REFUSES - ALSO_REFUSED - UNIMPLEMENTED)
    assert not undecided, f"neither allowed nor known to be refused: {undecided}"
    assert {"read", "openat", "mmap", "futex", "execve", "socket", "connect", "rt_sigreturn"} <= listed


def test_the_workers_and_only_they_run_under_the_profile(compose: dict[str, Any]) -> None:
    for name, svc in compose["services"].items():
        opts = svc.get("security_opt", [])
        if name in WORKERS:
            assert opts == ["seccomp=deploy/seccomp-worker.json", "no-new-privileges:true"], (name, opts)
            assert svc["cap_drop"] == ["ALL"] and "cap_add" not in svc and "user" not in svc, name
            assert not svc.get("privileged"), name
        else:
            assert not opts and "cap_add" not in svc, f"{name} needs no namespace permission"
    assert "\nUSER ampci\n" in (ROOT / "Dockerfile").read_text()  # the workers are not root


def test_the_credentials_reach_the_api_alone(compose: dict[str, Any]) -> None:
    for name, svc in compose["services"].items():
        env = svc.get("environment") or {}
        held = CREDENTIALS & set(env)
        assert held == (CREDENTIALS if name == "api" else set()), (name, sorted(held))
    assert not CREDENTIALS & set(compose["x-ampci-env"])


def test_a_missing_webhook_secret_is_one_line_with_compose_v1(compose: dict[str, Any]) -> None:
    """docker-compose v1 names the whole option value it failed to interpolate: the api's check is a scalar
    that comes before its environment mapping (v1 interpolates a service's keys in file order)."""
    api = compose["services"]["api"]
    keys = list(api)
    check = api["x-webhook-secret-required"]
    assert keys.index("x-webhook-secret-required") < keys.index("environment")
    assert check.startswith("${AMPCI_WEBHOOK_SECRET:?is not set") and "\n" not in check
    assert api["environment"]["AMPCI_WEBHOOK_SECRET"] == check  # v2 may check either first: same line
    services = list(compose["services"])
    assert not [s for s in services[:services.index("api")]
                if "AMPCI_WEBHOOK_SECRET" in json.dumps(compose["services"][s])]


def test_env_files_are_neither_committed_nor_built_in() -> None:
    assert ".env" in (ROOT / ".gitignore").read_text().split()
    assert ".env" in (ROOT / ".dockerignore").read_text().split()
