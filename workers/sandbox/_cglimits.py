"""A cgroup per job, with limits, where the host offers one (standard library only; loaded by file path beside
``_sandbox.py``).

Each sandbox session's processes (the pass process and everything it forks) are put, before any code of the pass
runs, in a group of their own with

* ``pids.max`` = ``AMPCI_SANDBOX_MAX_PROCS``: tasks of this job alone, whatever their uid (``RLIMIT_NPROC``
  counts a uid, which is per job only where the session uid is);
* a memory limit (``memory.max``, cgroup v1 ``memory.limit_in_bytes``) = the conversion's memory limit + the
  scratch tmpfs size: tmpfs pages are charged to the group of the process that wrote them, so the limit covers
  what the pass keeps in its ``/tmp`` too.

Where: cgroup v2 when the controller is enabled for this process's group's children (its
``cgroup.subtree_control``; the session's v2 group is the one ``_accounting.SessionCgroup`` made for CPU accounting), else
a cgroup v1 hierarchy of that controller (a hybrid host: the group ``ampci-sandbox-<supervisor pid>`` beside this
process's own).  ampci never enables a controller itself (that would change the host's hierarchy, and a v2 group
with processes in it may not give its children one).  Where neither offers a controller, that limit is left out
and :func:`note` says so in one line (``/healthz``'s ``sandbox_cgroup``): the per-uid ``RLIMIT_NPROC``, the
conversion's ``RLIMIT_AS`` and the tmpfs size still hold.
"""

import errno
import os
import time

CONTROLLERS = ("pids", "memory")
FILES = {(True, "pids"): "pids.max", (True, "memory"): "memory.max",
         (False, "pids"): "pids.max", (False, "memory"): "memory.limit_in_bytes"}
PREFIX = "ampci-sandbox-"


def _read(path):
    with open(path) as fh:
        return fh.read()


def where(controller, mountinfo=None, cgroup=None):
    """``(directory of this process's group, is_v2)`` in a hierarchy where ``controller`` can limit this
    process's child groups, or None.  ``mountinfo``/``cgroup``: the text of ``/proc/self/mountinfo`` and
    ``/proc/self/cgroup`` (default: read them)."""
    mountinfo = _read("/proc/self/mountinfo") if mountinfo is None else mountinfo
    cgroup = _read("/proc/self/cgroup") if cgroup is None else cgroup
    own = {}
    for line in cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for name in parts[1].split(",") if parts[1] else [""]:
                own[name] = parts[2].strip()
    v2 = v1 = None
    for line in mountinfo.splitlines():
        parts = line.split()
        if "-" not in parts:
            continue
        rest = parts[parts.index("-") + 1:]
        if len(rest) < 3:
            continue
        fstype, opts = rest[0], rest[2].split(",")
        if fstype == "cgroup2" and v2 is None and "" in own:
            v2 = os.path.join(parts[4], own[""].lstrip("/"))
        elif fstype == "cgroup" and controller in opts and controller in own and v1 is None:
            v1 = os.path.join(parts[4], own[controller].lstrip("/"))
    if v2 is not None:
        try:
            if controller in _read(os.path.join(v2, "cgroup.subtree_control")).split():
                return v2, True
        except OSError:
            pass
    if v1 is not None and os.access(v1, os.W_OK):
        return v1, False
    return None


def available():
    """``{controller: "cgroup v2" | "cgroup v1" | None}`` for this process (None: no per-job limit of it)."""
    out = {}
    for c in CONTROLLERS:
        try:
            w = where(c)
        except OSError:
            w = None
        out[c] = None if w is None else ("cgroup v2" if w[1] else "cgroup v1")
    return out


def note(got=None):
    """One line saying which per-job cgroup limits this host does not offer (None: both are there)."""
    got = available() if got is None else got
    missing = [c for c in CONTROLLERS if got.get(c) is None]
    if not missing:
        return None
    return (f"no per-job cgroup limit of {' or '.join(missing)} here (the controller is not delegated to this "
            "process's cgroup): RLIMIT_NPROC per session uid, RLIMIT_AS and the tmpfs size still hold")


