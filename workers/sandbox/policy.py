"""What the pass under test may see and do: the sandbox policy of a worker (trusted side).

:mod:`workers.sandbox._sandbox` (standard library only, loaded by file path) makes the sandbox in the conversion's
own processes; this module decides its settings and builds the plain-data spec those processes get:

* **environment**: an allowlist (:data:`ENV_ALLOWED`), never a copy -- no ``AMPCI_*`` setting, credential or
  URL reaches the pass; ``HOME``/``TMPDIR`` are its own scratch directory;
* **mode** (``AMPCI_SANDBOX``): ``require`` (the default of ``ampci serve``/``worker``: a machine that cannot make
  the namespaces refuses to start, :class:`SandboxUnavailable`), ``best-effort`` (no namespaces: environment,
  descriptors, the system-call filter, limits, and -- for a root worker -- the pass as an unprivileged uid of its
  own; said on every run page and in ``/healthz``), ``auto`` (the default of embedded commands only: the full
  sandbox where the machine allows it, else best-effort with one warning line; ``serve``/``worker`` take it as
  ``require``);
* **hidden**: the data and cache directories, ``/run`` and ``/var/run`` (service sockets) are empty for the pass;
* **bytecode**: the revision's ``amp_pass`` compiled once by the worker (never run) into a content-keyed
  directory under ``bytecode_dir`` that the pass sees read-only (:mod:`workers.sandbox.bytecode`);
* **limits**: processes (``RLIMIT_NPROC`` of the sandbox uid), bytes per written file (``RLIMIT_FSIZE`` and the
  copy-out cap), scratch tmpfs size, plus the conversion's existing memory and time limits.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from workers.sandbox.bytecode import bytecode_for, usable

log = logging.getLogger(__name__)

MODES = ("require", "best-effort", "auto")
#: Variables of the worker's environment the pass may see (values copied when set); everything else is dropped.
ENV_ALLOWED = ("PATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_NUMERIC", "TZ", "OMP_NUM_THREADS",
               "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE",
               "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH")
#: Thread counts the pass runs with unless the worker's environment says otherwise.
THREAD_DEFAULTS = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
#: The uid/gid a root worker runs the pass as (``nobody``): it owns nothing the worker keeps.
SANDBOX_UID = 65534
_SCRIPT = Path(__file__).with_name("_sandbox.py")


class SandboxUnavailable(Exception):
    """``AMPCI_SANDBOX=require`` on a machine that cannot make the sandbox's namespaces."""


@dataclass(frozen=True)
class SandboxPolicy:
    """The sandbox settings of one worker.  ``hide``: directories the pass must not see (data, cache)."""

    mode: str = "auto"
    hide: tuple[str, ...] = ()
    max_procs: int = 64
    max_file_bytes: int = 4 * 1024**3
    scratch_bytes: int = 8 * 1024**3
    uid: int = SANDBOX_UID
    gid: int = SANDBOX_UID
    #: Where the trusted bytecode of pass revisions is kept (:mod:`workers.sandbox.bytecode`; hidden from the
    #: pass, e.g. under the cache directory); "" for none (every session compiles the pass from source).
    bytecode_dir: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def loader() -> ModuleType:
    """:mod:`workers.sandbox._sandbox` loaded from its file (not through ``sys.path``, which a pass root may shadow)."""
    mod = sys.modules.get("_ampci_sandbox")
    if mod is None:
        spec = importlib.util.spec_from_file_location("_ampci_sandbox", _SCRIPT)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        sys.modules["_ampci_sandbox"] = mod
    return mod


