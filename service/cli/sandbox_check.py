"""Start-up check of the pass sandbox for the commands that run jobs as a service (``serve``, ``worker``).

Their default is ``AMPCI_SANDBOX=require``: on a machine that cannot make the sandbox's namespaces they refuse to
start with one line saying what to enable (:class:`service.errors.ConfigError`, exit 2), instead of running a
pull request's code unisolated.  ``best-effort`` starts with one warning line; the mode is set in the
environment so that every process the command starts (pool workers, Celery children) uses the same.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from service.errors import ConfigError

if TYPE_CHECKING:
    from service.settings import Settings


def require_sandbox_by_default() -> str:
    """Make ``require`` the default of this process and its children (an explicit AMPCI_SANDBOX stays);
    returns the mode in force."""
    return os.environ.setdefault("AMPCI_SANDBOX", "require")


def check_sandbox(settings: Settings) -> str:
    """``full`` or ``best-effort`` for this machine under ``settings``; ConfigError (one line) for ``require``
    where the sandbox cannot be made."""
    from workers.sandbox import SandboxUnavailable, resolve_mode

    try:
        mode = resolve_mode(settings.worker_config().sandbox_policy())
    except SandboxUnavailable as exc:
        raise ConfigError(str(exc)) from None
    if mode != "full":
        print("ampci: warning: the pass sandbox is best-effort on this machine (environment, descriptors and "
              "limits only: no network, mount or PID isolation)", file=sys.stderr, flush=True)
    return mode
