"""The system-call filter of the pass (standard library only; loaded by file path beside ``_sandbox.py``).

:func:`install` puts a seccomp BPF filter on the calling process (inherited by every process it forks, and
never removable).  :mod:`workers.sandbox._sandbox` calls it in the pass process after the privilege drop and
``PR_SET_NO_NEW_PRIVS``, before any code of the pass runs, in ``full`` and ``best-effort`` mode alike.  The
filter:

* kills the process outright on any audit architecture but the one its table is for (x86_64 or aarch64:
  :data:`NUMBERS`), and on x86_64 denies every x32 system call (``__X32_SYSCALL_BIT``) with ``EPERM``: no other
  syscall table slips past the numbers below;
* denies with ``EPERM`` the kernel's shared state and escape hatches: keyrings (``add_key``, ``keyctl``,
  ``request_key``: the keyring of a uid is shared by every job that runs as it), ``io_uring_*``, ``bpf``,
  ``userfaultfd``, ``perf_event_open``, ``ptrace``, ``process_vm_readv/writev``, namespaces (``unshare``,
  ``setns``, ``clone`` with any ``CLONE_NEW*`` flag), every mount call (old and new API), ``chroot``, file
  handles (``open_by_handle_at``, ``name_to_handle_at``), modules, ``kexec``, and a few host-wide knobs
  (``acct``, ``swapon``, ``reboot``, ``sethostname``, ``syslog``, ``iopl``, ``fanotify_init``, ...);
* denies ``socket``, ``connect``, ``bind`` and ``listen`` outright (``EPERM``): a unix path socket reaches a
  host process whatever the network namespace and the read-only mounts say.  ``socketpair`` stays, for
  connection-oriented types only (``SOCK_STREAM``, ``SOCK_SEQPACKET``: multiprocessing's duplex pipes); a
  datagram pair could be re-aimed at a path with ``sendto``;
* answers ``clone3`` with ``ENOSYS`` (its flags are in memory a filter cannot read): glibc then falls back to
  ``clone``, whose flags the filter checks.

Hand-written rather than libseccomp (``pyseccomp``/``python3-seccomp``): the sandbox code is standard-library
only and loaded by file path before any third-party import (a pass root may shadow ``sys.path``), the program is
about sixty instructions, and the worker images then need no extra native package; the rule list above is the
whole of it, and ``tests/workers/sandbox/test_seccomp.py`` tries each rule from a hostile pass.
"""

import ctypes
import os

PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
#: The audit architecture each table is for (``AUDIT_ARCH_X86_64``, ``AUDIT_ARCH_AARCH64``).
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
X32_SYSCALL_BIT = 0x40000000
RET_KILL_PROCESS, RET_ERRNO, RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
EPERM, ENOSYS = 1, 38

#: The system calls denied with EPERM (whatever their arguments), by name, on every architecture that has them.
DENIED_NAMES = (
    "add_key", "keyctl", "request_key",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    "bpf", "userfaultfd", "perf_event_open", "ptrace", "process_vm_readv", "process_vm_writev",
    "unshare", "setns",
    "mount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount",
    "fspick", "mount_setattr",
    "open_by_handle_at", "name_to_handle_at",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
    "acct", "swapon", "swapoff", "reboot", "sethostname", "setdomainname", "iopl", "ioperm", "quotactl",
    "syslog", "fanotify_init", "lookup_dcookie", "uselib", "vhangup",
    "socket", "connect", "bind", "listen",
)
#: The calls the filter looks at the arguments of (or answers ENOSYS), by name.
SPECIAL_NAMES = ("clone", "clone3", "socketpair")
#: Names of :data:`DENIED_NAMES` an architecture has no such call for (nothing to deny there).
ABSENT = {"x86_64": (), "aarch64": ("iopl", "ioperm", "uselib")}

#: System call numbers by architecture: x86_64's (arch/x86/entry/syscalls/syscall_64.tbl) and aarch64's (the
#: kernel's generic table, include/uapi/asm-generic/unistd.h: no open, fork or other legacy calls).
#: ``tests/workers/sandbox/test_seccomp.py`` checks both against :data:`DENIED_NAMES` and, where this machine has
#: them, against its kernel headers.
NUMBERS = {
    "x86_64": {
        "add_key": 248, "keyctl": 250, "request_key": 249,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
        "bpf": 321, "userfaultfd": 323, "perf_event_open": 298, "ptrace": 101,
        "process_vm_readv": 310, "process_vm_writev": 311,
        "unshare": 272, "setns": 308,
        "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "open_tree": 428, "move_mount": 429,
        "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
        "open_by_handle_at": 304, "name_to_handle_at": 303,
        "kexec_load": 246, "kexec_file_load": 320, "init_module": 175, "finit_module": 313, "delete_module": 176,
        "acct": 163, "swapon": 167, "swapoff": 168, "reboot": 169, "sethostname": 170, "setdomainname": 171,
        "iopl": 172, "ioperm": 173, "quotactl": 179, "syslog": 103, "fanotify_init": 300, "lookup_dcookie": 212,
        "uselib": 134, "vhangup": 153,
        "socket": 41, "connect": 42, "bind": 49, "listen": 50,
        "clone": 56, "clone3": 435, "socketpair": 53,
    },
    "aarch64": {
        "add_key": 217, "keyctl": 219, "request_key": 218,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
        "bpf": 280, "userfaultfd": 282, "perf_event_open": 241, "ptrace": 117,
        "process_vm_readv": 270, "process_vm_writev": 271,
        "unshare": 97, "setns": 268,
        "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51, "open_tree": 428, "move_mount": 429,
        "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
        "open_by_handle_at": 265, "name_to_handle_at": 264,
        "kexec_load": 104, "kexec_file_load": 294, "init_module": 105, "finit_module": 273, "delete_module": 106,
        "acct": 89, "swapon": 224, "swapoff": 225, "reboot": 142, "sethostname": 161, "setdomainname": 162,
        "quotactl": 60, "syslog": 116, "fanotify_init": 262, "lookup_dcookie": 18, "vhangup": 58,
        "socket": 198, "connect": 203, "bind": 200, "listen": 201,
        "clone": 220, "clone3": 435, "socketpair": 199,
    },
}
#: CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET (CLONE_NEWTIME is clone3/unshare only).
CLONE_NEW_MASK = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
SOCK_TYPE_MASK, SOCK_STREAM, SOCK_SEQPACKET = 0xF, 1, 5


