#!/usr/bin/env python3
"""Loopback load test of ``POST /webhooks/github``: signed deliveries, duplicates, bad signatures,
unsigned oversize requests and replays.

    python bench/bench_webhook.py                      # 2,000 deliveries, concurrency 32
    python bench/bench_webhook.py -n 500 -c 16
    python bench/bench_webhook.py --quick              # 200 deliveries: seconds; exit 1 if an invariant fails

The mix: valid pushes, duplicates (same delivery id), bad signatures, **unsigned oversize** requests
(headers announcing a body over ``AMPCI_MAX_BODY_BYTES`` and no signature; the body is never sent:
each must be answered 401 and store nothing) and **replays** (a valid signed body under a new
delivery id: it must lead to the run of its original, never a second run).  Beside the latency
table it prints the rows stored for unsigned requests (must be 0).

It creates a fresh PostgreSQL database (``AMPCI_TEST_DATABASE_URL`` admin URL, as the tests), starts
``ampci``'s app under uvicorn in a subprocess on a free loopback port (real Store, real Redis broker,
jobs sent to a queue of this benchmark only), sends the deliveries with an asyncio HTTP client, then
checks against the database and the queue that every valid delivery created exactly one run, that
no duplicate created another and no badly signed one was accepted, and prints a table with the
response-time percentiles (target: p99 under 100 ms).  The handler only stores a pending delivery;
the benchmark waits until the server's intake has turned every one into its run (the table shows
how many were pending at the last answer, how long the drain took, and the CPU including it).  Everything it created is removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from service.github.signature import sign  # noqa: E402

ADMIN_URL = os.environ.get("AMPCI_TEST_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("AMPCI_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
SECRET = "bench-webhook-secret"
REPO = "bench/amp-pass"
CELLS = (("mlp_small", "fp16"), ("mlp_small", "bf16"), ("conv_small", "fp16"), ("conv_small", "bf16"))


# -- the server side --------------------------------------------------------------------------------
def bench_app() -> Any:
    """The app under test (real Store and broker; sweep cells routed to the benchmark's queue).

    Configured by ``BENCH_DATABASE_URL``, ``BENCH_BROKER_URL`` and ``BENCH_QUEUE`` so that uvicorn
    worker processes can build it (``factory=True``).
    """
    from service.api.app import create_app
    from service.api.dispatch import RunDispatcher
    from service.db import Store
    from service.github.outbox import RedisOutbox
    from service.github.reporter import StatusReporter
    from service.orchestration.scheduler import SweepConfig
    from service.settings import Settings

    database_url, broker_url = os.environ["BENCH_DATABASE_URL"], os.environ["BENCH_BROKER_URL"]
    queue = os.environ["BENCH_QUEUE"]
    settings = Settings(database_url=database_url, broker_url=broker_url, webhook_secret=SECRET,
                        allowed_repos=REPO, api_token="bench", log_level="WARNING",
                        baseline_runs=False)  # the intake's cost alone: one run per delivery
    config = SweepConfig.from_dict({"name": "smoke", "models": sorted({m for m, _ in CELLS}),
                                    "dtypes": ["fp16", "bf16"], "policies": ["default"], "targets": [queue]})
    cells = config.expand({m: ["smoke"] for m, _ in CELLS})
    store = Store.from_url(database_url)
    reporter = StatusReporter(RedisOutbox(broker_url, prefix=queue), None, public_url=settings.public_url)
    return create_app(settings, store=store, reporter=reporter,
                      dispatcher=RunDispatcher(settings, store, planner=lambda sweep: cells))


def serve(port: int, database_url: str, broker_url: str, queue: str, workers: int = 1) -> None:
    """Run :func:`bench_app` under uvicorn until terminated."""
    import uvicorn

    os.environ.update(BENCH_DATABASE_URL=database_url, BENCH_BROKER_URL=broker_url, BENCH_QUEUE=queue)
    # A long keep-alive: under load the event loop may otherwise time out a connection whose next
    # request is already in its socket buffer (the client sees a reset).
    uvicorn.run("bench.bench_webhook:bench_app", factory=True, host="127.0.0.1", port=port, workers=workers,
                log_level="warning", access_log=False, timeout_keep_alive=60)


# -- the client side --------------------------------------------------------------------------------
@dataclass
class Delivery:
    """One HTTP request to send; ``kind`` is valid, duplicate, bad_signature, unsigned_oversize or replay
    (``original``: the delivery id whose body a replay or duplicate repeats)."""

    kind: str
    delivery_id: str
    body: bytes
    signature: str
    status: int = 0
    answer: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    original: str = ""


#: the body size an unsigned oversize request announces (over the server's 1 MiB default limit)
OVERSIZE = 50 * 1024 * 1024


def make_deliveries(n: int, dup_fraction: float = 0.1, bad_fraction: float = 0.1, seed: int = 0,
                    unsigned_fraction: float = 0.05, replay_fraction: float = 0.05) -> list[Delivery]:
    """``n`` deliveries: unique valid pushes, copies of some of them (sent close to the original, so
    some race it), pushes signed with the wrong secret, unsigned oversize requests (no body sent) and
    replays of valid bodies under new delivery ids.  Shuffled deterministically."""
    rng = random.Random(seed)
    n_dup, n_bad = int(n * dup_fraction), int(n * bad_fraction)
    n_unsigned, n_replay = int(n * unsigned_fraction), int(n * replay_fraction)
    n_valid = n - n_dup - n_bad - n_unsigned - n_replay
    valid: list[Delivery] = []
    for i in range(n_valid):
        head = uuid.UUID(int=rng.getrandbits(128)).hex + f"{i:08x}"
        before = uuid.UUID(int=rng.getrandbits(128)).hex + "00000000"
        body = json.dumps({"ref": "refs/heads/main", "before": before, "after": head,
                           "repository": {"full_name": REPO},
                           "commits": [{"id": head, "message": f"bench commit {i}", "timestamp": "2026-11-28T10:00:00Z",
                                        "author": {"name": "Bench", "email": "bench@example.com"}}],
                           "head_commit": {"id": head, "message": f"bench commit {i}"}}).encode()
        valid.append(Delivery("valid", str(uuid.UUID(int=rng.getrandbits(128))), body, sign(SECRET, body)))
    out: list[Delivery | tuple[int, Delivery]] = list(valid)
    for _ in range(n_dup):
        orig = rng.choice(valid)
        out.append(Delivery("duplicate", orig.delivery_id, orig.body, orig.signature, original=orig.delivery_id))
    for _ in range(n_replay):
        orig = rng.choice(valid)
        out.append(Delivery("replay", str(uuid.UUID(int=rng.getrandbits(128))), orig.body, orig.signature,
                            original=orig.delivery_id))
    for _ in range(n_unsigned):
        out.append(Delivery("unsigned_oversize", str(uuid.UUID(int=rng.getrandbits(128))), b"", ""))
    for i in range(n_bad):
        body = valid[i % len(valid)].body.replace(b"bench commit", b"forged commit")
        out.append(Delivery("bad_signature", str(uuid.UUID(int=rng.getrandbits(128))), body, sign("wrong", body)))
    rng.shuffle(out)
    return out  # type: ignore[return-value]


async def send_all(base_url: str, deliveries: list[Delivery], concurrency: int, client: str = "raw") -> float:
    """Send every delivery with at most ``concurrency`` in flight; return the wall time.

    ``client="raw"`` (default) speaks HTTP/1.1 keep-alive over plain asyncio streams, one connection
    per concurrent sender: it needs ~0.1 ms of CPU per request, so on a small machine the client
    does not steal the server's CPU.  ``client="httpx"`` is the httpx.AsyncClient this benchmark
    used first (several ms of CPU per request here: it dominated what was measured).
    """
    if client == "httpx":
        return await _send_all_httpx(base_url, deliveries, concurrency)
    host, port = base_url.removeprefix("http://").split(":")
    queue: asyncio.Queue[Delivery] = asyncio.Queue()
    for d in deliveries:
        queue.put_nowait(d)

    async def worker() -> None:
        conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        while True:
            try:
                d = queue.get_nowait()
            except asyncio.QueueEmpty:
                break
            if d.kind == "unsigned_oversize":
                await _send_unsigned_oversize(host, int(port), d)
                continue
            head = (f"POST /webhooks/github HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                    f"X-GitHub-Event: push\r\nX-GitHub-Delivery: {d.delivery_id}\r\n"
                    f"X-Hub-Signature-256: {d.signature}\r\nContent-Length: {len(d.body)}\r\n\r\n").encode()
            t0 = time.perf_counter()
            try:
                if conn is None:
                    conn = await asyncio.open_connection(host, int(port))
                reader, writer = conn
                writer.write(head + d.body)
                status, body, close = await _read_response(reader)
            except (OSError, asyncio.IncompleteReadError, ValueError) as exc:  # a failure of the service
                d.seconds = time.perf_counter() - t0
                d.status, d.answer = -1, {"error": f"{type(exc).__name__}: {exc}"}
                conn = _close(conn)
                continue
            d.seconds = time.perf_counter() - t0
            d.status, d.answer = status, json.loads(body) if body else {}
            if close:
                conn = _close(conn)
        _close(conn)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - t0


async def _send_unsigned_oversize(host: str, port: int, d: Delivery) -> None:
    """Headers announcing an OVERSIZE body without a signature, on a connection of its own; the body
    is never sent (the answer must come from the headers alone), then the connection is closed."""
    head = (f"POST /webhooks/github HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"X-GitHub-Event: push\r\nX-GitHub-Delivery: {d.delivery_id}\r\n"
            f"Content-Length: {OVERSIZE}\r\n\r\n").encode()
    t0 = time.perf_counter()
    writer = None
    try:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(head)
        status, body, _ = await asyncio.wait_for(_read_response(reader), 10)
        d.status, d.answer = status, json.loads(body) if body else {}
    except (OSError, asyncio.IncompleteReadError, ValueError, TimeoutError) as exc:
        d.status, d.answer = -1, {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        d.seconds = time.perf_counter() - t0
        if writer is not None:
            writer.close()


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
    """(status, body, server closes) of one HTTP/1.1 response with a Content-Length."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return status, body, headers.get("connection", "").lower() == "close"


def _close(conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None) -> None:
    if conn is not None:
        conn[1].close()
    return None


async def _send_all_httpx(base_url: str, deliveries: list[Delivery], concurrency: int) -> float:
    import httpx

    queue: asyncio.Queue[Delivery] = asyncio.Queue()
    for d in deliveries:
        queue.put_nowait(d)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=30.0) as client:
        async def worker() -> None:
            while True:
                try:
                    d = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                if d.kind == "unsigned_oversize":
                    host, port = base_url.removeprefix("http://").split(":")
                    await _send_unsigned_oversize(host, int(port), d)
                    continue
                headers = {"Content-Type": "application/json", "X-GitHub-Event": "push",
                           "X-GitHub-Delivery": d.delivery_id, "X-Hub-Signature-256": d.signature}
                t0 = time.perf_counter()
                try:
                    resp = await client.post("/webhooks/github", content=d.body, headers=headers)
                except httpx.HTTPError as exc:  # counted as a failure of the service, not hidden
                    d.seconds = time.perf_counter() - t0
                    d.status, d.answer = -1, {"error": f"{type(exc).__name__}: {exc}"}
                    continue
                d.seconds = time.perf_counter() - t0
                d.status = resp.status_code
                d.answer = resp.json()

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - t0


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100])."""
    s = sorted(values)
    k = max(0, min(len(s) - 1, int(round(q / 100 * len(s) + 0.5)) - 1))
    return s[k]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(database_url: str, broker_url: str, queue: str, log: Path,
                 workers: int = 1) -> tuple[subprocess.Popen[bytes], str]:
    """Start :func:`serve` in a subprocess; return it and its base URL once /healthz answers 200."""
    import httpx

    port = free_port()
    with open(log, "wb") as fh:
        proc = subprocess.Popen([sys.executable, __file__, "--serve", "--port", str(port), "--database-url",
                                 database_url, "--broker-url", broker_url, "--queue", queue,
                                 "--workers", str(workers)],
                                stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            if httpx.get(base + "/healthz", timeout=1.0).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    stop_server(proc)
    raise RuntimeError(f"server did not become healthy: {log.read_text()[-2000:]}")


def server_cpu_seconds(proc: subprocess.Popen[bytes]) -> float:
    """CPU seconds used so far by the server process and its worker processes."""
    import psutil

    total = 0.0
    try:
        root = psutil.Process(proc.pid)
        for p in [root, *root.children(recursive=True)]:
            t = p.cpu_times()
            total += t.user + t.system
    except psutil.Error:
        pass
    return total


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    """Terminate the server subprocess by its pid (kill after 10 s)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@dataclass
class LoadReport:
    """What was sent, what came back, and what the database and queue hold afterwards."""

    deliveries: list[Delivery]
    wall_seconds: float
    runs: int
    run_of: dict[str, int | None]   # delivery id -> the run its stored row leads to (None: no run)
    accepted_deliveries: int
    queued_messages: int
    cells_per_run: int
    server_cpu: float = 0.0
    workers: int = 1
    pending_after_burst: int = 0   # deliveries answered but not yet turned into runs when the last answer came
    drain_seconds: float = 0.0     # from the last answer until no delivery was pending
    total_cpu: float = 0.0         # server CPU including the intake's work after the burst
    pending_left: int = 0          # still pending when the drain wait gave up (a problem)
    client_cpu: float = 0.0        # CPU of this (client) process while sending: it shares the machine
    unsigned_rows: int = 0         # rows stored for unsigned requests (must be 0)

    def by_kind(self, kind: str) -> list[Delivery]:
        return [d for d in self.deliveries if d.kind == kind]

    def problems(self) -> list[str]:
        """Every violated invariant, as a sentence (empty: all good)."""
        out = []
        if self.pending_left:
            out.append(f"{self.pending_left} deliveries still pending after the drain wait")
        ids = {d.delivery_id for d in self.by_kind("valid")}
        valid_runs = [self.run_of.get(d) for d in ids]
        if None in valid_runs:
            out.append(f"{valid_runs.count(None)} valid deliveries without a run")
        if len(set(valid_runs)) != len(valid_runs):
            out.append(f"{len(valid_runs) - len(set(valid_runs))} valid deliveries share a run")
        if self.runs != len(ids):
            out.append(f"runs {self.runs} != valid deliveries {len(ids)}")
        replays = self.by_kind("replay")
        strays = [d for d in replays if self.run_of.get(d.delivery_id) != self.run_of.get(d.original)]
        if strays:
            out.append(f"{len(strays)} replays not led to their original's run")
        expected_accepted = len(ids) + len({d.delivery_id for d in replays})
        if self.accepted_deliveries != expected_accepted:
            out.append(f"{self.accepted_deliveries} accepted deliveries recorded, expected {expected_accepted}")
        if self.unsigned_rows:
            out.append(f"{self.unsigned_rows} rows stored for unsigned requests")
        unsigned = [d for d in self.by_kind("unsigned_oversize") if d.status != 401]
        if unsigned:
            out.append(f"{len(unsigned)} unsigned oversize requests not answered 401: {unsigned[0].answer}")
        if self.queued_messages != len(ids) * self.cells_per_run:
            out.append(f"{self.queued_messages} job messages, expected {len(ids) * self.cells_per_run}")
        bad = [d for d in self.by_kind("bad_signature") if d.status != 401]
        if bad:
            out.append(f"{len(bad)} badly signed deliveries not answered 401")
        answered_202: dict[str, int] = {}
        for d in self.deliveries:
            if d.kind not in ("bad_signature", "unsigned_oversize"):
                if d.status not in (200, 202):
                    out.append(f"delivery {d.delivery_id} ({d.kind}) answered {d.status}: {d.answer}")
                answered_202[d.delivery_id] = answered_202.get(d.delivery_id, 0) + (d.status == 202)
        if any(n != 1 for n in answered_202.values()):
            out.append("some delivery id was not queued exactly once")
        return out

    def table(self) -> str:
        lat = [d.seconds * 1000 for d in self.deliveries]
        rows = [("deliveries", f"{len(self.deliveries)}"),
                ("  valid / duplicate / bad signature",
                 f"{len(self.by_kind('valid'))} / {len(self.by_kind('duplicate'))} / {len(self.by_kind('bad_signature'))}"),
                ("  unsigned oversize / replay",
                 f"{len(self.by_kind('unsigned_oversize'))} / {len(self.by_kind('replay'))}"),
                ("answers 202 / 200 / 401 / other",
                 " / ".join(str(sum(d.status == c for d in self.deliveries)) for c in (202, 200, 401))
                 + f" / {sum(d.status not in (200, 202, 401) for d in self.deliveries)}"),
                ("runs created", f"{self.runs}"), ("job messages queued", f"{self.queued_messages}"),
                ("rows stored for unsigned requests", f"{self.unsigned_rows}  (must be 0)"),
                ("throughput", f"{len(self.deliveries) / self.wall_seconds:.0f} req/s"),
                ("server CPU per delivery", f"{self.server_cpu / len(self.deliveries) * 1000:.1f} ms "
                                            f"({self.workers} uvicorn worker{'s' if self.workers > 1 else ''})"),
                ("  incl. intake after the burst", f"{self.total_cpu / len(self.deliveries) * 1000:.1f} ms"),
                ("client CPU per delivery", f"{self.client_cpu / len(self.deliveries) * 1000:.1f} ms"),
                ("pending at last answer / drained in", f"{self.pending_after_burst} / {self.drain_seconds:.1f} s"),
                ("latency p50", f"{percentile(lat, 50):.1f} ms"), ("latency p90", f"{percentile(lat, 90):.1f} ms"),
                ("latency p99", f"{percentile(lat, 99):.1f} ms  (target < 100 ms)"),
                ("latency max", f"{max(lat):.1f} ms"),
                ("invariants", "ok" if not self.problems() else "; ".join(self.problems()))]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def run_load(database_url: str, broker_url: str, queue: str, n: int, concurrency: int, log: Path,
             seed: int = 0, workers: int = 1, drain_timeout: float = 120.0, client: str = "raw") -> LoadReport:
    """Start a server, send ``n`` deliveries, wait (at most ``drain_timeout`` s) until the webhook
    intake has turned every pending delivery into its run, stop the server, and collect what the
    store and queue hold."""
    import redis
    import sqlalchemy as sa

    deliveries = make_deliveries(n, seed=seed)
    engine = sa.create_engine(database_url)
    proc, base = start_server(database_url, broker_url, queue, log, workers)
    try:
        cpu0, client0 = server_cpu_seconds(proc), time.process_time()
        wall = asyncio.run(send_all(base, deliveries, concurrency, client))
        cpu, client_cpu = server_cpu_seconds(proc) - cpu0, time.process_time() - client0
        pending_after = pending = _pending(engine)
        t0 = time.perf_counter()
        while pending and time.perf_counter() - t0 < drain_timeout:  # the intake works off the request path
            time.sleep(0.05)
            pending = _pending(engine)
        drain = time.perf_counter() - t0
        total_cpu = server_cpu_seconds(proc) - cpu0
    finally:
        stop_server(proc)
    unsigned_ids = [d.delivery_id for d in deliveries if d.kind == "unsigned_oversize"]
    with engine.connect() as conn:
        runs = int(conn.execute(sa.text("SELECT count(*) FROM runs")).scalar() or 0)
        run_of = dict(conn.execute(sa.text("SELECT delivery_id, run_id FROM webhook_deliveries")).all())
        accepted = conn.execute(sa.text("SELECT count(*) FROM webhook_deliveries WHERE status = 'accepted'")).scalar()
    engine.dispose()
    queued = int(redis.Redis.from_url(broker_url).llen(queue))
    return LoadReport(deliveries, wall, runs, run_of, int(accepted or 0), queued, len(CELLS), cpu, workers,
                      pending_after_burst=pending_after, drain_seconds=drain, total_cpu=total_cpu,
                      pending_left=pending, client_cpu=client_cpu,
                      unsigned_rows=sum(d in run_of for d in unsigned_ids))


