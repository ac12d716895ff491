"""Finding kinds: one module per kind (``conversion``, ``accuracy``, …), each defining a
:class:`~service.regressions.kinds.base.FindingKind`, and :mod:`~service.regressions.kinds.registry`, the one
list of them.  Import the registry (``from service.regressions.kinds.registry import kind, all_kinds``)."""

from __future__ import annotations
