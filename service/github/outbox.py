"""Durable outbox of commit statuses (and PR report comments, check runs: any
:data:`~service.github.client.Report`) still to post, so a GitHub outage never loses a report.

Two implementations with one contract: :class:`RedisOutbox` (shared by the API process and the
workers; survives restarts) and :class:`MemoryOutbox` (embedded mode, one process).

Contract:
* ``put(status)`` stores the newest status for ``status.key`` (repo, sha, context); an older unsent
  status for that key is superseded, so GitHub never ends on a stale ``pending``.
* ``claim(now, limit, lease)`` hands out due items and hides them for ``lease`` seconds; an item
  whose claimer died reappears when the lease runs out (at-least-once delivery).
* ``complete(item, ok, next_due)`` removes a posted item, or reschedules a failed one with one more
  attempt; if the item was superseded while in flight the newer one is made due at once.
* ``defer(item, next_due)`` puts a claimed item back for later without counting an attempt (its
  credential is rate limited: nothing was sent);
* ``replace(item, report)`` puts ``report`` (same key) in place of a claimed item, due at once with no
  attempt counted, unless a newer report superseded the item while in flight (then that one is due at once
  and ``report`` is discarded): a refused report's shortened form never overwrites a newer report;
* ``drop(item, reason)`` gives up on an item and keeps it in a bounded dead list for inspection.
* ``watch(run_id)`` / ``watched()`` / ``unwatch(run_id)`` keep the ids of runs whose final status is
  still to be reported (the reporter checks them until they finish).
* ``mark_check(run_id, open)`` / ``open_checks()`` keep the ids of runs whose check run GitHub holds open
  (a ``queued`` or ``in_progress`` stage landed, no completion yet): the reporter's sweep completes those
  whose run ended (:meth:`service.github.reporter.StatusReporter.complete_open_checks`).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import Protocol

from service.github.report_items import Report, report_from_dict
from service.json_types import JsonObject

DEAD_KEEP = 1000


@dataclass(frozen=True)
class OutboxItem:
    """A claimed report (``status``: a commit status, PR comment or check run) with its version
    (``seq``) and how many posts already failed."""

    status: Report
    seq: int
    attempts: int


class StatusOutbox(Protocol):
    """See the module docstring for the contract."""

    def put(self, status: Report) -> None: ...
    def claim(self, now: float, limit: int, lease: float) -> list[OutboxItem]: ...
    def complete(self, item: OutboxItem, ok: bool, next_due: float) -> None: ...
    def defer(self, item: OutboxItem, next_due: float) -> None: ...
    def replace(self, item: OutboxItem, report: Report) -> bool: ...
    def drop(self, item: OutboxItem, reason: str) -> None: ...
    def pending_count(self) -> int: ...
    def dead(self) -> list[JsonObject]: ...
    def watch(self, run_id: int) -> None: ...
    def watched(self) -> list[int]: ...
    def unwatch(self, run_id: int) -> None: ...
    def mark_check(self, run_id: int, open: bool) -> None: ...
    def open_checks(self) -> list[int]: ...


class MemoryOutbox:
    """In-process outbox for embedded mode (thread-safe; lost with the process)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: dict[str, tuple[Report, int, int]] = {}  # key -> (status, seq, attempts)
        self._due: dict[str, float] = {}
        self._leased: set[str] = set()
        self._dead: list[JsonObject] = []
        self._watched: set[int] = set()
        self._open_checks: set[int] = set()

    def put(self, status: Report) -> None:
        with self._lock:
            old = self._items.get(status.key)
            self._items[status.key] = (status, (old[1] + 1) if old else 1, 0)
            if status.key not in self._leased:
                self._due[status.key] = time.time()

    def claim(self, now: float, limit: int, lease: float) -> list[OutboxItem]:
        with self._lock:
            keys = sorted((k for k, d in self._due.items() if d <= now), key=self._due.__getitem__)[:limit]
            out = []
            for k in keys:
                status, seq, attempts = self._items[k]
                self._due[k] = now + lease
                self._leased.add(k)
                out.append(OutboxItem(status, seq, attempts))
            return out

    def complete(self, item: OutboxItem, ok: bool, next_due: float) -> None:
        key = item.status.key
        with self._lock:
            self._leased.discard(key)
            cur = self._items.get(key)
            if cur is None:
                return
            if cur[1] != item.seq:
                self._due[key] = time.time()
            elif ok:
                del self._items[key]
                self._due.pop(key, None)
            else:
                self._items[key] = (cur[0], cur[1], cur[2] + 1)
                self._due[key] = next_due

    def defer(self, item: OutboxItem, next_due: float) -> None:
        key = item.status.key
        with self._lock:
            self._leased.discard(key)
            cur = self._items.get(key)
            if cur is not None:
                self._due[key] = time.time() if cur[1] != item.seq else next_due

    def replace(self, item: OutboxItem, report: Report) -> bool:
        """True when ``report`` took the item's place (the module docstring's contract)."""
        key = item.status.key
        assert report.key == key, "a replacement has the key of the report it replaces"
        with self._lock:
            self._leased.discard(key)
            cur = self._items.get(key)
            if cur is None:
                return False
            self._due[key] = time.time()
            if cur[1] != item.seq:
                return False
            self._items[key] = (report, cur[1] + 1, 0)
            return True

    def drop(self, item: OutboxItem, reason: str) -> None:
        key = item.status.key
        with self._lock:
            self._leased.discard(key)
            cur = self._items.get(key)
            if cur is not None and cur[1] == item.seq:
                del self._items[key]
                self._due.pop(key, None)
            elif cur is not None:
                self._due[key] = time.time()
            self._dead.append({**item.status.to_dict(), "reason": reason, "attempts": item.attempts})
            del self._dead[:-DEAD_KEEP]

    def pending_count(self) -> int:
        with self._lock:
            return len(self._items)

    def dead(self) -> list[JsonObject]:
        with self._lock:
            return list(self._dead)

    def watch(self, run_id: int) -> None:
        with self._lock:
            self._watched.add(int(run_id))

    def watched(self) -> list[int]:
        with self._lock:
            return sorted(self._watched)

    def unwatch(self, run_id: int) -> None:
        with self._lock:
            self._watched.discard(int(run_id))

    def mark_check(self, run_id: int, open: bool) -> None:
        with self._lock:
            if open:
                self._open_checks.add(int(run_id))
            else:
                self._open_checks.discard(int(run_id))

    def open_checks(self) -> list[int]:
        with self._lock:
            return sorted(self._open_checks)