def _pending(engine: Any) -> int:
    """Deliveries stored but not yet turned into runs (0 before the intake existed: no such status)."""
    import sqlalchemy as sa

    with engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM webhook_deliveries WHERE status = 'pending'"))
                   .scalar() or 0)


def _fresh_database() -> str:
    from service.db.admin import create_database

    return create_database(ADMIN_URL, "ampci_bench")


def _drop_database(url: str) -> None:
    from service.db.admin import drop_database

    drop_database(ADMIN_URL, url)


def _drop_redis_keys(broker_url: str, queue: str) -> None:
    import redis

    r = redis.Redis.from_url(broker_url)
    for key in r.scan_iter(f"*{queue}*"):
        r.delete(key)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=2000, help="deliveries (default 2000)")
    parser.add_argument("-c", "--concurrency", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("-w", "--workers", type=int, default=1, help="uvicorn worker processes (default 1)")
    parser.add_argument("--quick", action="store_true",
                        help="200 deliveries at concurrency 8 (seconds); exit 1 when an invariant fails")
    parser.add_argument("--client", choices=("raw", "httpx"), default="raw",
                        help="HTTP client: raw asyncio streams (default, ~0.1 ms CPU per request) or httpx")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--database-url", help=argparse.SUPPRESS)
    parser.add_argument("--broker-url", default=REDIS_URL, help=argparse.SUPPRESS)
    parser.add_argument("--queue", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.port, args.database_url, args.broker_url, args.queue, args.workers)
        return 0
    from service.db.migrate import upgrade

    if args.quick:
        args.n, args.concurrency = min(args.n, 200), min(args.concurrency, 8)
    url = _fresh_database()
    # a queue of the cpu target (sweeps refuse other names), at most 16 characters (jobs.target)
    queue = "cpu-" + uuid.uuid4().hex[:12]
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"{queue}.log"
    try:
        upgrade(url)
        report = run_load(url, args.broker_url, queue, args.n, args.concurrency, log, args.seed, args.workers,
                          client=args.client)
    finally:
        _drop_database(url)
        _drop_redis_keys(args.broker_url, queue)
    if not report.problems() and not os.environ.get("BENCH_KEEP_LOG"):
        log.unlink(missing_ok=True)
    else:
        print(f"server log: {log}")
    print(f"webhook load test: {args.n} deliveries, concurrency {args.concurrency}, {args.client} client, loopback uvicorn, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end")
    print(report.table())
    return 0 if not report.problems() else 1


if __name__ == "__main__":
    sys.exit(main())
