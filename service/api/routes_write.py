"""Write endpoints (bearer token required): trigger a manual run, acknowledge a regression, mark a
false positive."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated

from fastapi import APIRouter, Body, Depends, Header, Request
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from starlette.responses import JSONResponse

from service.api.dispatch import manual_pass_repo
from service.api.routes_read import Id
from service.errors import UserError
from service.github.events import check_repository
from service.github.sanitize import free_text
from service.json_types import JsonObject
from service.orchestration.judge import record_verdict
from service.orchestration.pass_repo import PASS_REPO
from service.settings import Settings
from service.web.auth import require_write

if TYPE_CHECKING:
    from service.api.context import AppContext

router = APIRouter(prefix="/api", tags=["write"], dependencies=[Depends(require_write)])

#: A revision as a user names it: branch, tag, full or short sha (git's ref-name characters, no leading '-').
Rev = Annotated[str, Field(pattern=r"^[A-Za-z0-9._/+@][A-Za-z0-9._/+@-]{0,199}$")]
SHA40 = re.compile(r"[0-9a-fA-F]{40}")
#: Free text (triage notes, names): NUL removed and lone surrogates replaced before validation, as at
#: the webhook intake (:func:`service.github.sanitize.free_text`), never refused for them.
Text = Annotated[str, BeforeValidator(lambda v: free_text(v, 2000) if isinstance(v, str) else v),
                 Field(max_length=2000)]


class ManualRun(BaseModel):
    """A run to start by hand."""

    model_config = ConfigDict(extra="forbid")
    revision: Rev = Field(description="pass revision: branch, tag, full or short sha of the pass repository "
                                      "(repository, else AMPCI_PASS_REPO)")
    sweep: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,100}$")] = "smoke"
    baseline: Rev | None = Field(default=None, description="revision to compare with (default: first parent)")
    repo: Annotated[str | None, Field(pattern=r"^[A-Za-z0-9_.-]{1,100}/[A-Za-z0-9_.-]{1,100}$",
                                      description="owner/name to report a commit status to")] = None
    repository: Annotated[str | None, Field(
        pattern=r"^[A-Za-z0-9_.-]{1,100}/[A-Za-z0-9_.-]{1,100}$",
        description="owner/name of the repository to test (AMPCI_PASS_REPO unset): an allowed one whose webhook "
                    "deliveries named its clone URL; revision and baseline are resolved in it")] = None


def resolve_api_revision(settings: Settings, revision: str, source: JsonObject | None = None) -> str:
    """The full sha a request names: a full 40-hex sha as it is (a deployment whose API cannot reach the
    pass repository still takes webhook-style shas), anything else resolved through the pass repository
    (``source``: the run's webhook repository, else ``AMPCI_PASS_REPO`` or this checkout;
    :func:`service.orchestration.scheduler.resolve_revision`); an unknown name is a UserError (400), nothing stored."""
    if SHA40.fullmatch(revision):
        return revision.lower()
    if revision == "WORKTREE":
        raise UserError("revision WORKTREE names a local working tree; the API takes committed revisions only")
    from service.orchestration.scheduler import resolve_revision

    return resolve_revision(settings, revision, source)


class Triage(BaseModel):
    """Who triaged a finding and why."""

    model_config = ConfigDict(extra="forbid")
    by: Annotated[str | None, BeforeValidator(lambda v: free_text(v, 200) if isinstance(v, str) else v),
                  Field(max_length=200)] = None
    note: Text | None = None


@router.post("/runs", status_code=202, summary="Trigger a manual run of a sweep at a revision")
def trigger_run(request: Request, body: ManualRun,
                idempotency_key: Annotated[str | None, Header(pattern=r"^[A-Za-z0-9._:-]{1,100}$")] = None,
                ) -> JSONResponse:
    ctx = request.app.state.ctx
    if body.repo is not None:
        check_repository(body.repo, ctx.settings)  # RepositoryNotAllowedError -> 403
    # the repository to test: one a webhook delivery named (its clone URL), as a webhook run of it tests
    source = manual_pass_repo(ctx.settings, ctx.store, body.repository) if body.repository is not None else None
    sha = resolve_api_revision(ctx.settings, body.revision, source)
    baseline = resolve_api_revision(ctx.settings, body.baseline, source) if body.baseline else None
    meta: JsonObject = {"github": {"repo": body.repo, "event": "manual"}} if body.repo else {}
    if source is not None:
        meta[PASS_REPO] = source
    dedup = f"api:{idempotency_key}" if idempotency_key else None
    submitted = ctx.dispatcher.create(sha, "manual", baseline, body.sweep, dedup, meta)
    if submitted.created and body.repo:
        ctx.reporter.queued(submitted.run_id, body.repo, sha)
    return JSONResponse({"run_id": submitted.run_id, "created": submitted.created,
                         "url": ctx.reporter.run_url(submitted.run_id)},
                        status_code=202 if submitted.created else 200)


def _triage(request: Request, regression_id: int, body: Triage | None, false_positive: bool) -> JsonObject:
    body = body or Triage()
    ctx: AppContext = request.app.state.ctx
    found = ctx.store.ack(regression_id, by=body.by, false_positive=false_positive, note=body.note)
    record_verdict(ctx.store, found.run_id)  # a false positive can turn the run's gate: the lists follow
    ctx.reporter.refresh(ctx.store, found.run_id)  # the PR report shows the new state (queued; never raises)
    return found.to_dict()


@router.post("/regressions/{regression_id}/ack", summary="Acknowledge a finding")
def ack(request: Request, regression_id: Id, body: Annotated[Triage | None, Body()] = None) -> JsonObject:
    return _triage(request, regression_id, body, false_positive=False)


@router.post("/regressions/{regression_id}/false-positive", summary="Mark a finding a false positive")
def false_positive(request: Request, regression_id: Id,
                   body: Annotated[Triage | None, Body()] = None) -> JsonObject:
    return _triage(request, regression_id, body, false_positive=True)