def pass_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The pass's environment: the allow-listed variables of ``environ`` (default: this process's) and the
    thread defaults; nothing else.  ``PYTHONPATH`` is not passed: the sandbox puts the pass root on
    ``sys.path`` itself, after it is made."""
    environ = dict(os.environ) if environ is None else environ
    env = {k: environ[k] for k in ENV_ALLOWED if k in environ}
    for k, v in THREAD_DEFAULTS.items():
        env.setdefault(k, v)
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def interpreter_trees() -> list[str]:
    """Directories the interpreter reads from (stdlib, site-packages, the executable's): kept readable.
    Fixed for the life of the process: worked out once (``sysconfig.get_paths`` expands its schemes on every
    call, ~2 ms per conversion's spec), a fresh list each call."""
    global _TREES
    if _TREES is None:
        trees = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))}
        paths = sysconfig.get_paths()
        for key in ("stdlib", "platstdlib", "purelib", "platlib"):
            path = paths.get(key)
            if path:
                trees.add(path)
        _TREES = tuple(sorted(os.path.realpath(t) for t in trees if t))
    return list(_TREES)


_TREES: tuple[str, ...] | None = None


def spec_for(policy: SandboxPolicy, lib: list[Path], full: bool,
             preimport: tuple[str, ...] = ("amp_pass", "amp_pass.cli")) -> dict[str, Any]:
    """The plain-data spec :func:`workers.sandbox._sandbox.supervise` reads (JSON-able: paths and numbers only)."""
    hide = sorted({str(Path(p).resolve()) for p in policy.hide if p} | {"/run", "/var/run"})
    bytecode: list[str | None] = []
    if policy.bytecode_dir and usable(full):  # the revision's amp_pass compiled by this (trusted) process
        bytecode = [bytecode_for(Path(p), policy.bytecode_dir) for p in lib]
    return {"mode": "full" if full else "best-effort", "uid": policy.uid, "gid": policy.gid,
            "hide": [h for h in hide if os.path.isdir(h)], "lib": [str(Path(p).resolve()) for p in lib],
            "interpreter": interpreter_trees(), "max_procs": policy.max_procs,
            "max_file_bytes": policy.max_file_bytes, "scratch_bytes": policy.scratch_bytes,
            "env": pass_env(), "preimport": list(preimport), "fresh_modules": ["amp_pass", "workers"],
            "bytecode": bytecode}


_PROBED: dict[tuple[str, ...], str | None] = {}


def full_sandbox_error(policy: SandboxPolicy) -> str | None:
    """Why this machine cannot make the full sandbox (None: it can).  Probed once per process and policy."""
    key = (str(os.geteuid()), *policy.hide)
    if key not in _PROBED:
        if not sys.platform.startswith("linux"):
            _PROBED[key] = "not Linux: no namespaces"
        else:
            _PROBED[key] = loader().probe(spec_for(policy, [], True))
    return _PROBED[key]


def resolve_mode(policy: SandboxPolicy) -> str:
    """``full`` or ``best-effort`` for this machine under ``policy``; raises :class:`SandboxUnavailable` for
    ``require`` where the namespaces cannot be made (one line saying what to enable)."""
    if policy.mode == "best-effort":
        return "best-effort"
    why = full_sandbox_error(policy)
    if why is None:
        return "full"
    if policy.mode == "require":
        raise SandboxUnavailable(
            f"AMPCI_SANDBOX=require but the pass sandbox cannot be made here ({why}); run the worker as root or "
            "enable unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1; in Docker the "
            "project's deploy/seccomp-worker.json), or set AMPCI_SANDBOX=best-effort to run without it")
    global _WARNED
    if not _WARNED:
        _WARNED = True
        log.warning("pass sandbox: best-effort only on this machine (%s): the pass runs without network, "
                    "mount and PID isolation (see docs/security.md: what best-effort does not protect)", why)
    return "best-effort"


_WARNED = False


def cgroup_limits() -> str:
    """What this process's sandbox sessions get of a cgroup per job (:mod:`workers.sandbox._cglimits`): ``per job:
    pids (cgroup v1), memory (cgroup v2)``, or the one line saying which limit the host does not offer."""
    cgl = loader()._cgl
    got = cgl.available()
    note: str | None = cgl.note(got)
    return note or "per job: " + ", ".join(f"{c} ({got[c]})" for c in cgl.CONTROLLERS)

