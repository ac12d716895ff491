"""The sandbox's trusted clock and CPU account (standard library only; loaded by file path).

The pass's end lines are untrusted (:class:`EndLines` keeps only well-formed ``E``/``S`` lines);
:func:`await_end` stops the wall clock only when the end line has arrived *and* every pre-forked conversion
process has exited (pidfds); CPU seconds come from a cgroup v2 group of the session (:class:`SessionCgroup`,
microseconds) or, without one, from the host's ``/proc`` for the sandbox's process tree (:func:`tree_cpu`).
"""

import errno
import os
import sys
import time

_kernel = sys.modules["_ampci_kernel"]  # loaded first, by _sandbox.py (workers/sandbox/_kernel.py: load_sibling)
_unpriv = _kernel.load_sibling("_unprivileged")
_cgl = _kernel.load_sibling("_cglimits")


#: The longest protocol line the supervisor reads from the pass process (longer: garbage, dropped).
MAX_LINE = 64


class EndLines:
    """The pass process's ``E code`` / ``S signal`` lines on a pipe, read without blocking once readable.
    Untrusted: anything else, or a line over :data:`MAX_LINE` bytes, is dropped; the buffer never grows past it."""

    def __init__(self, fd):
        self.fd, self.buf, self.eof = fd, b"", False
        os.set_blocking(fd, False)

    def read(self):
        """The valid end lines readable now, as ("E" | "S", int); sets ``eof`` at end of file."""
        got = []
        while not self.eof:
            try:
                chunk = os.read(self.fd, 1 << 12)
            except BlockingIOError:
                break
            if not chunk:
                self.eof = True
                break
            self.buf += chunk
            *lines, self.buf = self.buf.split(b"\n")
            if len(self.buf) > MAX_LINE:
                self.buf = b""
            for line in lines:
                words = line.split()
                if (len(line) <= MAX_LINE and len(words) == 2 and words[0] in (b"E", b"S")
                        and words[1].isdigit() and len(words[1]) <= 3):
                    got.append((words[0].decode(), int(words[1])))
        return got

    def drain(self):
        """Drop whatever is readable now."""
        self.read()


def children_of(proc, pid):
    """Host pids of ``pid``'s children (of every thread; zombies included), read through the host's /proc
    (``proc``).  Empty when ``pid`` is gone."""
    out = []
    try:
        tasks = os.open(f"{pid}/task", os.O_RDONLY | os.O_DIRECTORY, dir_fd=proc)
    except OSError:
        return out
    try:
        tids = os.listdir(tasks)
    finally:
        os.close(tasks)
    for tid in tids:
        try:
            out.extend(int(c) for c in read_small(proc, f"{pid}/task/{tid}/children").split())
        except (OSError, ValueError):
            continue
    return out


def read_small(proc, path):
    fd = os.open(path, os.O_RDONLY, dir_fd=proc)
    try:
        return os.read(fd, 1 << 16)
    finally:
        os.close(fd)


#: Processes of a sandbox whose CPU time one snapshot reads at most (the sandbox uid's RLIMIT_NPROC is less).
MAX_TREE = 4096


def tree_cpu(proc, root):
    """CPU seconds (user + system, with those of reaped children) of every descendant of ``root``, from the
    kernel's accounting in the host's /proc: the pass process, its threads, every process of the sandbox
    (zombies included).  Descendants are read before their parents, so a process reaped during the read is
    counted at worst twice (in itself and in its parent), never lost."""
    order, stack = [], children_of(proc, root)
    while stack and len(order) < MAX_TREE:
        pid = stack.pop()
        order.append(pid)
        stack.extend(children_of(proc, pid))
    ticks = 0
    for pid in reversed(order):
        try:
            fields = read_small(proc, f"{pid}/stat").rsplit(b")", 1)[1].split()
            ticks += sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
        except (OSError, IndexError, ValueError):
            continue
    return ticks / os.sysconf("SC_CLK_TCK")


def session_cpu(cgroup, proc):
    """CPU seconds the session's processes spent so far: its cgroup's account (microseconds) where it has one,
    else :func:`tree_cpu` (clock ticks)."""
    return cgroup.cpu_s() if cgroup is not None else tree_cpu(proc, os.getpid())


def pidfds(pids):
    """Descriptors that become readable when each of ``pids`` exits (those already gone are left out)."""
    fds = []
    for pid in pids:
        try:
            fds.append(os.pidfd_open(pid))
        except OSError:
            continue
    return fds


