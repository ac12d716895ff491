"""The registry of finding kinds: the one list of them, in the order they are judged and a cell's state is
picked.  Adding a kind is its module plus one line in :data:`_KINDS`.  A name that is not registered raises
:class:`UnknownKind` naming the kinds there are (no silent default)."""

from __future__ import annotations

from service.regressions.kinds import (
    accuracy,
    convergence,
    conversion,
    conversion_time,
    coverage,
    drift,
    latency,
    pass_convergence,
)
from service.regressions.kinds.base import FindingKind

_PAIRWISE: tuple[FindingKind, ...] = (conversion.KIND, accuracy.KIND, convergence.KIND, coverage.KIND, latency.KIND,
                                      conversion_time.KIND, pass_convergence.KIND)
#: drift is judged by the kinds before it (those with drift metrics), so it is built from them
_KINDS: tuple[FindingKind, ...] = (*_PAIRWISE, drift.over(_PAIRWISE))
_BY_NAME = {k.name: k for k in _KINDS}
if len(_BY_NAME) != len(_KINDS):
    raise RuntimeError("two finding kinds share a name")


class UnknownKind(KeyError):
    """A finding kind that is not registered (a KeyError: the kind is a key of the registry)."""

    def __init__(self, name: object) -> None:
        super().__init__(name)
        self.name = name

    def __str__(self) -> str:
        return f"unknown finding kind {self.name!r}; the kinds are: {', '.join(_BY_NAME)}"


def kind(name: str) -> FindingKind:
    """The registered kind called ``name``; :class:`UnknownKind` for any other name."""
    try:
        return _BY_NAME[name]
    except (KeyError, TypeError):
        raise UnknownKind(name) from None


def all_kinds() -> tuple[FindingKind, ...]:
    """Every registered kind, in registry order."""
    return _KINDS


def names() -> tuple[str, ...]:
    """The names of :func:`all_kinds`, in registry order."""
    return tuple(_BY_NAME)