_PUT = """
local cur = redis.call('HGET', KEYS[1], ARGV[1])
local seq = 1
if cur then seq = cjson.decode(cur)['seq'] + 1 end
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode({status=cjson.decode(ARGV[2]), seq=seq, attempts=0}))
if redis.call('HEXISTS', KEYS[3], ARGV[1]) == 0 then redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1]) end
return seq
"""

_CLAIM = """
local keys = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
local out = {}
for _, k in ipairs(keys) do
  local v = redis.call('HGET', KEYS[1], k)
  if v then
    redis.call('ZADD', KEYS[2], ARGV[3], k)
    redis.call('HSET', KEYS[3], k, ARGV[3])
    table.insert(out, v)
  else
    redis.call('ZREM', KEYS[2], k)
  end
end
return out
"""

# ARGV: key, seq, mode ("ok" | "retry" | "defer" | "drop"), next_due, now
_COMPLETE = """
redis.call('HDEL', KEYS[3], ARGV[1])
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if not cur then redis.call('ZREM', KEYS[2], ARGV[1]) return 0 end
local item = cjson.decode(cur)
if tostring(item['seq']) ~= ARGV[2] then
  redis.call('ZADD', KEYS[2], ARGV[5], ARGV[1])
  return 2
end
if ARGV[3] == 'retry' then
  item['attempts'] = item['attempts'] + 1
  redis.call('HSET', KEYS[1], ARGV[1], cjson.encode(item))
  redis.call('ZADD', KEYS[2], ARGV[4], ARGV[1])
elseif ARGV[3] == 'defer' then
  redis.call('ZADD', KEYS[2], ARGV[4], ARGV[1])
else
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('ZREM', KEYS[2], ARGV[1])
end
return 1
"""

