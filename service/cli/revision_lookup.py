"""Revisions as people name them, for the query commands (``ampci compare``): resolved like ``--revision``.

:func:`resolve_with_results` takes a branch, tag, full or short sha: a sha or unique prefix the store
knows is taken as is (no git needed, and results of commits no longer in the pass repository stay
reachable); anything else is resolved through the pass repository with git
(:func:`service.orchestration.scheduler.resolve_revision`).  Guarantees: an unknown name is a one-line
UserError saying so; a revision that exists but has no results is a UserError that says it exists and
names the newest revisions that do have results.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from service.errors import NotFoundError, UserError

if TYPE_CHECKING:
    from service.db.store import Store
    from service.settings import Settings

#: How many revisions with results the "no results" message names at most.
NAMED = 5
#: How many of the newest runs are looked at to find revisions with results.
RUNS_SCANNED = 200


def resolve(store: Store, ref: str, settings: Settings | None = None) -> str:
    """The full sha of ``ref`` (see the module docstring); UserError when neither the store nor git knows it."""
    ambiguous: UserError | None = None
    try:
        return str(store.resolve_revision(ref))
    except NotFoundError:
        pass
    except UserError as exc:  # not hex (a branch or tag name) or an ambiguous prefix: git decides
        ambiguous = exc if "ambiguous" in str(exc) else None
    from service.orchestration.scheduler import resolve_revision
    from service.settings import Settings

    try:
        return resolve_revision(settings or Settings.from_env(), ref)
    except UserError as exc:
        if ambiguous is not None:  # a prefix of several stored shas that git does not settle
            raise ambiguous from None
        why = str(exc).split(": ", 1)[-1] if str(exc).startswith("unknown revision") else str(exc)
        raise UserError(f"unknown revision {ref}: not in the results database, and {why}") from None


def has_results(store: Store, sha: str) -> bool:
    """True when at least one result is stored at revision ``sha``."""
    try:
        return bool(store.results(revision=sha, limit=1))
    except NotFoundError:  # a commit git knows and the store never recorded
        return False


def revisions_with_results(store: Store, limit: int = NAMED) -> list[str]:
    """The newest (by run) revisions that have results, at most ``limit``."""
    out: list[str] = []
    for run in store.list_runs(limit=RUNS_SCANNED):
        if run.revision_sha not in out and has_results(store, run.revision_sha):
            out.append(run.revision_sha)
            if len(out) >= limit:
                break
    return out


def resolve_with_results(store: Store, ref: str, settings: Settings | None = None) -> str:
    """:func:`resolve`, then a UserError when the revision has no results, naming revisions that do."""
    sha = resolve(store, ref, settings)
    if has_results(store, sha):
        return sha
    named = revisions_with_results(store)
    where = (f"revisions with results (newest first): {', '.join(s[:12] for s in named)}" if named
             else "no revision has results yet")
    shown = ref if ref.lower() == sha else f"{ref} ({sha[:12]})"
    raise UserError(f"revision {shown} exists but has no results; {where}")
