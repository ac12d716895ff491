"""``ampci worker`` and ``ampci beat``: thin wrappers around the Celery worker and beat.

    ampci worker --queues cuda --concurrency 1     # one process per GPU
    ampci beat                                     # nightly sweeps (UTC crontab AMPCI_NIGHTLY_CRON)

Both need ``AMPCI_BROKER_URL``.  The worker uses the prefork pool; its parent process imports no
job code (no CUDA initialisation before fork).
"""

from __future__ import annotations

import argparse
import re
import socket
import sys
from typing import TYPE_CHECKING, Protocol

from service.errors import ServiceError, UserError

if TYPE_CHECKING:
    from service.cli.main import Subcommands
    from service.settings import Settings

_QUEUE = re.compile(r"^[A-Za-z0-9_-]+$")


def register(subparsers: Subcommands) -> None:
    """Add ``ampci worker`` and ``ampci beat``."""
    w = subparsers.add_parser("worker", help="run a Celery worker for one or more target queues")
    from service.cli.argtypes import bounded_int, log_level, path_arg, text_arg

    w.add_argument("--queues", "-Q", type=text_arg("queues", 1000), default="cpu",
                   help="comma-separated queues (cuda, cpu, control, ...)")
    w.add_argument("--concurrency", "-c", type=bounded_int(1, 256), default=1, help="worker processes (one per GPU)")
    w.add_argument("--name", "-n", type=text_arg("name", 200), default=None,
                   help="node name (default ampci-<queues>@<host>)")
    w.add_argument("--loglevel", "-l", type=log_level, default=None,
                   help="log level (default AMPCI_LOG_LEVEL)")
    w.add_argument("--max-tasks-per-child", type=bounded_int(1, 1_000_000), default=None,
                   help="replace a worker process after this many jobs (default: never)")
    w.set_defaults(func=run_worker, serves=True)  # runs until stopped
    b = subparsers.add_parser("beat", help="run Celery beat: schedules the nightly sweep")
    b.add_argument("--schedule-file", type=path_arg, default=None, help="beat state file (default under AMPCI_DATA_DIR)")
    b.add_argument("--loglevel", "-l", type=log_level, default=None, help="log level (default AMPCI_LOG_LEVEL)")
    b.set_defaults(func=run_beat, serves=True)


def worker_argv(queues: str, concurrency: int, name: str | None, loglevel: str,
                max_tasks_per_child: int | None = None) -> list[str]:
    """The ``celery worker`` argument list for these options (validated; UserError if bad)."""
    names = [q.strip() for q in queues.split(",") if q.strip()]
    if not names or not all(_QUEUE.match(q) for q in names):
        raise UserError(f"--queues: expected comma-separated queue names, got {queues!r}")
    if concurrency < 1:
        raise UserError("--concurrency must be >= 1")
    node = name or f"ampci-{'-'.join(names)}@{socket.gethostname()}"
    argv = ["worker", "--pool", "prefork", "-Q", ",".join(names), "-c", str(concurrency), "-n", node,
            "--loglevel", loglevel, "--without-gossip", "--without-mingle"]
    if max_tasks_per_child:
        argv += ["--max-tasks-per-child", str(max_tasks_per_child)]
    return argv


class BrokerUnavailableError(ServiceError):
    """The broker cannot be reached at start-up; the message names the URL without its password."""

    exit_code = 3


def check_broker(url: str, timeout: float = 5.0) -> None:
    """PING the Redis broker once; raise BrokerUnavailableError (one line) when it does not answer.

    Celery itself would retry forever with a multi-line message per attempt; a worker or beat that
    cannot reach its broker at start says so in one line and exits 3 (compose restarts it)."""
    import redis

    from service.settings import redact_url

    try:
        redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout).ping()
    except Exception as exc:  # noqa: BLE001 - any failure is "unreachable", reported in one line
        detail = " ".join(str(exc).split()) or type(exc).__name__
        raise BrokerUnavailableError(f"broker unavailable at {redact_url(url)}: {detail}") from None


