"""What the database's own exceptions mean, for the floors above that must not import its driver layer.

Layers above ``service.db`` decide "retry later" vs "refuse the input" from these, never from
SQLAlchemy's exception classes:

* :data:`DATABASE_DOWN` / :func:`is_database_down` — the database cannot be reached or answered in
  time (connection refused or lost, pool exhausted, :class:`~service.errors.DatabaseUnavailableError`):
  it heals, so retry; HTTP 503;
* :data:`VALUE_REFUSED` — the database refused a value of the request (out-of-range number, NUL
  byte): the client's input; HTTP 400.
"""

from __future__ import annotations

from sqlalchemy.exc import DataError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from service.errors import DatabaseUnavailableError

#: Exception types meaning the database is unreachable or overloaded (not an error of the request).
DATABASE_DOWN: tuple[type[Exception], ...] = (OperationalError, InterfaceError, PoolTimeoutError)
#: Exception types meaning the database refused a value it was given.
VALUE_REFUSED: tuple[type[Exception], ...] = (DataError,)


def is_database_down(exc: BaseException) -> bool:
    """True when ``exc`` says the database cannot be reached or did not answer in time (it heals; retry)."""
    return isinstance(exc, (*DATABASE_DOWN, DatabaseUnavailableError))


def driver_message(exc: BaseException) -> str:
    """The database driver's own message of a database error (``exc.orig``), else ``str(exc)``."""
    return str(getattr(exc, "orig", exc))