class Limits:
    """The limit groups of one session (see the module doc).  Opened before the sandbox's mounts (which make
    /sys read-only in the supervisor's namespace); ``v2``: the session's v2 group as ``(parent_fd, name)``
    (``_accounting.SessionCgroup``), or None.  Never raises: a limit it cannot set is left out."""

    def __init__(self, max_procs, v2=None):
        self.v1 = []       # (O_PATH descriptor of the parent directory, group name, cgroup.procs fd)
        self.limit = {}    # controller -> fd of its limit file
        self.memory = 0
        name = f"{PREFIX}{os.getpid()}"
        for c in CONTROLLERS:
            try:
                w = where(c)
                if w is None:
                    continue
                if w[1]:
                    if v2 is None:
                        continue
                    self.limit[c] = os.open(f"{v2[1]}/{FILES[True, c]}", os.O_WRONLY, dir_fd=v2[0])
                else:
                    sweep(w[0])
                    # the parent by a descriptor opened now, in the worker's mount namespace: the sandbox's
                    # mounts make /sys read-only in the supervisor's, where a path would give EROFS at removal
                    parent = os.open(w[0], os.O_PATH | os.O_DIRECTORY)
                    try:
                        os.mkdir(name, 0o755, dir_fd=parent)
                        procs = os.open(f"{name}/cgroup.procs", os.O_WRONLY, dir_fd=parent)
                    except OSError:
                        os.close(parent)
                        raise
                    self.v1.append((parent, name, procs))
                    self.limit[c] = os.open(f"{name}/{FILES[False, c]}", os.O_WRONLY, dir_fd=parent)
            except OSError:
                continue
        if "pids" in self.limit:
            self._set("pids", int(max_procs))

    def _set(self, controller, value):
        try:
            os.write(self.limit[controller], str(value).encode())
        except OSError:
            pass

    def add(self, pid):
        """Put ``pid`` (the pass process, before it runs anything) in the session's cgroup v1 groups (its v2
        group is ``_accounting.SessionCgroup``'s)."""
        for _, _, procs in self.v1:
            try:
                os.write(procs, str(pid).encode())
            except OSError:
                pass

    def memory_at_least(self, nbytes):
        """Raise the session's memory limit to ``nbytes`` (never lowers it: a job's conversions share it)."""
        if "memory" in self.limit and nbytes > self.memory:
            self.memory = int(nbytes)
            self._set("memory", self.memory)

    def remove(self):
        """Close the descriptors and remove the v1 groups (once their processes are gone; a few tries)."""
        for fd in self.limit.values():
            os.close(fd)
        self.limit = {}
        for parent, name, procs in self.v1:
            os.close(procs)
            for _ in range(50):  # EBUSY until the group's last process is gone
                try:
                    os.rmdir(name, dir_fd=parent)
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY:
                        break  # left to the next sweep (it removes empty groups of gone supervisors)
                    time.sleep(0.01)
            os.close(parent)
        self.v1 = []


def sweep(parent):
    """Remove the v1 session groups under ``parent`` whose supervisor is gone (empty ones only).  Never raises."""
    try:
        for name in os.listdir(parent):
            if name.startswith(PREFIX) and name[len(PREFIX):].isdigit():
                try:
                    os.kill(int(name[len(PREFIX):]), 0)
                except ProcessLookupError:
                    try:
                        os.rmdir(os.path.join(parent, name))
                    except OSError:
                        pass
                except OSError:
                    pass
    except OSError:
        pass


def sweep_all():
    """:func:`sweep` every cgroup v1 hierarchy this process's sessions make groups in.  Never raises."""
    for c in CONTROLLERS:
        try:
            w = where(c)
        except OSError:
            continue
        if w is not None and not w[1]:
            sweep(w[0])

