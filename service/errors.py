"""Error taxonomy of the service layer: user errors (exit 2 / HTTP 4xx) vs our bugs."""

from __future__ import annotations


class ServiceError(Exception):
    """Base class of errors raised on purpose by the service layer."""


class UserError(ServiceError):
    """Bad input from a user (CLI argument, config file, request): shown as one line, exit code 2."""

    exit_code = 2


class NotFoundError(UserError):
    """A revision, model, run or id that does not exist."""


class ConfigError(UserError):
    """A missing or malformed configuration value; the message names the variable."""


class DatabaseUnavailableError(ServiceError):
    """The database cannot be reached; the message names the URL without its password."""

    exit_code = 3
