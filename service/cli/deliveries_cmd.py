"""``ampci deliveries``: the recorded webhook deliveries, newest first (``--json`` for machines).

    ampci deliveries [--status pending|accepted|rejected|failed|duplicate] [--limit N] [--json]

Shows why a delivery did not become a run: ``rejected`` (its content can never be one) and
``failed`` (the intake gave up after a bounded number of attempts) carry the reason.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from service.cli.argtypes import bounded_int
from service.cli.query_cmd import emit, open_store

if TYPE_CHECKING:
    from service.cli.fit import Column
    from service.cli.main import Subcommands


def cmd_deliveries(args: argparse.Namespace) -> int:
    """List deliveries (an unknown ``--status`` is a one-line error, exit 2)."""
    from service.cli.fit import fit_table
    from service.cli.query_cmd import console

    rows = open_store().list_deliveries(status=args.status, limit=args.limit)
    if args.json:
        emit(args, [d.to_dict() for d in rows])
        return 0
    out = console(args)
    columns: tuple[Column, ...] = (("delivery", "token"), ("event", "token"), ("status", "token"), ("run", "num"),
               ("received (UTC)", "token"), ("reason", "text"))
    table = fit_table("deliveries", (columns,), (
        {"delivery": d.delivery_id, "event": d.event, "status": d.status, "run": str(d.run_id or ""),
         "received (UTC)": d.received_at.strftime("%Y-%m-%d %H:%M:%S"), "reason": d.reason or ""}
        for d in rows), out.width)
    emit(args, [d.to_dict() for d in rows], table if rows else "no deliveries", out=out)
    return 0


def _delivery_states() -> tuple[str, ...]:
    from service.db.deliveries import DELIVERY_STATES

    return tuple(DELIVERY_STATES)


def register(subparsers: Subcommands) -> None:
    """Add ``deliveries``."""
    p = subparsers.add_parser("deliveries", help="recorded webhook deliveries (why one made no run)")
    from service.cli.argtypes import one_of

    p.add_argument("--status", type=one_of("delivery status", _delivery_states),
                   help="pending, accepted, rejected, failed or duplicate")
    p.add_argument("--limit", type=bounded_int(1, 100_000), default=100,
                   help="show at most N deliveries, newest first (default 100)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_deliveries, startup_in_command=True)  # open_store ends start-up
