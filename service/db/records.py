"""Plain, immutable records returned by the Store (no ORM objects escape the store).

Every record has ``to_dict()`` giving JSON-ready values (datetimes as ISO-8601 UTC strings), which
the CLI's ``--json`` and the HTTP API emit as is.
"""

from __future__ import annotations

import math
import re
from dataclasses import Field, dataclass, field, fields
from datetime import UTC, datetime
from typing import ClassVar, TypeVar, overload

from service.errors import NotFoundError, UserError
from service.json_types import JsonObject, JsonValue

#: A revision as the CLI and API take it: a sha, or a unique prefix of one.
_REVISION_REF = re.compile(r"^[0-9a-fA-F]{4,64}$")


def revision_ref(ref: str | None) -> str:
    """``ref`` normalised (stripped, lower case), or UserError when it is not 4-64 hex digits."""
    ref = (ref or "").strip().lower()
    if not _REVISION_REF.match(ref):
        raise UserError(f"not a revision: {ref!r} (give 4-64 hex digits of a sha)")
    return ref


def resolve_ref(ref: str, found: list[str]) -> str:
    """The full sha ``ref`` names among ``found`` (the stored shas starting with it, sorted, at most 6):
    NotFoundError when none, UserError naming the candidates when several and none is ``ref`` itself."""
    if not found:
        raise NotFoundError(f"unknown revision {ref}")
    if len(found) > 1 and ref not in found:
        more = ", ".join(s[:12] for s in found[:5])
        raise UserError(f"revision prefix {ref} is ambiguous: {more}{', …' if len(found) > 5 else ''}")
    return ref if ref in found else found[0]

Cell = tuple[str, str, str, str]  # (model, dtype, policy, target)


@overload
def utc(dt: datetime) -> datetime: ...
@overload
def utc(dt: None) -> None: ...
def utc(dt: datetime | None) -> datetime | None:
    """``dt`` as an aware UTC datetime (SQLite hands back naive ones)."""
    if dt is None:
        return None
    return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt.astimezone(UTC)


T = TypeVar("T")