def queues_without_producer(names: list[str], settings: Settings) -> list[str]:
    """The queues in ``names`` no ampci producer sends to: not a built-in target (cuda, cpu), not
    ``control`` and not in ``AMPCI_EXTRA_QUEUES``.  A worker on only such queues stays idle forever."""
    from service.orchestration.celery_app import CONTROL_QUEUE, DEFAULT_QUEUES, extra_queues

    known = {*DEFAULT_QUEUES, *extra_queues(settings), CONTROL_QUEUE}
    return [q for q in names if q not in known]


#: Asks a fresh interpreter whether this machine has a usable CUDA device (exit 0: yes), so that the worker's
#: prefork parent initialises no CUDA (:func:`workers.measure.sessions.cuda_usable`).
CUDA_PROBE = "from workers.measure.sessions import cuda_usable; raise SystemExit(0 if cuda_usable() else 1)"


def cuda_device_here() -> bool:
    """True when this machine has a usable CUDA device (probed in a child interpreter)."""
    import subprocess

    try:
        return subprocess.run([sys.executable, "-c", CUDA_PROBE], capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def refuse_device_queues_without_device(names: list[str], has_cuda: bool | None = None) -> None:
    """UserError (one line) when ``names`` hold a ``cuda`` queue (``cuda``, ``cuda-a100``, …) and this machine has
    no usable CUDA device: a worker without CUDA never consumes a cuda queue, so a cuda cell is never measured
    as a ``pass`` it did not run (``has_cuda``: the probe's answer, asked when None)."""
    cuda = [q for q in names if q.partition("-")[0] == "cuda"]
    if cuda and not (cuda_device_here() if has_cuda is None else has_cuda):
        raise UserError(f"queue {', '.join(repr(q) for q in cuda)} needs a usable CUDA device and this machine has "
                        "none: a worker without CUDA never takes cuda cells (drop it from --queues)")


class CeleryProgram(Protocol):
    """What ``worker`` and ``beat`` use of the Celery app (:data:`service.orchestration.celery_app.app`):
    its command-line programs, run in this process until stopped."""

    def worker_main(self, argv: list[str]) -> None:
        """Run ``celery worker`` with ``argv``."""

    def start(self, argv: list[str]) -> None:
        """Run the celery program ``argv`` names (``beat``)."""


def _app() -> tuple[Settings, CeleryProgram]:
    from service.settings import Settings

    settings = Settings.from_env()
    settings.require("broker_url")
    if settings.broker_url.startswith(("redis://", "rediss://", "unix://")):
        check_broker(settings.broker_url)
    from service.orchestration.celery_app import app  # built from the same environment

    return settings, app


def run_worker(args: argparse.Namespace) -> int:
    """Run the worker in this process until it is stopped (refused where the pass sandbox its
    ``AMPCI_SANDBOX`` asks for cannot be made, or where its canary conversion fails:
    :mod:`service.cli.sandbox_check`; and where a cuda queue is asked for on a machine without a usable CUDA
    device: :func:`refuse_device_queues_without_device`)."""
    from service.cli.sandbox_check import check_canary, check_sandbox, require_sandbox_by_default

    require_sandbox_by_default()
    refuse_device_queues_without_device([q.strip() for q in args.queues.split(",") if q.strip()])
    settings, app = _app()
    check_sandbox(settings)
    check_canary(settings)  # a sandbox that cannot convert would fail every job: refuse (one line)
    argv = worker_argv(args.queues, args.concurrency, args.name, args.loglevel or settings.log_level,
                       args.max_tasks_per_child)
    orphans = queues_without_producer(argv[argv.index("-Q") + 1].split(","), settings)
    if orphans:
        print(f"ampci: warning: queue {', '.join(repr(q) for q in orphans)} has no producer (jobs go to "
              f"cuda, cpu, control and AMPCI_EXTRA_QUEUES={settings.extra_queues!r}); nothing will "
              "arrive there", file=sys.stderr, flush=True)
    app.worker_main(argv)
    return 0


def run_beat(args: argparse.Namespace) -> int:
    """Run beat in this process until it is stopped."""
    settings, app = _app()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    schedule = str(args.schedule_file or settings.data_dir / "celerybeat-schedule")
    app.start(["beat", "--loglevel", args.loglevel or settings.log_level, "--schedule", schedule])
    return 0
