"""The pass repository of a run: which git repository its jobs check out, and that repository's history.

A run tests ``AMPCI_PASS_REPO`` when it is set; else a webhook run (and the baseline, confirmation and
bisection runs made for it) names its webhook's own repository in its meta (:data:`PASS_REPO`:
``{"url", "repo", "installation"}``, never a credential), reachable only by that clone URL, and this checkout
serves every other run.  :func:`job_worker_config` gives a job the worker config for its repository (with a
token for a private one); :func:`record_ancestry` records a revision's first-parent history read with git from
the same repository, which is what baselines, bisection and resolution walk.
"""

from __future__ import annotations

import dataclasses
import logging

from service.db.records import RevisionRow
from service.db.store import Store
from service.errors import UserError
from service.json_types import JsonObject, JsonValue
from service.regressions.thresholds import Thresholds
from service.settings import Settings
from workers.revision.config import WorkerConfig

#: The run meta key (and job option) naming the run's pass repository when it is its webhook's own
#: (``{"url", "repo", "installation"}``: :class:`service.api.dispatch.RunDispatcher`).  No credential.
PASS_REPO = "pass_repo"

log = logging.getLogger(__name__)


def pass_repo_of(meta: JsonObject | None) -> JsonObject | None:
    """A copy of the :data:`PASS_REPO` entry of a run's ``meta`` when it names a clone URL, else None (the run
    tests ``AMPCI_PASS_REPO`` or this checkout)."""
    source = (meta or {}).get(PASS_REPO)
    if isinstance(source, dict) and isinstance(source.get("url"), str):
        return dict(source)
    return None


def job_worker_config(settings: Settings, source: JsonValue) -> WorkerConfig:
    """The :class:`workers.revision.config.WorkerConfig` a job runs with: ``settings.worker_config()``, and when
    ``AMPCI_PASS_REPO`` is unset and the job names its webhook's repository (``source``: the
    :data:`PASS_REPO` entry of its options), that repository's clone URL with a token for it
    (:func:`service.github_auth.git_token.git_token`; '' when none).  The token lives in this config only, never
    in the run, a message or a log line."""
    config = settings.worker_config()
    if settings.pass_repo or not isinstance(source, dict) or not isinstance(source.get("url"), str):
        return config
    from service.github_auth.git_token import git_token

    url, repo = source["url"], str(source.get("repo") or "")
    installation = source.get("installation") if type(source.get("installation")) is int else None
    return dataclasses.replace(config, pass_repo_url=url,
                               pass_repo_token=git_token(settings, url, repo, installation) if repo else "")


def record_ancestry(settings: Settings, store: Store, sha: str, depth: int | None = None,
                    source: JsonValue = None) -> int:
    """Record ``sha`` and its first-parent ancestors (at most ``depth``, default the thresholds'
    ``ancestor_depth``) with all their parent links, read with git from the pass repository -- the one
    ``source`` names (a run's :data:`PASS_REPO` entry: the webhook's repository, cloned or fetched into the
    revision cache with its token), else ``AMPCI_PASS_REPO`` or this checkout; return how many revisions were
    written.  Links recorded before for these commits (e.g. what a push payload implied) are replaced by git's.
    Baselines, bisection and resolution walk these links.  UserError when git cannot read the commit."""
    from workers.revision.git_commands import RevisionError
    from workers.revision.revisions import RevisionCache
    depth = depth or (store.thresholds or Thresholds()).ancestor_depth
    try:
        chain = RevisionCache.from_config(job_worker_config(settings, source)).first_parents(sha, depth)
    except RevisionError as exc:
        raise UserError(str(exc)) from None
    return int(store.upsert_revisions([RevisionRow(c, parents) for c, parents in chain]))


def record_run_ancestry(settings: Settings, store: Store, run_id: int) -> bool:
    """Record run ``run_id``'s revision's first-parent history read with git (:func:`record_ancestry`) when the run
    tests its webhook's own repository (its meta's :data:`PASS_REPO`: cloned or fetched with the run's installation
    token) or is a webhook run under ``AMPCI_PASS_REPO``, replacing whatever links were recorded before for those
    commits.  Called before a bisection starts and before a webhook ``push`` run is judged (a push payload lists
    commits without their parents: ampci links none of them itself).  True when recorded; False for another run,
    or when git cannot read it (one log line; the links recorded so far are walked, and a push run still has its
    payload's ``before`` as its baseline).  Never raises."""
    try:
        run = store.get_run(run_id)
        source = pass_repo_of(run.meta)
        if source is None and not (settings.pass_repo and isinstance((run.meta or {}).get("github"), dict)):
            return False
        record_ancestry(settings, store, run.revision_sha, source=source)
        return True
    except Exception as exc:  # noqa: BLE001 - a repository that cannot be read must not stop the run's finish
        log.warning("ancestry of run %s not read from its repository (the links recorded so far stand): %s", run_id,
                    str(exc)[:300])
        return False
