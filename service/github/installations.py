"""Installations come and go: the ``installation`` and ``installation_repositories`` events, and what ampci
stops doing for an installation that was deleted or suspended, or a repository removed from one.

:func:`parse_installation_event` reads the two events into an :class:`InstallationChange`;
:class:`Installations` keeps, in the reporting process, which installations are gone (deleted, suspended;
back on ``unsuspend``/``created``) and which repositories were removed from theirs (back on ``added``).
The poster drops a queued report to such a repository without a request (to its dead list, the reason
named), and the webhook refuses a delivery naming a gone installation (403, one line recorded).  Each
change is one log line.  The state lives in memory: after a restart GitHub's own answers (404 for a deleted
installation, 403 for a suspended one) still end its reports, one request each.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from pydantic import StrictStr

from service.github.payloads import Installation, PayloadModel, Repository, validate
from service.json_types import JsonObject

log = logging.getLogger("service.github.reporter")

#: ``installation`` actions after which nothing is reported to the installation, and those that end that
GONE_ACTIONS = frozenset({"deleted", "suspend"})
BACK_ACTIONS = frozenset({"created", "unsuspend"})


class _InstallationEvent(PayloadModel):
    action: StrictStr
    installation: Installation


class _RepositoriesEvent(PayloadModel):
    action: StrictStr
    installation: Installation
    repositories_added: list[Repository] = []
    repositories_removed: list[Repository] = []


@dataclass(frozen=True)
class InstallationChange:
    """What an ``installation`` or ``installation_repositories`` delivery says: the installation, the action,
    and the repositories (``owner/name``) it added or removed."""

    installation: int
    action: str
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()

    @property
    def reason(self) -> str:
        """One line for the delivery's record and the log."""
        what = f"installation {self.installation} {self.action[:40]}"
        if self.removed:
            what += f": {len(self.removed)} repositories removed ({', '.join(self.removed[:5])[:200]})"
        if self.added:
            what += f": {len(self.added)} repositories added"
        return what


def parse_installation_event(event: str, data: JsonObject) -> InstallationChange:
    """The change an ``installation`` or ``installation_repositories`` payload says; PayloadError (one line)
    for a payload that is not one."""
    if event == "installation":
        change = validate(_InstallationEvent, data)
        return InstallationChange(change.installation.id, change.action)
    repos = validate(_RepositoriesEvent, data)
    return InstallationChange(repos.installation.id, repos.action,
                              tuple(r.full_name.lower() for r in repos.repositories_added),
                              tuple(r.full_name.lower() for r in repos.repositories_removed))


class Installations:
    """Which installations ampci no longer reports to, and which repositories were removed from theirs
    (thread-safe; module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._gone: dict[int, str] = {}       # installation -> action that ended it
        self._removed: dict[str, int] = {}    # repository (lower case) -> installation it was removed from

    def apply(self, change: InstallationChange) -> bool:
        """Take ``change`` into account; True when it changed what is reported (one log line then)."""
        with self._lock:
            before = (dict(self._gone), dict(self._removed))
            if change.action in GONE_ACTIONS:
                self._gone[change.installation] = change.action
            elif change.action in BACK_ACTIONS:
                self._gone.pop(change.installation, None)
            for repo in change.removed:
                self._removed[repo] = change.installation
            for repo in change.added:
                self._removed.pop(repo, None)
            changed = before != (self._gone, self._removed)
        if changed:
            log.warning("%s: %s", change.reason, "reports to it stop" if change.action in GONE_ACTIONS or change.removed
                        else "reports to it resume")
        return changed

    def gone(self, installation: int | None) -> str | None:
        """Why nothing is sent for ``installation`` (``deleted``, ``suspend``), or None."""
        with self._lock:
            return self._gone.get(installation) if installation is not None else None

    def stopped(self, repo: str, installation: int | None) -> str | None:
        """Why no report goes to ``repo`` (served by ``installation`` when known), or None."""
        with self._lock:
            if installation is not None and installation in self._gone:
                return f"installation {installation} {self._gone[installation]}"
            removed = self._removed.get(repo.lower())
            return f"{repo.lower()} removed from installation {removed}" if removed is not None else None
