"""Start-up check of the pass sandbox for the commands that run jobs (``serve``, ``worker``, ``sweep``, ``check``).

``serve``/``worker`` run with ``AMPCI_SANDBOX=require`` unless ``best-effort`` is set by name (``auto`` means
``require`` for them: they never fall back): on a machine that cannot make the sandbox's namespaces they refuse to
start with one line saying what to enable (:class:`service.errors.ConfigError`, exit 2), instead of running a
pull request's code unisolated.  ``best-effort`` starts with one warning line; the mode is set in the
environment so that every process the command starts (pool workers, Celery children) uses the same.

Then the canary (:mod:`workers.revision.canary`): one conversion of a tiny model through the real sandbox.  Where it
fails (the sandbox cannot import the pass's dependencies, cannot be made, cannot fork) every job would fail
the same way, so ``serve``/``worker`` refuse to start and embedded commands stop before their first job, with
its one line (:class:`SandboxCanaryFailed`, exit 3: ampci's own environment is broken, not the pass).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from service.errors import ConfigError, ServiceError

if TYPE_CHECKING:
    from collections.abc import Callable

    from service.settings import Settings
    from workers.revision.canary import CanaryResult


class SandboxCanaryFailed(ServiceError):
    """The canary conversion failed: no job could convert here (the message is the canary's one line)."""

    exit_code = 3


def require_sandbox_by_default() -> str:
    """Make ``require`` the mode of this process and its children unless ``best-effort`` is asked for by name:
    ``serve``/``worker`` never fall back to best-effort (``auto``, or no AMPCI_SANDBOX, means ``require``
    here); returns the mode in force."""
    if os.environ.get("AMPCI_SANDBOX", "").strip().lower() != "best-effort":
        os.environ["AMPCI_SANDBOX"] = "require"
    return os.environ["AMPCI_SANDBOX"]


def check_sandbox(settings: Settings) -> str:
    """``full`` or ``best-effort`` for this machine under ``settings``; ConfigError (one line) for ``require``
    where the sandbox cannot be made."""
    from workers.sandbox.policy import SandboxUnavailable, resolve_mode

    try:
        mode = resolve_mode(settings.worker_config().sandbox_policy())
    except SandboxUnavailable as exc:
        raise ConfigError(str(exc)) from None
    if mode != "full":
        print("ampci: warning: the pass sandbox is best-effort on this machine (an unprivileged uid, environment, "
              "descriptors, system-call filter and limits only: no network, mount or PID isolation)",
              file=sys.stderr, flush=True)
    return mode


def check_canary(settings: Settings, modules: list[str] | None = None, cached: bool = False) -> CanaryResult:
    """Run the sandbox canary with ``settings``' sandbox policy (importing ``modules``, default
    :func:`workers.revision.canary.pass_imports`); :class:`SandboxCanaryFailed` (one line) when it fails.  ``cached``: a
    passed canary with the same key under the cache directory stands (:mod:`workers.revision.canary_cache`)."""
    from workers.revision.canary import pass_imports, run_canary

    config = settings.worker_config()
    for directory in (config.data_dir, config.cache_dir):  # hidden from the pass only where they exist: the
        try:  # canary's sandbox (and its key) is then the one the jobs get, also on a command's first run
            Path(directory).mkdir(parents=True, exist_ok=True)
        except OSError:
            pass
    if cached:
        from workers.revision.canary_cache import cached_canary

        result = cached_canary(config.sandbox_policy(), pass_imports() if modules is None else modules,
                               config.cache_dir)
    else:
        result = run_canary(config.sandbox_policy(), modules)
    if not result.ok:
        raise SandboxCanaryFailed(result.reason)
    return result


def start_canary(settings: Settings) -> Callable[[], CanaryResult]:
    """Start :func:`check_canary` in a thread (so it overlaps the command's own start-up); returns the function
    that waits for it and raises its :class:`SandboxCanaryFailed`.  For the embedded commands (``sweep``,
    ``check``): a passed canary remembered with the same key stands (:mod:`workers.revision.canary_cache`)."""
    import threading

    from workers.revision.canary_cache import pass_imports_cached

    # read here, not in the thread: CPython 3.11's ast module keeps its recursion depth in interpreter-wide state,
    # so ast.parse in a thread beside the main thread's own ast use raised "AST constructor recursion depth
    # mismatch" (seen in sweeps whose start-up parses source meanwhile)
    modules = pass_imports_cached(settings.worker_config().cache_dir)
    got: list[CanaryResult | BaseException] = []

    def run() -> None:
        try:
            got.append(check_canary(settings, modules, cached=True))
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            got.append(exc)

    thread = threading.Thread(target=run, name="ampci-canary", daemon=True)
    thread.start()

    def wait() -> CanaryResult:
        thread.join()
        if isinstance(got[0], BaseException):
            raise got[0]
        return got[0]

    return wait
