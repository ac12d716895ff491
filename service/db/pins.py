"""Pinned baselines (table ``baseline_pins``): the older reference drift detection judges a branch's runs against.

Small keyword-only functions over a connection, in the caller's transaction.  ``branch`` ``""`` is the pin of
every branch that has none of its own.  Guarantees: at most one pin per branch (pinning again replaces it);
a pin names a revision the store knows (the foreign key; a revision removed takes its pin with it).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from service.db import models as m
from service.db.runs import dialect_insert
from service.json_types import JsonObject

t_pin = m.BaselinePin.__table__


@dataclass(frozen=True)
class Pin:
    """A pinned baseline: ``branch`` (``""``: every branch), the revision ``sha``, when, and an optional note."""

    branch: str
    sha: str
    pinned_at: datetime
    note: str | None = None

    def to_dict(self) -> JsonObject:
        """JSON-ready fields."""
        return {"branch": self.branch, "sha": self.sha, "pinned_at": self.pinned_at.isoformat(), "note": self.note}


def pin(conn: Connection, *, branch: str, sha: str, now: datetime, note: str | None = None) -> Pin:
    """Pin ``sha`` as the baseline of ``branch`` (replacing its pin); returns it."""
    ins = dialect_insert(conn, t_pin)
    conn.execute(ins.on_conflict_do_update(index_elements=[t_pin.c.branch],
                                           set_={"sha": sha, "pinned_at": now, "note": note}),
                 {"branch": branch, "sha": sha, "pinned_at": now, "note": note})
    return Pin(branch, sha, now, note)


def unpin(conn: Connection, *, branch: str) -> bool:
    """Remove the pin of ``branch``; True when there was one."""
    return bool(conn.execute(t_pin.delete().where(t_pin.c.branch == branch)).rowcount)


def pins(conn: Connection) -> list[Pin]:
    """Every pin, by branch."""
    rows = conn.execute(sa.select(t_pin).order_by(t_pin.c.branch))
    return [Pin(r.branch, r.sha, r.pinned_at, r.note) for r in rows]


def pin_for(conn: Connection, *, branch: str | None) -> str | None:
    """The pinned revision that applies to ``branch``: its own pin, else the pin of every branch, else None."""
    rows = {r.branch: r.sha for r in conn.execute(sa.select(t_pin.c.branch, t_pin.c.sha)
                                                  .where(t_pin.c.branch.in_({branch or "", ""})))}
    return rows.get(branch or "") or rows.get("")


t_rev = m.Revision.__table__
#: The branch recorded for revision ``sha`` ('' when none, or an unknown revision), as a subquery.
_REV_BRANCH = sa.func.coalesce(sa.select(t_rev.c.branch).where(t_rev.c.sha == sa.bindparam("sha"))
                               .scalar_subquery(), "")
#: The pins that may apply to revision ``sha``'s branch (its own and every branch's), with that branch.
_PINS_OF_REVISION = sa.select(t_pin.c.branch, t_pin.c.sha, _REV_BRANCH.label("rev_branch")).where(
    t_pin.c.branch.in_([_REV_BRANCH, ""]))


def pin_for_revision(conn: Connection, *, sha: str) -> str | None:
    """:func:`pin_for` the branch recorded for revision ``sha`` (none, or an unknown revision: the pin of every
    branch), in one statement (the branch is a subquery: one round trip, not two, on each detection)."""
    rows = conn.execute(_PINS_OF_REVISION, {"sha": sha}).all()
    if not rows:
        return None
    by_branch = {r[0]: r[1] for r in rows}
    return by_branch.get(rows[0][2]) or by_branch.get("")