def _json_value(v: object) -> JsonValue:
    if isinstance(v, datetime):
        return utc(v).isoformat()
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, tuple | list):
        return [_json_value(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _json_value(x) for k, x in v.items()}
    if hasattr(v, "to_dict"):
        return v.to_dict()
    return v


class _Record:
    __dataclass_fields__: ClassVar[dict[str, Field[object]]]  # each record is a dataclass

    def to_dict(self) -> JsonObject:
        """JSON-ready dict of all fields."""
        return {f.name: _json_value(getattr(self, f.name)) for f in fields(self)}


@dataclass(frozen=True)
class RevisionInfo(_Record):
    """A pass revision."""

    sha: str
    parents: tuple[str, ...]
    branch: str | None
    author: str | None
    message: str | None
    committed_at: datetime | None


@dataclass(frozen=True)
class RunInfo(_Record):
    """A run (one sweep of one revision)."""

    id: int
    revision_sha: str
    baseline_sha: str | None
    trigger: str
    status: str
    sweep: str
    dedup_key: str | None
    created_at: datetime
    finished_at: datetime | None
    meta: JsonObject = field(default_factory=dict)
    #: the gate's verdict in brief, as recorded when the run was last judged
    #: (:meth:`service.regressions.verdict.RunVerdict.brief`); None: not judged (unfinished, or older)
    verdict: JsonObject | None = None


@dataclass(frozen=True)
class JobInfo(_Record):
    """One job (cell of a run)."""

    id: int
    run_id: int
    model: str
    dtype: str
    policy: str
    target: str
    status: str
    attempts: int
    worker: str | None
    queued_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    error: str | None

    @property
    def cell(self) -> Cell:
        """(model, dtype, policy, target)."""
        return (self.model, self.dtype, self.policy, self.target)


@dataclass(frozen=True)
class RunRef:
    """What a worker needs of a job's run: its id, revision and ``meta`` (the sweep options); duck-types
    :class:`RunInfo` for :func:`service.orchestration.jobs.cell_options` and the result writers."""

    id: int
    revision_sha: str
    meta: JsonObject = field(default_factory=dict)


@dataclass(frozen=True)
class JobStart:
    """One delivery of a job as :meth:`service.db.store.Store.begin_job` counted it.

    ``started`` False: the job was already final (a redelivery), nothing was counted and ``attempts``
    is its stored count; otherwise ``attempts`` includes this delivery and ``job`` is the job row
    after it (``running``)."""

    job: JobInfo
    run: RunRef
    attempts: int
    started: bool


@dataclass(frozen=True)
class ResultRow(_Record):
    """The queried columns of one stored result (the full JobResult: ``Store.get_result``)."""

    id: int
    run_id: int
    revision_sha: str
    model: str
    dtype: str
    policy: str
    target: str
    status: str
    message: str | None
    cosine: float | None
    max_abs: float | None
    error_ratio: float | None
    latency_p50_ms: float | None
    speedup: float | None
    low_precision_fraction: float | None
    casts_inserted: int | None
    final_error: float | None
    diverged: bool | None
    env_fingerprint: str | None
    updated_at: datetime
    convert_s: float | None = None       # median conversion seconds as the worker timed them
    convert_cpu_s: float | None = None   # median CPU seconds of the conversion process in those samples
    pass_iterations: int | None = None   # the pass's painting fixpoint iterations (its report)

    @property
    def cell(self) -> Cell:
        """(model, dtype, policy, target)."""
        return (self.model, self.dtype, self.policy, self.target)


@dataclass(frozen=True)
class RegressionInfo(_Record):
    """A stored regression, improvement or flaky finding."""

    id: int
    run_id: int
    revision_sha: str
    baseline_sha: str | None
    model: str
    dtype: str
    policy: str
    target: str
    kind: str
    category: str
    severity: str
    metric: str
    baseline_value: float | None
    value: float | None
    delta: float | None
    ratio: float | None
    p_value: float | None
    detail: str
    result_id: int | None
    baseline_result_id: int | None
    state: str
    state_by: str | None
    state_at: datetime | None
    state_note: str | None
    resolved_by_result_id: int | None
    created_at: datetime
    state_before: str | None = None  # open/acknowledged while a recovery awaits confirmation (suspected_resolved)

    @property
    def cell(self) -> Cell:
        """(model, dtype, policy, target)."""
        return (self.model, self.dtype, self.policy, self.target)


@dataclass(frozen=True)
class RunSummary(_Record):
    """Counts for one run, e.g. for a GitHub commit status."""

    run_id: int
    status: str
    cells: int
    job_status: dict[str, int]
    result_status: dict[str, int]
    regressions: dict[str, int]   # open/acknowledged regressions by kind
    improvements: int
    flaky: int

    def describe(self) -> str:
        """One line such as ``48 cells: 46 pass, 1 accuracy regression, 1 flaky``."""
        parts = [f"{self.result_status.get('pass', 0)} pass"]
        for status, n in sorted(self.result_status.items()):
            if status != "pass" and n:
                parts.append(f"{n} {status}")
        pending = sum(n for s, n in self.job_status.items() if s in ("queued", "running"))
        if pending:
            parts.append(f"{pending} pending")
        for kind, n in sorted(self.regressions.items()):
            parts.append(f"{n} {kind} regression{'s' if n != 1 else ''}")
        if self.improvements:
            parts.append(f"{self.improvements} improvement{'s' if self.improvements != 1 else ''}")
        if self.flaky:
            parts.append(f"{self.flaky} flaky")
        return f"{self.cells} cells: " + ", ".join(parts)


@dataclass(frozen=True)
class CompareRow(_Record):
    """One cell compared between two revisions (None where a side has no result)."""

    model: str
    dtype: str
    policy: str
    target: str
    a: ResultRow | None
    b: ResultRow | None
    deltas: dict[str, float | None]


@dataclass(frozen=True)
class HistoryPoint(_Record):
    """One value of a cell's metric at one run, oldest first in a history."""

    result_id: int
    run_id: int
    revision_sha: str
    trigger: str
    created_at: datetime
    status: str
    policy: str
    target: str
    value: float | None
    #: the cell's dtype (a history of every dtype of a model holds several)
    dtype: str = ""
    #: for ``final_error``: the unit of ``value`` (``relative``, or ``absolute`` for results stored before
    #: ``ConvergenceStats.error_unit``); None for other metrics.  Values in different units do not compare.
    unit: str | None = None


@dataclass(frozen=True)
class DeliveryInfo(_Record):
    """A recorded webhook delivery."""

    delivery_id: str
    event: str
    repository: str | None
    status: str
    reason: str | None
    run_id: int | None
    received_at: datetime


@dataclass(frozen=True)
class RevisionRow:
    """One revision to upsert with :meth:`service.db.Store.upsert_revisions` (None: keep the stored value)."""

    sha: str
    parents: tuple[str, ...] = ()
    branch: str | None = None
    author: str | None = None
    message: str | None = None
    committed_at: datetime | None = None

    def merged(self, later: RevisionRow) -> RevisionRow:
        """This row updated by ``later`` (same sha): its non-None fields and non-empty parents win."""
        return RevisionRow(self.sha, later.parents or self.parents, _newer(self.branch, later.branch),
                           _newer(self.author, later.author), _newer(self.message, later.message),
                           _newer(self.committed_at, later.committed_at))


def _newer(old: T | None, new: T | None) -> T | None:
    """``new`` unless it is None (then ``old``)."""
    return new if new is not None else old


@dataclass(frozen=True)
class RunSpec:
    """A run to create with :meth:`service.db.Store.create_runs` (the arguments of ``create_run``)."""

    revision_sha: str
    trigger: str
    baseline_sha: str | None = None
    sweep: str = "smoke"
    cells: tuple[Cell, ...] = ()
    dedup_key: str | None = None
    meta: JsonObject = field(default_factory=dict)
    dispatch: str | None = None  # "broker" | "local"; None: the Store's ``run_dispatch``
    status: str = "queued"  # or "awaiting_approval": stored without jobs until approved (Store.approve_run)


@dataclass(frozen=True)
class NewRun:
    """A run as :meth:`service.db.Store.create_runs` left it: its id, whether this call created it
    (False: its dedup key already had it) and its job rows (no further query needed to dispatch)."""

    run_id: int
    created: bool
    jobs: tuple[JobInfo, ...]
    status: str = "queued"  # the run's status when this call returned (a found run's as stored)
