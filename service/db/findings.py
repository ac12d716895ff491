"""What regression detection and confirmation write: a run's findings, and the state of one finding.

A finding is a ``regressions`` row; :func:`store_findings` makes a run's detected findings exactly the rows
given (re-detection keeps any state a human set), :func:`set_finding` moves one finding on (guarded by the state
it is expected in, so that two finishers deciding at once never undo each other).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from service.db import models as m
from service.db.engine import DialectInsert
from service.db.records import RegressionInfo
from service.db.result_queries import regression_info, regressions_query
from service.db.runs import dialect_insert
from service.regressions.detect import DETECTED_STATES
from service.regressions.stored import FindingRow, FindingUpdate

t_reg = m.Regression.__table__
#: What identifies a finding of a run (with ``run_id``: the table's unique key).
KEY_COLS = ("model", "dtype", "policy", "target", "kind", "category")
#: Up to this many findings, the stale ones are deleted by one statement naming the findings kept (6 bound
#: values each: far below PostgreSQL's 65,535 and SQLite's 32,766); a larger run selects its stale ids first.
DELETE_KEYS_MAX = 1000

_DELETE_STALE = t_reg.delete().where(  # the run's detected findings but those in ``keys``
    t_reg.c.run_id == sa.bindparam("run_id"), t_reg.c.state.in_(DETECTED_STATES),
    sa.tuple_(*(t_reg.c[k] for k in KEY_COLS)).not_in(sa.bindparam("keys", expanding=True)))
_FINDINGS = regressions_query().where(t_reg.c.run_id == sa.bindparam("run_id"))


def run_findings(conn: Connection, *, run_id: int) -> list[RegressionInfo]:
    """The findings of run ``run_id`` as :meth:`Store.regressions` lists them."""
    return [regression_info(r) for r in conn.execute(_FINDINGS, {"run_id": run_id})]


def store_findings(conn: Connection, *, run_id: int, rows: Sequence[FindingRow]) -> None:
    """Store ``rows`` (``regressions`` column values) as the findings of run ``run_id``: its detected findings
    (:data:`~service.regressions.detect.DETECTED_STATES`) not among them (by cell, kind and category) are
    deleted, the others inserted or updated, keeping the state, creation time and resolution already stored."""
    wanted = sorted({_key(r) for r in rows})
    if len(wanted) <= DELETE_KEYS_MAX:  # one statement, no select first
        conn.execute(_DELETE_STALE, {"run_id": run_id, "keys": wanted})
    else:
        kept = set(wanted)
        stale = [r.id for r in conn.execute(sa.select(t_reg.c.id, *(t_reg.c[k] for k in KEY_COLS))
                                            .where(t_reg.c.run_id == run_id, t_reg.c.state.in_(DETECTED_STATES)))
                 if tuple(r[1:]) not in kept]
        if stale:
            conn.execute(t_reg.delete().where(t_reg.c.id.in_(stale)))
    if not rows:
        return
    conn.execute(_upsert(conn), list(rows))


def _key(row: FindingRow) -> tuple[str, ...]:
    """The values of :data:`KEY_COLS` of ``row``, in that order."""
    return row["model"], row["dtype"], row["policy"], row["target"], row["kind"], row["category"]


_UPSERTS: dict[str, DialectInsert] = {}


def _upsert(conn: Connection) -> DialectInsert:
    """The findings' upsert for the connection's dialect: on a finding already stored (same run, cell, kind and
    category) its values are updated and its state, creation time and resolution kept.  Built once per dialect
    (``excluded`` copies every column of ``regressions`` when made)."""
    stmt = _UPSERTS.get(conn.dialect.name)
    if stmt is None:
        ins = dialect_insert(conn, t_reg)
        keep = {"run_id", *KEY_COLS, "state", "created_at"}
        stmt = _UPSERTS[conn.dialect.name] = ins.on_conflict_do_update(
            index_elements=[t_reg.c.run_id, *(t_reg.c[k] for k in KEY_COLS)],
            set_={c.name: ins.excluded[c.name] for c in t_reg.c if c.name not in keep and c.name != "id"
                  and not c.name.startswith("state") and c.name != "resolved_by_result_id"})
    return stmt


def set_finding(conn: Connection, *, finding_id: int, values: FindingUpdate, when_state: str | None = None) -> None:
    """Write ``values`` (``regressions`` columns) to finding ``finding_id``; with ``when_state``, only while the
    finding is in that state (nothing happens otherwise)."""
    q = t_reg.update().where(t_reg.c.id == finding_id)
    if when_state is not None:
        q = q.where(t_reg.c.state == when_state)
    conn.execute(q.values(**values))
