"""``ampci serve [--host H] [--port P]``: the webhook and HTTP API under uvicorn."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from service.cli.argtypes import bounded_int

if TYPE_CHECKING:
    from service.cli.main import Subcommands


def _run(args: argparse.Namespace) -> int:
    import uvicorn

    from service.api.app import create_app
    from service.cli.sandbox_check import check_canary, check_sandbox, require_sandbox_by_default
    from service.db import Store
    from service.github.webhook import check_webhook_config
    from service.settings import Settings

    require_sandbox_by_default()
    settings = Settings.from_env()
    check_webhook_config(settings)  # refuse to start without a secret (ConfigError, exit 2)
    if settings.embedded:
        check_sandbox(settings)  # jobs run in this process's pool: refuse without the sandbox (ConfigError)
        check_canary(settings)  # ... or where it cannot convert (SandboxCanaryFailed); /healthz shows the result
    from service.db.engine import make_engine

    store = Store(make_engine(settings.effective_database_url, **settings.db_pool()))  # bounded connections
    if not args.no_migrate:
        store.upgrade()  # idempotent; serialised across processes on PostgreSQL
    from service.api.server import configure, uvicorn_limits

    configure(settings)  # header deadline and per-client cap of this process's connections
    common = dict(host=args.host, port=args.port, log_level=settings.log_level.lower(),
                  access_log=args.access_log, timeout_graceful_shutdown=10, **uvicorn_limits(settings))
    if args.workers > 1:  # each worker process builds its own app from the same environment
        store.dispose()
        uvicorn.run("service.api.app:app_from_env", factory=True, workers=args.workers, **common)
    else:
        uvicorn.run(create_app(settings, store=store), **common)
    return 0


def register(subparsers: Subcommands) -> None:
    """Add the ``serve`` command."""
    parser = subparsers.add_parser("serve", help="run the GitHub webhook and JSON API (uvicorn)")
    from service.cli.argtypes import text_arg

    parser.add_argument("--host", type=text_arg("host", 253), default="127.0.0.1",
                        help="interface to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=bounded_int(0, 65535), default=8000, help="TCP port (default 8000)")
    parser.add_argument("--no-migrate", action="store_true",
                        help="do not upgrade the database schema to head before serving")
    parser.add_argument("--workers", type=bounded_int(1, 64), default=1, help="uvicorn worker processes (default 1)")
    parser.add_argument("--access-log", action="store_true", help="log every request")
    parser.set_defaults(func=_run, serves=True)  # runs until stopped (the hostile-argument test only parses it)
