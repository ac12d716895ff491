"""The sandbox's system calls and constants (standard library only; loaded by file path, first, by
:mod:`workers.sandbox._sandbox`, as ``_ampci_kernel``).

Thin ctypes wrappers that raise :class:`SandboxError` naming the step and the errno, the kernel's flag
values, the descriptor closing every sandbox process does, the line reader of the protocol pipes, and
:func:`load_sibling`, through which the sandbox's other modules are loaded (once each).
"""

import ctypes
import os
import signal
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 36, 38

#: A root supervisor runs its session's pass as ``SESSION_UID_BASE + its own pid`` (a uid no other live session
#: has): the kernel's per-uid state -- ``RLIMIT_NPROC``'s count, keyrings, inotify and signal quotas -- is then
#: per job, so one job's pass at its process limit never stops another's from forking.
SESSION_UID_BASE = 0x20000000

#: Where the pass sees its world inside the sandbox (a tmpfs over /tmp).
BASE = "/tmp/.ampci"
DEV_NODES = ("null", "zero", "full", "random", "urandom")

_libc = None


class SandboxError(Exception):
    """The sandbox could not be made (the message says which step and why)."""


def libc():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def check(ret, what):
    if ret != 0:
        err = ctypes.get_errno()
        raise SandboxError(f"{what}: {os.strerror(err)}")


def mount(src, target, fstype, flags, data=None):
    check(libc().mount(src.encode() if src else None, target.encode(), fstype.encode() if fstype else None,
                      ctypes.c_ulong(flags), data.encode() if data else None), f"mount {target}")


def unshare(flags, what):
    check(libc().unshare(ctypes.c_int(flags)), f"unshare({what})")


def prctl(option, arg):
    check(libc().prctl(ctypes.c_int(option), ctypes.c_ulong(arg), ctypes.c_ulong(0), ctypes.c_ulong(0),
                      ctypes.c_ulong(0)), f"prctl({option})")


def write_file(path, text):
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def mountpoints():
    points = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            parts = line.split()
            if len(parts) > 4:
                points.append(parts[4].replace("\\040", " "))
    return points


def close_fds(keep):
    """stdin/stdout/stderr to /dev/null; every descriptor but ``keep`` closed."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        if fd != null:
            os.dup2(null, fd)
    keep = sorted({0, 1, 2, *keep})
    low = 3
    for fd in keep:
        if fd >= low:
            os.closerange(low, fd)
            low = fd + 1
    os.closerange(low, 1 << 16)


def send_all(out, src, size):
    """Copy ``size`` bytes from descriptor ``src`` (at its offset) to ``out`` in the kernel (``sendfile``, 16 MiB
    a call); stops early if ``src`` ends first."""
    left = size
    while left > 0:
        sent = os.sendfile(out, src, None, min(left, 1 << 24))
        if sent <= 0:
            break
        left -= sent


def read_all(fd):
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


class Lines:
    """Lines read from a pipe descriptor (one ``os.read`` buffer kept between calls)."""

    def __init__(self, fd):
        self.fd, self.buf = fd, b""

    def next(self):
        """The next line without its newline, or None at end of file."""
        while b"\n" not in self.buf:
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line


def kill(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass




def load_sibling(name):
    """The module ``name`` beside this file (``_mounts``, ``_seccomp``, ...), loaded once by file path -- never
    through ``sys.path``, which a pass root may shadow -- and kept in ``sys.modules`` as ``_ampci_<name>``, so
    every module of the sandbox shares one of each (one :class:`SandboxError`)."""
    key = f"_ampci_{name.lstrip('_')}"
    mod = sys.modules.get(key)
    if mod is None:
        import importlib.util

        spec = importlib.util.spec_from_file_location(key, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                        f"{name}.py"))
        mod = importlib.util.module_from_spec(spec)
        sys.modules[key] = mod
        try:
            spec.loader.exec_module(mod)
        except BaseException:
            del sys.modules[key]
            raise
    return mod
