"""``ampci db upgrade|downgrade|current``: manage the schema of the configured database.

    ampci db upgrade [--revision head]     # an empty database is brought to head
    ampci db downgrade [--revision -1] --yes   # ``base`` removes every table
    ampci db current [--json]

The database is ``AMPCI_DATABASE_URL`` or the embedded SQLite file under the data dir.  A downgrade
drops tables and the results in them, so it needs ``--yes``, or a typed ``yes`` at the prompt when
stdin is a terminal; otherwise it is a one-line error (exit 2) and nothing changes.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from service.errors import UserError

if TYPE_CHECKING:
    from service.cli.main import Subcommands


def register(subparsers: Subcommands) -> None:
    """Add ``ampci db``."""
    p = subparsers.add_parser("db", help="database schema: upgrade, downgrade, current",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="db_command", metavar="ACTION")
    sub.required = True
    from service.cli.argtypes import migration_arg

    up = sub.add_parser("upgrade", help="upgrade the schema (default: to head)")
    up.add_argument("--revision", type=migration_arg, default="head",
                    help="the migration to upgrade to (default: head, the newest)")
    down = sub.add_parser("downgrade", help="downgrade the schema (default: one step)")
    down.add_argument("--revision", type=migration_arg, default="-1",
                      help="the migration to go back to: a revision, -N steps or base (default: -1)")
    down.add_argument("--yes", "-y", action="store_true", help="do not ask: dropping tables deletes their data")
    cur = sub.add_parser("current", help="show the schema revision")
    for q in (up, down, cur):
        q.add_argument("--json", action="store_true", help="print JSON instead of text")
        q.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the action; print where the database ends up."""
    from service.cli.query_cmd import emit
    from service.db import migrate
    from service.settings import Settings, redact_url

    url = Settings.from_env().effective_database_url
    try:
        if args.db_command == "upgrade":
            at = migrate.upgrade(url, args.revision)
        elif args.db_command == "downgrade":
            confirm_downgrade(redact_url(url), args.revision, args.yes)
            at = migrate.downgrade(url, args.revision)
        else:
            at = migrate.current(url)
    except Exception as exc:  # Alembic imported only here: `db current` on a current schema loads none
        from alembic.util import CommandError

        if not isinstance(exc, CommandError):
            raise
        # a revision Alembic cannot reach (unknown id, too many steps): bad input
        raise UserError(f"db {args.db_command}: {str(exc).splitlines()[0][:200]}") from None
    head = migrate.head()
    where = redact_url(url)
    state = "empty" if at is None else ("head" if at == head else f"behind head {head}")
    emit(args, {"url": where, "revision": at, "head": head},
         f"{where}: schema {at or '(none)'} ({state})")
    return 0


def confirm_downgrade(where: str, revision: str, yes: bool) -> None:
    """Return when the downgrade may go ahead: ``--yes`` was given, or stdin is a terminal and the user
    typed ``yes``.  Otherwise raise UserError (exit 2) before anything is touched."""
    if yes:
        return
    what = "every table and all stored results" if revision == "base" else "the tables and columns it removes"
    if not sys.stdin.isatty():
        raise UserError(f"db downgrade to {revision} drops {what} in {where}; pass --yes to confirm")
    answer = input(f"Downgrade {where} to {revision}? This drops {what}. Type 'yes' to go on: ")
    if answer.strip().lower() != "yes":
        raise UserError("db downgrade: not confirmed; nothing changed")
