"""Read-side queries of revisions, ancestry, runs and jobs (mixed into :class:`service.db.store.Store`).

Used by the CLI, the HTTP API and the dashboard (results and findings: :mod:`service.db.result_queries`).
Each method reads in one short transaction.  Unknown revisions, runs, models and ids raise
``NotFoundError``; revisions may be given as unique sha prefixes (4+ hex digits).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Protocol

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from service.db import models as m
from service.db.engine import DbRow, DbSelect
from service.db.records import JobInfo, RevisionInfo, RunInfo, resolve_ref, revision_ref, utc
from service.db.result_queries import stored_model_names
from service.errors import NotFoundError
from service.json_types import JsonObject
from service.vocabulary import CellColumns

t_rev, t_par, t_run, t_job = m.Revision.__table__, m.RevisionParent.__table__, m.Run.__table__, m.Job.__table__
t_res = m.Result.__table__
#: The columns of ``runs`` a :class:`RunInfo` is built from: all but ``judgement`` (a run's whole verdict, read on
#: its own by :func:`service.db.verdicts.judgement`), so the lists of runs do not load every cell's outcome.
RUN_COLUMNS = tuple(c for c in t_run.c if c.name != "judgement")



def run_info(r: DbRow) -> RunInfo:
    """RunInfo from a runs row."""
    return RunInfo(id=r.id, revision_sha=r.revision_sha, baseline_sha=r.baseline_sha, trigger=r.trigger,
                   status=r.status, sweep=r.sweep, dedup_key=r.dedup_key, created_at=utc(r.created_at),
                   finished_at=utc(r.finished_at), meta=dict(r.meta or {}),
                   verdict=_verdict(r._mapping.get("verdict")))


def _verdict(value: object) -> JsonObject | None:
    """A stored ``runs.verdict`` as a dict (a driver may hand JSON back as text); None when absent."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return dict(value) if isinstance(value, dict) else None


class JobColumns(CellColumns, Protocol):
    """The columns of a ``jobs`` row, read by name: a SQLAlchemy row, or a psycopg named tuple of the same columns
    (:meth:`service.db.store.Store.begin_job`)."""

    @property
    def id(self) -> int: ...
    @property
    def run_id(self) -> int: ...
    @property
    def status(self) -> str: ...
    @property
    def attempts(self) -> int: ...
    @property
    def worker(self) -> str | None: ...
    @property
    def queued_at(self) -> datetime: ...
    @property
    def started_at(self) -> datetime | None: ...
    @property
    def finished_at(self) -> datetime | None: ...
    @property
    def error(self) -> str | None: ...


def job_info(r: JobColumns) -> JobInfo:
    """JobInfo from a jobs row."""
    return JobInfo(id=r.id, run_id=r.run_id, model=r.model, dtype=r.dtype, policy=r.policy, target=r.target,
                   status=r.status, attempts=r.attempts, worker=r.worker, queued_at=utc(r.queued_at),
                   started_at=utc(r.started_at), finished_at=utc(r.finished_at), error=r.error)



