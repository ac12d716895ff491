"""Each Celery queue is declared with a direct exchange and routing key of its own name: the worker banner
showed ``exchange=cpu key=cpu`` for every queue (Celery's defaults), and a message published to that
exchange and key would have reached every queue bound to it."""

from __future__ import annotations

import re

import pytest

from service.orchestration.celery_app import make_app
from service.settings import Settings


def test_every_queue_has_its_own_exchange_and_key():
    app = make_app(Settings(broker_url="redis://127.0.0.1:6379/0", extra_queues="cuda-a100"))
    queues = app.amqp.queues
    assert set(queues) == {"cpu", "cuda", "cuda-a100", "control"}
    for name, q in queues.items():
        assert (q.exchange.name, q.exchange.type, q.routing_key) == (name, "direct", name)
    banner = queues.format()
    for line in banner.splitlines():
        name, exchange, key = re.fullmatch(r"\.> (\S+)\s+exchange=(\S+)\(direct\) key=(\S+)", line).groups()
        assert name == exchange == key, line


@pytest.mark.redis
def test_a_message_for_one_queue_reaches_only_that_queue(redis_url: str, unique_prefix: str):
    import redis
    from kombu import Producer

    suffix = unique_prefix.rsplit("-", 1)[-1]
    mine = [f"cuda-h7{suffix}", f"cpu-h7{suffix}"]
    app = make_app(Settings(broker_url=redis_url, extra_queues=",".join(mine)))
    r = redis.Redis.from_url(redis_url)
    try:
        with app.connection_for_write() as conn:
            for name in mine:
                app.amqp.queues[name].bind(conn).declare()
            q = app.amqp.queues[mine[0]]
            assert q.exchange.name == mine[0]  # never publish to a shared exchange from a test
            Producer(conn).publish({"x": 1}, exchange=q.exchange, routing_key=q.routing_key, declare=[q])
        assert r.llen(mine[0]) == 1 and r.llen(mine[1]) == 0
        assert r.smembers(f"_kombu.binding.{mine[0]}") == {f"{mine[0]}\x06\x16\x06\x16{mine[0]}".encode()}
    finally:
        for name in mine:
            r.delete(name, f"_kombu.binding.{name}")
