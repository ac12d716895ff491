"""Whose failure is it: a conversion that failed because of ampci or the machine, not because of the pass.

A job's failure is the pass's (it raised, wrote no or an invalid model, an inaccurate one, exceeded its own time
or memory limits: ``convert_error``, ``timeout``, ``crash``, …) or ampci's / the machine's (the sandbox could not
be made, or could not import a dependency the trusted interpreter has, a cache unreadable, a worker error, no
device for the target): :data:`workers.result.INFRA_ERROR`, with the cause in one line starting
:data:`workers.result.INFRA_PREFIX`.

:func:`import_failure_cause` reads the last line of the pass's stderr: a ``ModuleNotFoundError``/``ImportError``
for a module that is **not** under the pass's own ``amp_pass`` package, not in this project's own source tree,
and that the trusted worker interpreter finds (searched without importing anything: no code of the named module
runs here) is a module the sandbox hid from the pass, so ampci's fault.  A module the worker does not have, or
one of ``amp_pass``, is the pass's own import failing: its fault.

Trust: the line is written by the pass under test.  A hostile pass can print a fake ``ModuleNotFoundError`` for a
module the worker has and so get ``error`` instead of ``convert_error``.  That gains it nothing: an ``error``
result is never green (it fails the run's gate with state ``error``), never serves as a baseline, never counts as
a known failure nor as a flip of a flaky lineage (:data:`workers.result.NOT_OF_THE_PASS`), so it can neither hide
a regression nor make a later one look like noise.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import re
import sys
from pathlib import Path

from workers.result import INFRA_PREFIX

#: ``ModuleNotFoundError: No module named 'onnx.inliner'`` / ``ImportError: cannot import name 'x' from 'y'``.
_NOT_FOUND = re.compile(r"(?:ModuleNotFoundError|ImportError): No module named '([A-Za-z_][\w.]{0,200})'")
_CANNOT_IMPORT = re.compile(r"ImportError: cannot import name '\w+' from '([A-Za-z_][\w.]{0,200})'")
#: The project's own source tree (its modules are not the interpreter's: a pass importing them is the pass's doing).
PROJECT_ROOT = Path(__file__).resolve().parents[1]
#: The pass's own package: its import failing is the pass's fault.
PASS_PACKAGE = "amp_pass"


def _origin(name: str) -> str | None:
    """Where the trusted interpreter would load module ``name`` from, found without importing anything (the
    parents' specs give the search path of each next part), or None when it does not have it."""
    parts = name.split(".")
    try:
        spec = importlib.util.find_spec(parts[0]) if parts[0] not in sys.modules else getattr(
            sys.modules[parts[0]], "__spec__", None)
        for i in range(1, len(parts)):
            if spec is None or not spec.submodule_search_locations:
                return None
            spec = importlib.machinery.PathFinder.find_spec(".".join(parts[:i + 1]),
                                                            list(spec.submodule_search_locations))
    except (ImportError, ValueError, AttributeError):
        return None
    if spec is None:
        return None
    return spec.origin or next(iter(spec.submodule_search_locations or []), None) or "built-in"


def _own(origin: str) -> bool:
    """True for a module of this project's source tree (not an installed one under a virtualenv in it)."""
    try:
        rel = Path(origin).resolve().relative_to(PROJECT_ROOT)
    except (ValueError, OSError):
        return False
    return not ({"site-packages", "dist-packages"} & set(rel.parts))


def hidden_module(last_line: str) -> tuple[str, str] | None:
    """``(module, where the worker has it)`` when ``last_line`` (the pass's last stderr line) reports an import
    failure of a module the sandbox hid (see the module docstring), else None."""
    m = _NOT_FOUND.search(last_line) or _CANNOT_IMPORT.search(last_line)
    if m is None:
        return None
    name = m.group(1).strip(".")
    if not name or name.split(".")[0] == PASS_PACKAGE:
        return None
    origin = _origin(name)
    if origin is None or _own(origin):
        return None
    return name, origin


def import_failure_cause(last_line: str) -> str | None:
    """The one-line cause of an :data:`~workers.result.INFRA_ERROR` when the pass failed importing a module the
    sandbox hid from it, e.g. ``infrastructure: the sandbox cannot import onnx.inliner (site-packages under
    /tmp)``; None when the failure is the pass's own."""
    got = hidden_module(last_line)
    if got is None:
        return None
    name, origin = got
    where = ""
    if origin.startswith(("/tmp/", "/var/tmp/", "/dev/shm/")):
        where = f" (site-packages under /{origin.split('/')[1]})"
    return (f"{INFRA_PREFIX}the sandbox cannot import {name}{where}, which the worker's interpreter has at "
            f"{origin}; re-run once the sandbox shows it")


def infra_message(what: str) -> str:
    """``what`` as the one-line message of an :data:`~workers.result.INFRA_ERROR` result (its remedy: a re-run)."""
    line = " ".join(what.split())
    return f"{INFRA_PREFIX}{line[:400]}; re-run once it is fixed"