def await_child(proc, pid1, pid1_fd):
    """``pid1``'s children once it has one (the conversion it pre-forks before it says it is ready and before
    each end line; a line alone, which the pass's code may forge, is not taken as a sign of it); empty when
    ``pid1`` exited first (``pid1_fd``: its pidfd)."""
    import select

    while True:
        children = children_of(proc, pid1)
        if children or select.select([pid1_fd], [], [], 0.001)[0]:
            return children


def await_end(said, watched):
    """Wait until the pass process's end line arrived *and* every process in ``watched`` (pidfds of the
    conversion it had pre-forked) has exited; returns (the line or None at end of file, the time.perf_counter()
    then).  A line alone, forged by the pass's code, cannot end the wait before the conversion process ends.
    Closes ``watched``."""
    import select

    poller = select.poll()
    poller.register(said.fd, select.POLLIN)
    for fd in watched:
        poller.register(fd, select.POLLIN)
    pending, end = set(watched), None
    try:
        while (end is None or pending) and not said.eof:
            for fd, _ in poller.poll():
                if fd == said.fd:
                    lines = said.read()
                    end = end or (lines[0] if lines else None)
                    if said.eof:
                        poller.unregister(fd)
                elif fd in pending:
                    pending.discard(fd)
                    poller.unregister(fd)
        return (end if not pending else None), time.perf_counter()
    finally:
        for fd in watched:
            os.close(fd)


#: The cgroup v2 group of a session is named for its supervisor's pid, under the supervisor's own group (the
#: names of the v1 limit groups: one sweep removes both kinds).
CGROUP_PREFIX = _cgl.PREFIX


def own_cgroup_dir():
    """The path of this process's cgroup v2 group (None: no cgroup v2 here)."""
    mount = None
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            parts = line.split()
            if "-" in parts and parts[parts.index("-") + 1:][:1] == ["cgroup2"]:
                mount = parts[4]
                break
    if mount is None:
        return None
    with open("/proc/self/cgroup") as fh:
        rel = next((ln.split("::", 1)[1].strip() for ln in fh if ln.startswith("0::")), None)
    return None if rel is None else os.path.join(mount, rel.lstrip("/"))


class SessionCgroup:
    """A cgroup v2 group of one session (where this process may make one: root, a writable cgroup2): every
    process of the sandbox is put in it from its start, so its ``cpu.stat`` is the kernel's microsecond account
    of all of them, those auto-reaped included.  Its descriptors are opened before the sandbox's mounts (which
    make /sys read-only in the supervisor's namespace)."""

    def __init__(self):
        base = own_cgroup_dir()
        if base is None:
            raise OSError("no cgroup v2")
        sweep_session_cgroups(base)
        self.parent = os.open(base, os.O_PATH | os.O_DIRECTORY)
        self.name = f"{CGROUP_PREFIX}{os.getpid()}"
        try:
            os.mkdir(self.name, 0o755, dir_fd=self.parent)
            self.procs = os.open(f"{self.name}/cgroup.procs", os.O_WRONLY, dir_fd=self.parent)
            self.stat = os.open(f"{self.name}/cpu.stat", os.O_RDONLY, dir_fd=self.parent)
        except OSError:
            self.remove()
            raise

    def add(self, pid):
        os.write(self.procs, str(pid).encode())

    def cpu_s(self):
        """user + system seconds of every process that was in the group (microseconds)."""
        for line in os.pread(self.stat, 4096, 0).split(b"\n"):
            if line.startswith(b"usage_usec "):
                return int(line.split()[1]) / 1e6
        raise OSError("no usage_usec in cpu.stat")

    def remove(self):
        """Remove the group (once its processes are gone; a few tries) and close its descriptors."""
        for name in ("procs", "stat"):
            fd = self.__dict__.pop(name, None)
            if fd is not None:
                os.close(fd)
        for _ in range(50):  # EBUSY until the group's last process is gone
            try:
                os.rmdir(self.name, dir_fd=self.parent)
                break
            except FileNotFoundError:
                break
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    break  # left to sweep_session_cgroups
                time.sleep(0.01)
        os.close(self.parent)


def sweep_session_cgroups(base=None):
    """Remove the session cgroups (beside this process's own) whose supervisor is gone: a supervisor killed on
    a timeout, or idle when its zygote was stopped, cannot remove its own.  Empty groups only (the kernel
    refuses others).  Never raises."""
    try:
        base = base or own_cgroup_dir()
    except OSError:
        base = None
    if base:
        _cgl.sweep(base)
    _cgl.sweep_all()  # the limit groups of cgroup v1 hierarchies (workers/sandbox/_cglimits.py)
    _unpriv.sweep_orphans(_kernel.SESSION_UID_BASE)  # best-effort processes of sessions killed on a timeout
