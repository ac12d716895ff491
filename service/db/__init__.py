"""The results store: SQLAlchemy models, Alembic-managed schema, and the :class:`Store` API.

    from service.db import Store
    store = Store.from_url(settings.effective_database_url)   # or Store.from_settings(settings)
    run_id = store.create_run(sha, "push", cells=[("resnet", "fp16", "default", "cpu")])

The names below are loaded on first use (:func:`__getattr__`): importing a light submodule -- the plain
records (:mod:`service.db.records`) or the read-only queries of the CLI (:mod:`service.db.light`) -- does
not import SQLAlchemy through this package (issue 42: ``ampci runs`` stays light).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
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

#: where each exported name lives
_HOME = {"Store": "service.db.store", "DELIVERY_STATES": "service.db.deliveries",
         **dict.fromkeys(("TRIGGERS", "RUN_STATES", "JOB_STATES"), "service.vocabulary"),
         **dict.fromkeys(("CompareRow", "DeliveryInfo", "HistoryPoint", "JobInfo", "RegressionInfo", "ResultRow",
                          "RevisionInfo", "RunInfo", "RunSummary"), "service.db.records")}

__all__ = ["Store", "TRIGGERS", "RUN_STATES", "JOB_STATES", "DELIVERY_STATES", "CompareRow", "DeliveryInfo",
           "HistoryPoint", "JobInfo", "RegressionInfo", "ResultRow", "RevisionInfo", "RunInfo", "RunSummary"]


def __getattr__(name: str) -> object:
    """``service.db.NAME`` for a name of :data:`__all__`, imported from its module on first use."""
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'service.db' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value
