"""Read endpoints: runs, a run with its cells, results, regressions, a cell's history, deliveries.

All answer JSON built from the Store's records (``to_dict()``); inputs are validated by FastAPI
(422 with a JSON error; integers are ASCII digits only, see :mod:`service.web.params`), unknown ids are 404, and read endpoints need the bearer token only when
``AMPCI_READ_TOKEN_REQUIRED`` is set.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Literal

from fastapi import APIRouter, Depends, Path, Query, Request

from service import vocabulary
from service.api.context import app_context
from service.db.store import Store
from service.json_types import JsonObject
from service.vocabulary import RUN_STATES, TRIGGERS
from service.web.auth import require_read
from service.web.errors import ApiError
from service.web.params import MAX_ID, StrictInt

router = APIRouter(prefix="/api", tags=["read"], dependencies=[Depends(require_read)])

Id = Annotated[int, StrictInt, Path(ge=1, le=MAX_ID)]
OptId = Annotated[int | None, StrictInt, Query(ge=1, le=MAX_ID)]
Rev = Annotated[str | None, Query(pattern=r"^[0-9a-fA-F]{4,64}$", description="sha or unique prefix")]
Name = Annotated[str | None, Query(min_length=1, max_length=200, pattern=r"^[\w.:+/-]+$")]
Limit = Annotated[int, StrictInt, Query(ge=1, le=5000)]
if TYPE_CHECKING:  # a Literal of a tuple's names is beyond mypy: to it each is the str it is
    Trigger = str
    RunState = str
else:  # the names of service.vocabulary, as FastAPI checks them
    Trigger = Literal[TRIGGERS]
    RunState = Literal[RUN_STATES]
RegState = Literal["open", "acknowledged", "resolved", "false_positive", "suspected", "dismissed", "suspected_resolved",
                   "explained"]  # service.db.result_queries.REG_STATES
Category = Literal["regression", "improvement", "flaky"]
Metric = Literal["cosine", "max_abs", "error_ratio", "latency_p50_ms", "speedup", "low_precision_fraction",
                 "casts_inserted", "final_error"]


def _store(request: Request) -> Store:
    return app_context(request).store


def check_filters(**values: str | None) -> None:
    """A 400 for a cell filter value the CLI refuses too (``dtype=fp8``, ``status=passs``): the same
    vocabularies and one-line messages as the CLI's (:mod:`service.vocabulary`), listing the choices,
    so a typo is an error instead of an empty ``200 []``."""
    def statuses() -> tuple[str, ...]:
        from workers.result import STATUSES

        return STATUSES

    checks = {"dtype": vocabulary.dtype_name, "policy": vocabulary.policy_name, "target": vocabulary.target_name,
              "status": vocabulary.one_of("status", statuses)}
    for name, raw in values.items():
        if raw is None:
            continue
        try:
            checks[name](raw)
        except vocabulary.UnknownNameError as exc:
            raise ApiError(400, f"{name}: {exc}") from None


@router.get("/runs", summary="Runs, newest first")
def list_runs(request: Request, limit: Limit = 50, revision: Rev = None, trigger: Trigger | None = None,
              status: RunState | None = None) -> JsonObject:
    runs = _store(request).list_runs(limit=limit, revision=revision, trigger=trigger, status=status)
    return {"runs": [r.to_dict() for r in runs]}


@router.get("/runs/{run_id}", summary="One run with its cells (jobs and results) and summary")
def get_run(request: Request, run_id: Id) -> JsonObject:
    store = _store(request)
    run = store.get_run(run_id)
    summary = store.run_summary(run_id)
    results = {r.cell: r.to_dict() for r in store.results(run_id=run_id)}
    cells = [{"job": j.to_dict(), "result": results.get(j.cell)} for j in store.jobs(run_id)]
    from service.orchestration.judge import run_verdict

    about = run.to_dict()
    about.pop("verdict", None)  # the brief the lists show: the one verdict of the run is "verdict" below
    return {"run": about, "summary": {**summary.to_dict(), "line": summary.describe()},
            # the stored verdict (state, headline, exit code, gate), a later resolution beside it
            "verdict": run_verdict(store, run_id).to_dict(),
            "cells": cells, "url": app_context(request).reporter.run_url(run_id)}


@router.get("/results", summary="Results filtered by run, revision and cell fields")
def list_results(request: Request, run_id: OptId = None, revision: Rev = None, model: Name = None,
                 dtype: Name = None, policy: Name = None, target: Name = None, status: Name = None,
                 latest_only: bool = True, limit: Limit = 1000) -> JsonObject:
    check_filters(dtype=dtype, policy=policy, target=target, status=status)
    rows = _store(request).results(run_id=run_id, revision=revision, model=model, dtype=dtype, policy=policy,
                                   target=target, status=status, latest_only=latest_only, limit=limit)
    return {"results": [r.to_dict() for r in rows]}


@router.get("/results/{result_id}", summary="The complete stored result of one job")
def get_result(request: Request, result_id: Id) -> JsonObject:
    return _store(request).get_result(result_id).to_dict()


@router.get("/regressions", summary="Regressions, improvements and flaky findings, newest first")
def list_regressions(request: Request, state: RegState | None = None, category: Category | None = None,
                     revision: Rev = None, run_id: OptId = None, since: datetime | None = None,
                     limit: Limit = 200) -> JsonObject:
    if since is not None and since.tzinfo is None:
        raise ApiError(422, "since: give a timezone (e.g. 2024-01-01T00:00:00Z)")
    rows = _store(request).regressions(state=state, since=since, revision=revision, run_id=run_id,
                                       category=category, limit=limit)
    return {"regressions": [r.to_dict() for r in rows]}


@router.get("/regressions/{regression_id}", summary="One finding")
def get_regression(request: Request, regression_id: Id) -> JsonObject:
    return _store(request).get_regression(regression_id).to_dict()


@router.get("/history", summary="A cell's metric over runs, oldest first")
def history(request: Request,
            model: Annotated[str, Query(min_length=1, max_length=200, pattern=r"^[\w.:+/-]+$")],
            dtype: Annotated[str, Query(min_length=1, max_length=200, pattern=r"^[\w.:+/-]+$")],
            policy: Name = None, target: Name = None, metric: Metric = "cosine",
            limit: Annotated[int, StrictInt, Query(ge=1, le=2000)] = 200) -> JsonObject:
    check_filters(dtype=dtype, policy=policy, target=target)
    points = _store(request).history(model, dtype, policy=policy, target=target, metric=metric, limit=limit)
    return {"model": model, "dtype": dtype, "metric": metric, "points": [p.to_dict() for p in points]}


DeliveryState = Literal["pending", "accepted", "rejected", "failed", "duplicate"]


@router.get("/deliveries", summary="Recorded webhook deliveries, newest first (rejected/failed carry the reason)")
def list_deliveries(request: Request, status: DeliveryState | None = None, limit: Limit = 100) -> JsonObject:
    return {"deliveries": [d.to_dict() for d in _store(request).list_deliveries(status=status, limit=limit)]}


@router.get("/deliveries/{delivery_id}", summary="A recorded webhook delivery")
def get_delivery(request: Request,
                 delivery_id: Annotated[str, Path(pattern=r"^[A-Za-z0-9._:-]{1,100}$")]) -> JsonObject:
    found = _store(request).get_delivery(delivery_id)
    if found is None:
        raise ApiError(404, f"no webhook delivery {delivery_id!r}")
    return found.to_dict()
