"""The pass's stderr tails of failed results (``JobResult.stderr_tail``, stored inside ``results.data``).

:func:`stderr_tails` reads only that field of the given results, a bounded number of ids per statement,
never the whole stored document; results without a tail (they passed, or were stored before tails were
recorded) are left out of the answer.
"""

from __future__ import annotations

from collections.abc import Iterable

import sqlalchemy as sa

from service.db import models as m
from service.db.store import Store

t_res = m.Result.__table__
#: Result ids per statement (a bounded IN list).
CHUNK = 500


def stderr_tails(store: Store, result_ids: Iterable[int]) -> dict[int, str]:
    """Result id -> its non-empty stderr tail, for the given ids."""
    ids = sorted(set(result_ids))
    out: dict[int, str] = {}
    tail = t_res.c.data["stderr_tail"].as_string()
    with store.transaction() as conn:
        for i in range(0, len(ids), CHUNK):
            for rid, text in conn.execute(sa.select(t_res.c.id, tail).where(t_res.c.id.in_(ids[i:i + CHUNK]))):
                if text:
                    out[int(rid)] = str(text)
    return out
