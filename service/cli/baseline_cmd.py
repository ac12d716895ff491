"""``ampci baseline``: pin the older reference that drift detection judges runs against.

    ampci baseline pin REV [--branch B] [--note TEXT] [--json]
    ampci baseline unpin [--branch B] [--json]
    ampci baseline show [--json]

Every run is judged against its parent and against an older reference: a lookback window of the cell's
history and the pinned baseline (:mod:`service.regressions.drift`).  ``--branch`` omitted: the pin of every
branch without its own.  REV is a branch, tag or (short) sha with results (else a one-line error, exit 2).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from service.cli.argtypes import revision_arg, text_arg
from service.cli.query_cmd import emit, open_store
from service.errors import UserError

if TYPE_CHECKING:
    from service.cli.main import Subcommands


def cmd_pin(args: argparse.Namespace) -> int:
    """Pin REV for ``--branch`` (replacing its pin)."""
    from service.cli.revision_lookup import resolve_with_results
    from service.db import pins

    store = open_store()
    sha = resolve_with_results(store, args.rev)
    with store.transaction() as conn:
        got = pins.pin(conn, branch=(args.branch or ''), sha=sha, now=store.clock(), note=args.note)
    emit(args, got.to_dict(), f"baseline of {_scope(got.branch)} pinned at {sha[:12]}")
    return 0


def cmd_unpin(args: argparse.Namespace) -> int:
    """Remove the pin of ``--branch`` (a one-line error, exit 2, when there is none)."""
    from service.db import pins

    store = open_store()
    with store.transaction() as conn:
        removed = pins.unpin(conn, branch=(args.branch or ''))
    if not removed:
        raise UserError(f"no baseline is pinned for {_scope(args.branch or '')}")
    emit(args, {"branch": (args.branch or ''), "unpinned": True}, f"baseline of {_scope(args.branch or '')} unpinned")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    """List the pins."""
    from service.db import pins

    store = open_store()
    with store.transaction() as conn:
        got = pins.pins(conn)
    lines = [f"{_scope(p.branch)}: {p.sha[:12]} pinned {p.pinned_at:%Y-%m-%d %H:%M}" + (f" ({p.note})" if p.note
                                                                                        else "") for p in got]
    emit(args, [p.to_dict() for p in got], "\n".join(lines) if lines else "no baseline pinned")
    return 0


def _scope(branch: str) -> str:
    return f"branch {branch}" if branch else "every branch"


def register(subparsers: Subcommands) -> None:
    """Add ``baseline pin|unpin|show``."""
    p = subparsers.add_parser("baseline", help="pin the older reference drift is judged against")
    sub = p.add_subparsers(dest="baseline_cmd", required=True)
    pin = sub.add_parser("pin", help="pin REV as the drift baseline")
    pin.add_argument("rev", type=revision_arg, metavar="REV", help="the revision to pin: a sha, a unique prefix, a branch or a tag")
    pin.add_argument("--note", type=text_arg("--note", 2000), help="why it is pinned (shown by baseline show)")
    unpin = sub.add_parser("unpin", help="remove the pinned baseline")
    show = sub.add_parser("show", help="the pinned baselines")
    for q, func in ((pin, cmd_pin), (unpin, cmd_unpin), (show, cmd_show)):
        if q is not show:
            q.add_argument("--branch", default=None, type=text_arg("--branch", 200),
                           help="the branch the pin applies to (default: every branch)")
        q.add_argument("--json", action="store_true", help="print JSON")
        q.set_defaults(func=func, startup_in_command=True)