class QueriesMixin:
    """Query methods; requires ``self.transaction()`` and ``self.clock`` from Store."""

    engine: Engine
    clock: Callable[[], datetime]

    def transaction(self) -> AbstractContextManager[Connection]:  # pragma: no cover - provided by Store
        raise NotImplementedError

    # -- revisions --------------------------------------------------------------------------------
    def resolve_revision(self, ref: str) -> str:
        """The full sha of a known revision given as a sha or unique prefix (4+ hex digits).

        Unknown → NotFoundError; ambiguous or malformed → UserError naming the candidates.
        """
        ref = revision_ref(ref)
        with self.transaction() as conn:
            found = conn.execute(sa.select(t_rev.c.sha).where(t_rev.c.sha.like(ref + "%"))
                                 .order_by(t_rev.c.sha).limit(6)).scalars().all()
        return resolve_ref(ref, list(found))

    def get_revision(self, ref: str) -> RevisionInfo:
        """A revision by sha or unique prefix (NotFoundError if unknown)."""
        sha = self.resolve_revision(ref)
        with self.transaction() as conn:
            r = conn.execute(sa.select(t_rev).where(t_rev.c.sha == sha)).one()
        return RevisionInfo(sha=r.sha, parents=tuple(r.parents or ()), branch=r.branch, author=r.author,
                            message=r.message, committed_at=utc(r.committed_at))

    def ancestors(self, sha: str, max_depth: int = 1000, include_self: bool = False) -> list[tuple[str, int]]:
        """Ancestors of ``sha`` as (sha, depth) nearest first, following all parent links recorded."""
        with self.transaction() as conn:
            return ancestors(conn, sha, max_depth, include_self)

    def first_parent_path(self, head: str, stop: str, max_len: int = 10_000) -> list[str]:
        """Shas from ``head`` back along first parents until ``stop`` (both included), oldest first.

        NotFoundError when ``stop`` is not reached through recorded first-parent links.
        """
        path = [head]
        with self.transaction() as conn:
            cur = head
            while cur != stop and len(path) < max_len:
                nxt = conn.execute(sa.select(t_par.c.parent_sha).where(
                    t_par.c.child_sha == cur, t_par.c.position == 0)).scalar()
                if nxt is None:
                    raise NotFoundError(f"{stop[:12]} is not a recorded first-parent ancestor of {head[:12]}")
                path.append(nxt)
                cur = nxt
        if cur != stop:
            raise NotFoundError(f"{stop[:12]} not within {max_len} first-parent steps of {head[:12]}")
        return list(reversed(path))

    # -- runs and jobs ----------------------------------------------------------------------------
    def get_run(self, run_id: int) -> RunInfo:
        """A run by id (NotFoundError if unknown)."""
        with self.transaction() as conn:
            r = conn.execute(sa.select(*RUN_COLUMNS).where(t_run.c.id == run_id)).first()
        if r is None:
            raise NotFoundError(f"no run with id {run_id}")
        return run_info(r)

    def get_runs(self, run_ids: Iterable[int]) -> dict[int, RunInfo]:
        """The runs of ``run_ids`` that exist, by id, in one query (unknown ids are absent)."""
        ids = sorted({int(i) for i in run_ids})
        if not ids:
            return {}
        with self.transaction() as conn:
            rows = conn.execute(sa.select(*RUN_COLUMNS).where(t_run.c.id.in_(ids))).all()
        return {info.id: info for info in map(run_info, rows)}

    def find_run(self, dedup_key: str) -> RunInfo | None:
        """The run created with ``dedup_key``, or None."""
        with self.transaction() as conn:
            r = conn.execute(sa.select(*RUN_COLUMNS).where(t_run.c.dedup_key == dedup_key)).first()
        return run_info(r) if r is not None else None

    def sandbox_modes(self, run_id: int) -> list[str]:
        """How the pass ran in each result of run ``run_id`` (issue 31): its ``environment.sandbox`` --
        ``full``, ``best-effort``, or ``""`` for a result from before the sandbox."""
        q = sa.select(t_res.c.data[("environment", "sandbox")].as_string()).where(t_res.c.run_id == int(run_id))
        with self.transaction() as conn:
            return [str(v or "") for (v,) in conn.execute(q)]

    def newest_pull_request_run(self, *, repo: str, pr: int, head_sha: str | None = None) -> RunInfo | None:
        """The newest (highest id) ``pull_request`` run of pull request ``pr`` of ``repo`` (its
        ``meta.github``; the repository compared case-insensitively), only of ``head_sha`` when given;
        None when there is none."""
        q = (sa.select(*RUN_COLUMNS).where(t_run.c.trigger == "pull_request",
                                    t_run.c.meta[("github", "pr")].as_integer() == int(pr),
                                    sa.func.lower(t_run.c.meta[("github", "repo")].as_string()) == repo.lower())
             .order_by(t_run.c.id.desc()).limit(1))
        if head_sha is not None:
            q = q.where(t_run.c.revision_sha == head_sha.lower())
        with self.transaction() as conn:
            r = conn.execute(q).first()
        return run_info(r) if r is not None else None

    def pull_request_runs(self, *, repo: str, pr: int, limit: int = 200) -> list[RunInfo]:
        """The ``pull_request`` runs of pull request ``pr`` of ``repo`` (compared case-insensitively), newest
        (highest id) first, at most ``limit``."""
        q = (sa.select(*RUN_COLUMNS).where(t_run.c.trigger == "pull_request",
                                            t_run.c.meta[("github", "pr")].as_integer() == int(pr),
                                            sa.func.lower(t_run.c.meta[("github", "repo")].as_string()) == repo.lower())
             .order_by(t_run.c.id.desc()).limit(limit))
        with self.transaction() as conn:
            return [run_info(r) for r in conn.execute(q)]

    def recorded_pass_repo(self, repo: str) -> dict[str, object] | None:
        """The ``meta.pass_repo`` entry (``{"url", "repo", "installation"}``: the clone URL an allow-listed webhook
        delivery of ``repo`` named, no credential) of the newest run that tests repository ``repo``
        (``owner/name``, compared case-insensitively); None when no run names it."""
        q = (sa.select(t_run.c.meta).where(sa.func.lower(t_run.c.meta[("pass_repo", "repo")].as_string()) == repo.lower(),
                                           t_run.c.meta[("pass_repo", "url")].as_string().is_not(None))
             .order_by(t_run.c.id.desc()).limit(1))
        with self.transaction() as conn:
            meta = conn.execute(q).scalar()
        source = meta.get("pass_repo") if isinstance(meta, dict) else None
        return dict(source) if isinstance(source, dict) else None

    def pushed_head(self, repo: str, branch: str, sha: str) -> bool:
        """Whether a ``push`` run of commit ``sha`` on ``branch`` of repository ``repo`` (``owner/name``, compared
        case-insensitively) exists: a head ampci was sent as pushed to that branch by a signed delivery."""
        q = (sa.select(t_run.c.id).where(
            t_run.c.trigger == "push", t_run.c.revision_sha == sha,
            sa.func.lower(t_run.c.meta[("github", "repo")].as_string()) == repo.lower(),
            t_run.c.meta[("github", "branch")].as_string() == branch).limit(1))
        with self.transaction() as conn:
            return conn.execute(q).first() is not None

    def model_names(self, limit: int = 10_000) -> list[str]:
        """The distinct model names of stored jobs and results (at most ``limit`` of each), sorted."""
        with self.transaction() as conn:
            return stored_model_names(conn, limit)

    def list_runs(self, limit: int = 50, revision: str | None = None, trigger: str | None = None,
                  status: str | None = None) -> list[RunInfo]:
        """Runs newest first, optionally for one revision / trigger / status."""
        q = sa.select(*RUN_COLUMNS).order_by(t_run.c.created_at.desc(), t_run.c.id.desc()).limit(limit)
        if revision:
            q = q.where(t_run.c.revision_sha == self.resolve_revision(revision))
        if trigger:
            q = q.where(t_run.c.trigger == trigger)
        if status:
            q = q.where(t_run.c.status == status)
        with self.transaction() as conn:
            return [run_info(r) for r in conn.execute(q)]

    def jobs(self, run_id: int) -> list[JobInfo]:
        """The run's jobs ordered by cell (NotFoundError if the run is unknown)."""
        with self.transaction() as conn:
            rows = conn.execute(sa.select(t_job).where(t_job.c.run_id == run_id).order_by(
                t_job.c.model, t_job.c.dtype, t_job.c.policy, t_job.c.target)).all()
            if not rows and conn.execute(sa.select(t_run.c.id).where(t_run.c.id == run_id)).first() is None:
                raise NotFoundError(f"no run with id {run_id}")
        return [job_info(r) for r in rows]

    def get_job(self, job_id: int) -> JobInfo:
        """A job by id (NotFoundError if unknown)."""
        with self.transaction() as conn:
            r = conn.execute(sa.select(t_job).where(t_job.c.id == job_id)).first()
        if r is None:
            raise NotFoundError(f"no job with id {job_id}")
        return job_info(r)