def machine():
    """This machine's architecture as :data:`NUMBERS` names it (``arm64`` is ``aarch64``)."""
    m = os.uname().machine
    return {"arm64": "aarch64", "amd64": "x86_64"}.get(m, m)


def number(name, arch=None):
    """The number of the system call ``name`` on ``arch`` (default: this machine's); KeyError if unknown."""
    return NUMBERS[arch or machine()][name]


# classic BPF opcodes
_LD_ABS, _JEQ, _JGE, _JSET, _RET, _AND = 0x20, 0x15, 0x35, 0x45, 0x06, 0x54
# offsets in struct seccomp_data (little-endian: an argument's low 32 bits first)
_NR, _ARCH = 0, 4


def _arg_lo(i):
    return 16 + 8 * i


class SeccompError(OSError):
    """The filter could not be installed (the message says why)."""


def program(arch="x86_64"):
    """The filter for ``arch`` (a key of :data:`NUMBERS`) as a list of (code, jt, jf, k) instructions (jumps
    resolved)."""
    table = NUMBERS[arch]
    ops = []  # (code, jt label or offset, jf label or offset, k) ; labels resolved below
    labels = {}

    def op(code, k=0, jt=0, jf=0):
        ops.append([code, jt, jf, k])

    def label(name):
        labels[name] = len(ops)

    op(_LD_ABS, _ARCH)
    op(_JEQ, AUDIT_ARCH[arch], jt=1)
    op(_RET, RET_KILL_PROCESS)
    op(_LD_ABS, _NR)
    if arch == "x86_64":  # the x32 table shares this audit arch: deny all of it
        op(_JGE, X32_SYSCALL_BIT, jt="eperm")
    op(_JEQ, table["clone3"], jt="enosys")
    for nr in sorted({table[n] for n in DENIED_NAMES if n in table}):
        op(_JEQ, nr, jt="eperm")
    op(_JEQ, table["clone"], jt="clone")
    op(_JEQ, table["socketpair"], jt="socketpair")
    op(_RET, RET_ALLOW)
    label("clone")
    op(_LD_ABS, _arg_lo(0))
    op(_JSET, CLONE_NEW_MASK, jt="eperm")
    op(_RET, RET_ALLOW)
    label("socketpair")
    op(_LD_ABS, _arg_lo(1))
    op(_AND, SOCK_TYPE_MASK)
    op(_JEQ, SOCK_STREAM, jt="allow")
    op(_JEQ, SOCK_SEQPACKET, jt="allow")
    label("eperm")
    op(_RET, RET_ERRNO | EPERM)
    label("enosys")
    op(_RET, RET_ERRNO | ENOSYS)
    label("allow")
    op(_RET, RET_ALLOW)
    out = []
    for i, (code, jt, jf, k) in enumerate(ops):
        jt, jf = (labels[j] - i - 1 if isinstance(j, str) else j for j in (jt, jf))
        if not (0 <= jt < 256 and 0 <= jf < 256):
            raise SeccompError(f"seccomp filter: jump out of range at {i}")
        out.append((code, jt, jf, k))
    return out


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def install():
    """Install the filter on this process (``PR_SET_NO_NEW_PRIVS`` must be set, or the caller be privileged).
    Raises :class:`SeccompError` on an architecture :data:`NUMBERS` has no table for (the sandbox refuses to
    run the pass unfiltered) or when the kernel refuses."""
    arch = machine()
    if arch not in NUMBERS:
        raise SeccompError(f"the pass's system-call filter has no table for {arch} (only {', '.join(NUMBERS)}): "
                           "the sandbox refuses to run the pass unfiltered")
    prog = program(arch)
    filters = (_SockFilter * len(prog))(*[_SockFilter(*ins) for ins in prog])
    fprog = _SockFprog(len(prog), filters)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(ctypes.c_int(PR_SET_SECCOMP), ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.byref(fprog),
                  ctypes.c_ulong(0), ctypes.c_ulong(0)) != 0:
        err = ctypes.get_errno()
        raise SeccompError(err, f"prctl(PR_SET_SECCOMP): {os.strerror(err)}")
