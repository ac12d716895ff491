"""The results store: SQLAlchemy models, Alembic-managed schema, and the :class:`Store` API.

    from service.db import Store
    store = Store.from_url(settings.effective_database_url)   # or Store.from_settings(settings)
    run_id = store.create_run(sha, "push", cells=[("resnet", "fp16", "default", "cpu")])
"""

from __future__ import annotations

from service.db.deliveries import DELIVERY_STATES
from service.db.records import (
    CompareRow,
    DeliveryInfo,
    HistoryPoint,
    JobInfo,
    RegressionInfo,
    ResultRow,
    RevisionInfo,
    RunInfo,
    RunSummary,
)
from service.db.store import Store
from service.vocabulary import JOB_STATES, RUN_STATES, TRIGGERS

__all__ = ["Store", "TRIGGERS", "RUN_STATES", "JOB_STATES", "DELIVERY_STATES", "CompareRow", "DeliveryInfo",
           "HistoryPoint", "JobInfo", "RegressionInfo", "ResultRow", "RevisionInfo", "RunInfo", "RunSummary"]
