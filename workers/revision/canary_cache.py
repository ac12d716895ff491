"""A passed sandbox canary, remembered under the cache directory until something it depends on changes.

The canary (:mod:`workers.revision.canary`) costs a fresh interpreter that imports numpy, onnx and onnx_ir, a sandbox
and a conversion: about 1.5 s of CPU (and numpy and onnx in the calling process, to build its model), paid by
every ``ampci sweep`` and ``ampci check`` before its first job.  Its answer depends only on what
:func:`canary_key` lists, so a command that finds a passed canary with the same key, younger than
:data:`MAX_AGE_S`, uses it instead of converting again (:func:`cached_canary`):

- the interpreter: its path, resolved path, version, and the size and mtime of its executable;
- every ``sys.path`` directory with its mtime (installing or removing a package changes its directory's);
- the modules the canary's stand-in imports (:func:`workers.revision.canary.pass_imports`: the checkout's ``amp_pass``
  import set);
- the sandbox: the policy, the mode it resolves to here, and the plain-data spec the supervisor reads
  (:func:`workers.sandbox.policy.spec_for`: hidden directories, interpreter trees, limits, the allow-listed
  environment);
- the sandbox's own code (a digest of every module of ``workers/sandbox/`` and of ``workers/revision/convert.py``
  and ``canary.py``);
- the machine: host name, kernel release and version, effective uid.

Any change is a different key, so the canary runs again.  Only passed canaries are kept (a failure is always
met afresh), one JSON file per key (``<cache_dir>/canary/<sha256>.json``, mode 0600, written atomically).
The cache directory is the trusted side's: it is hidden from every sandbox (:meth:`WorkerConfig.sandbox_policy`),
so no pass can write a passed canary there.  ``serve`` and ``worker`` do not use this: they run the canary at
each start (:func:`service.cli.sandbox_check.check_canary`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from workers.revision import canary
from workers.sandbox.policy import SandboxPolicy

#: A remembered canary older than this runs again (what the key cannot see: a kernel setting flipped since).
MAX_AGE_S = 24 * 3600.0
_HERE = Path(__file__).resolve().parent
#: The code the canary's answer depends on: the sandbox floor, and the conversion and canary beside this module.
_CODE = (*sorted(_HERE.parent.joinpath("sandbox").glob("*.py")), _HERE / "convert.py", _HERE / "canary.py")


def _stat(path: str) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_mtime_ns, st.st_size]


def canary_key(policy: SandboxPolicy, modules: list[str]) -> dict[str, Any]:
    """Everything the canary's answer depends on (see the module doc), as plain data."""
    from workers.sandbox.policy import resolve_mode, spec_for

    mode = resolve_mode(policy)
    code = hashlib.sha256()
    for path in _CODE:
        code.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    uname = os.uname()
    return {
        "interpreter": [sys.executable, os.path.realpath(sys.executable), sys.version,
                        _stat(os.path.realpath(sys.executable))],
        "import_roots": [[p, _stat(p)] for p in sys.path if p and os.path.isdir(p)],
        "modules": sorted(modules),
        "policy": json.loads(json.dumps(dataclasses.asdict(policy), sort_keys=True, default=str)),
        "mode": mode,
        "spec": spec_for(policy, [], mode == "full", preimport=()),
        "code": code.hexdigest(),
        "machine": [uname.nodename, uname.release, uname.version, os.geteuid()],
    }


def pass_imports_cached(cache_dir: Path, root: Path | None = None) -> list[str]:
    """:func:`workers.revision.canary.pass_imports` of the pass under ``root`` (default: this checkout), remembered under
    ``cache_dir`` by the path, size and mtime of each of its ``.py`` files and of each ``sys.path`` directory
    (reading them with ``ast`` costs the calling command ~75 ms of CPU here; a ``stat`` each costs nothing)."""
    from workers.revision.convert import DEFAULT_PASS_ROOT

    pkg = (root or DEFAULT_PASS_ROOT) / "amp_pass"
    files = sorted(str(p) for p in pkg.rglob("*.py"))
    roots = [[p, _stat(p)] for p in sys.path if p and os.path.isdir(p)]  # (what this interpreter has)
    seen = hashlib.sha256(json.dumps([sys.version, roots, [[f, _stat(f)] for f in files]]).encode()).hexdigest()
    path = Path(cache_dir) / "canary" / f"imports-{seen}.json"
    try:
        got = json.loads(path.read_text())
        if isinstance(got, list) and all(isinstance(m, str) for m in got):
            return got
    except (OSError, ValueError):
        pass
    got = canary.pass_imports(root)
    _store(path, got)
    return got


def _digest(key: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()


def cached_canary(policy: SandboxPolicy, modules: list[str], cache_dir: Path,
                  max_age_s: float = MAX_AGE_S) -> canary.CanaryResult:
    """The canary's result for ``policy`` and ``modules``: a passed one remembered under ``cache_dir`` with the
    same :func:`canary_key` and younger than ``max_age_s``, else :func:`workers.revision.canary.run_canary` (its pass
    remembered).  Either way it is what :func:`workers.revision.canary.last` says afterwards.  A cache directory that
    cannot be read or written only costs the canary."""
    key = canary_key(policy, modules)
    path = Path(cache_dir) / "canary" / f"{_digest(key)}.json"
    try:
        stored = json.loads(path.read_text())
        if (stored.get("key") == key and stored.get("ok") is True
                and 0 <= time.time() - float(stored["ran_at"]) < max_age_s):
            result = canary.CanaryResult(True, "", float(stored["ran_at"]), float(stored["seconds"]),
                                         str(stored.get("sandbox", "")))
            canary.remember(result)
            return result
    except (OSError, ValueError, KeyError, TypeError):
        pass
    result = canary.run_canary(policy, modules)
    if result.ok:
        _store(path, {"key": key, "ok": True, "ran_at": result.ran_at, "seconds": result.seconds,
                      "sandbox": result.sandbox})
    return result


def _store(path: Path, data: object) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, sort_keys=True)
        os.replace(tmp, path)
    except OSError:
        pass