def _ancestors_query() -> DbSelect:
    """The recursive ancestry walk with bound ``sha`` and ``max_depth`` (built once: :data:`_ANCESTORS`)."""
    anc = (sa.select(t_par.c.parent_sha.label("sha"), sa.literal(1).label("depth"))
           .where(t_par.c.child_sha == sa.bindparam("sha")).cte("anc", recursive=True))
    step = (sa.select(t_par.c.parent_sha, (anc.c.depth + 1))
            .join(anc, t_par.c.child_sha == anc.c.sha).where(anc.c.depth < sa.bindparam("max_depth")))
    anc = anc.union(step)
    return sa.select(anc.c.sha, sa.func.min(anc.c.depth).label("d")).group_by(anc.c.sha).order_by("d", anc.c.sha)


#: One statement object for every walk: its cache key is worked out once, not on each call.
_ANCESTORS = _ancestors_query()


def _first_parents_query() -> DbSelect:
    """The recursive first-parent walk with bound ``sha`` and ``max_depth`` (built once).

    Each step is a scalar subquery on the parents' key (child, position 0), not a join: PostgreSQL planned the
    join as a hash of the whole ``revision_parents`` table on every step of a small history (13 ms for a 200-deep
    line at 200 revisions), where the subquery stops at the one row it wants (2 ms).  The walk ends one step
    after the root (a NULL parent), which the outer query drops."""
    p = t_par.alias("p")
    line = (sa.select(t_par.c.parent_sha.label("sha"), sa.literal(1).label("depth"))
            .where(t_par.c.child_sha == sa.bindparam("sha"), t_par.c.position == 0).cte("line", recursive=True))
    parent = sa.select(p.c.parent_sha).where(p.c.child_sha == line.c.sha, p.c.position == 0).scalar_subquery()
    step = sa.select(parent, line.c.depth + 1).where(line.c.depth < sa.bindparam("max_depth"), line.c.sha.is_not(None))
    line = line.union_all(step)
    return sa.select(line.c.sha, line.c.depth).where(line.c.sha.is_not(None)).order_by(line.c.depth)


_FIRST_PARENTS = _first_parents_query()


def first_parent_line(conn: Connection, sha: str, max_depth: int) -> list[tuple[str, int]]:
    """(sha, depth) of ``sha`` (depth 0) and its first-parent ancestors up to ``max_depth``, nearest first (one
    recursive query)."""
    rows = conn.execute(_FIRST_PARENTS, {"sha": sha, "max_depth": max_depth}).all()
    return [(sha, 0), *((r.sha, int(r.depth)) for r in rows)]


def ancestors(conn: Connection, sha: str, max_depth: int = 1000, include_self: bool = False) -> list[tuple[str, int]]:
    """(sha, depth) of the ancestors of ``sha`` nearest first (one recursive query; depth-bounded)."""
    rows = conn.execute(_ANCESTORS, {"sha": sha, "max_depth": max_depth}).all()
    out = [(r.sha, int(r.d)) for r in rows if r.sha != sha]
    return [(sha, 0), *out] if include_self else out