# ARGV: key, seq, the replacement's JSON, now
_REPLACE = """
redis.call('HDEL', KEYS[3], ARGV[1])
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if not cur then redis.call('ZREM', KEYS[2], ARGV[1]) return 0 end
local item = cjson.decode(cur)
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[1])
if tostring(item['seq']) ~= ARGV[2] then return 2 end
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode({status=cjson.decode(ARGV[3]), seq=item['seq'] + 1, attempts=0}))
return 1
"""


class RedisOutbox:
    """Outbox in Redis under ``{prefix}:status:*``; safe for many processes."""

    def __init__(self, redis_url: str, prefix: str = "ampci") -> None:
        import redis

        self._r = redis.Redis.from_url(redis_url, socket_timeout=5, socket_connect_timeout=2)
        self._items = f"{prefix}:status:items"
        self._zset = f"{prefix}:status:due"
        self._leases = f"{prefix}:status:leases"
        self._dead_key = f"{prefix}:status:dead"
        self._watch_key = f"{prefix}:status:watched"
        self._open_key = f"{prefix}:status:open_checks"
        self._put = self._r.register_script(_PUT)
        self._claim = self._r.register_script(_CLAIM)
        self._complete = self._r.register_script(_COMPLETE)
        self._replace = self._r.register_script(_REPLACE)

    def _keys(self) -> list[str]:
        return [self._items, self._zset, self._leases]

    def put(self, status: Report) -> None:
        self._put(keys=self._keys(), args=[status.key, json.dumps(status.to_dict()), time.time()])

    def claim(self, now: float, limit: int, lease: float) -> list[OutboxItem]:
        raw = self._claim(keys=self._keys(), args=[now, limit, now + lease])
        out = []
        for v in raw:
            d = json.loads(v)
            out.append(OutboxItem(report_from_dict(d["status"]), int(d["seq"]), int(d["attempts"])))
        return out

    def complete(self, item: OutboxItem, ok: bool, next_due: float) -> None:
        self._complete(keys=self._keys(), args=[item.status.key, item.seq, "ok" if ok else "retry",
                                                next_due, time.time()])

    def defer(self, item: OutboxItem, next_due: float) -> None:
        self._complete(keys=self._keys(), args=[item.status.key, item.seq, "defer", next_due, time.time()])

    def replace(self, item: OutboxItem, report: Report) -> bool:
        """True when ``report`` took the item's place (the module docstring's contract)."""
        assert report.key == item.status.key, "a replacement has the key of the report it replaces"
        return int(self._replace(keys=self._keys(), args=[item.status.key, item.seq, json.dumps(report.to_dict()),
                                                          time.time()])) == 1

    def drop(self, item: OutboxItem, reason: str) -> None:
        self._complete(keys=self._keys(), args=[item.status.key, item.seq, "drop", 0, time.time()])
        entry = json.dumps({**item.status.to_dict(), "reason": reason, "attempts": item.attempts})
        pipe = self._r.pipeline()
        pipe.rpush(self._dead_key, entry)
        pipe.ltrim(self._dead_key, -DEAD_KEEP, -1)
        pipe.execute()

    def pending_count(self) -> int:
        return int(self._r.hlen(self._items))

    def dead(self) -> list[JsonObject]:
        return [json.loads(v) for v in self._r.lrange(self._dead_key, 0, -1)]

    def watch(self, run_id: int) -> None:
        self._r.sadd(self._watch_key, str(int(run_id)))

    def watched(self) -> list[int]:
        return sorted(int(x) for x in self._r.smembers(self._watch_key))

    def unwatch(self, run_id: int) -> None:
        self._r.srem(self._watch_key, str(int(run_id)))

    def mark_check(self, run_id: int, open: bool) -> None:
        if open:
            self._r.sadd(self._open_key, str(int(run_id)))
        else:
            self._r.srem(self._open_key, str(int(run_id)))

    def open_checks(self) -> list[int]:
        return sorted(int(x) for x in self._r.smembers(self._open_key))
