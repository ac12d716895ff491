"""The pieces of GitHub webhook payloads that several events share, defined once.

:mod:`service.github.events` (push, pull_request, issue_comment) and :mod:`service.github.rerequest`
(``check_run`` / ``check_suite`` ``rerequested``) validate their payloads with these models: the repository
(its ``owner/name``, its clone URL checked against it with the settings), the App installation, a pull
request's head or base ref; :func:`validate` turns a pydantic error into the one-line :class:`PayloadError`
recorded for the rejected delivery; :func:`check_repository` is the allowlist every event passes.
"""

from __future__ import annotations

import re
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, StrictInt, ValidationError, field_validator

from service.errors import UserError
from service.github.sanitize import BRANCH_MAX, REPOSITORY_MAX, name_text
from service.github.stored import PayloadError, check_commit_sha
from service.json_types import JsonObject, JsonValue
from service.settings import Settings

M = TypeVar("M", bound=BaseModel)


class RepositoryNotAllowedError(UserError):
    """A correctly signed delivery from a repository outside ``AMPCI_ALLOWED_REPOS`` (HTTP 403)."""


class PayloadModel(BaseModel):
    """A part of a payload: unknown fields ignored, no string longer than 1,000,000 characters."""

    model_config = ConfigDict(extra="ignore", str_max_length=1_000_000)


def positive_id(v: int) -> int:
    """``v`` when it is a GitHub id (a positive 64-bit integer); ValueError otherwise."""
    if not 0 < v < 2**63:
        raise ValueError("must be a positive 64-bit integer")
    return v


class Repository(PayloadModel):
    """``repository``: its ``owner/name``; its ``clone_url`` only through :func:`clone_url` (never trusted as is)."""

    full_name: str
    clone_url: JsonValue = None

    @field_validator("full_name")
    @classmethod
    def _owner_name(cls, v: str) -> str:
        if len(v) > REPOSITORY_MAX or not re.fullmatch(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+", v):
            raise ValueError(f"not an owner/name repository: {v[:100]!r}")
        return v


class Installation(PayloadModel):
    """``installation``: the GitHub App installation that sent the delivery."""

    id: StrictInt

    @field_validator("id")
    @classmethod
    def _id(cls, v: int) -> int:
        return positive_id(v)


class Ref(PayloadModel):
    """A pull request's ``head`` or ``base``: a commit sha (lower-cased) and a branch name; ``repo``
    (``{"full_name": ...}``, null for a deleted fork) is only compared, never stored."""

    sha: str
    ref: str
    repo: JsonValue = None

    @field_validator("sha")
    @classmethod
    def _sha(cls, v: str) -> str:
        return check_commit_sha(v)

    @field_validator("ref")
    @classmethod
    def _ref(cls, v: str) -> str:
        return name_text(v, BRANCH_MAX)


def validation_reason(exc: ValidationError) -> str:
    """The one-line reason of a payload that failed validation: where and what (its first error)."""
    err = exc.errors(include_url=False)[0]
    where = ".".join(str(p) for p in err.get("loc", ())) or "payload"
    return f"invalid payload: {where}: {err.get('msg', 'invalid')}"


def validate(model: type[M], data: JsonObject) -> M:
    """``data`` validated as ``model``; PayloadError with :func:`validation_reason` otherwise."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise PayloadError(validation_reason(exc)) from None


def check_repository(full_name: str, settings: Settings) -> None:
    """Raise RepositoryNotAllowedError unless ``full_name`` is on the allowlist (case-insensitive);
    an empty allowlist admits nothing, except with ``AMPCI_INSECURE_DEV``."""
    allowed = settings.allowed_repo_set()
    if full_name.lower() in allowed:
        return
    if not allowed and settings.insecure_dev:
        return  # development: an empty allowlist admits every repository
    raise RepositoryNotAllowedError(f"repository {full_name} is not in AMPCI_ALLOWED_REPOS")


def clone_url(repository: Repository, settings: Settings) -> str | None:
    """The delivery's clone URL when the run's pass repository is the delivery's own (``AMPCI_PASS_REPO`` unset):
    checked by :func:`workers.revision.pass_source.check_clone_url` (https at that ``owner/name``, or ``file://`` with
    ``AMPCI_PASS_REPO_ALLOW_FILE``); None when the settings name a pass repository or the delivery has none.
    A URL that may not be cloned rejects the delivery (PayloadError, its reason recorded)."""
    from workers.revision.pass_source import CloneUrlError, check_clone_url

    if settings.pass_repo or repository.clone_url is None:
        return None
    try:
        return check_clone_url(repository.clone_url, allow_file=settings.pass_repo_allow_file,
                               repo=repository.full_name)
    except CloneUrlError as exc:
        raise PayloadError(f"invalid payload: repository.clone_url: {exc}") from None
